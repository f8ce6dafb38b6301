"""fusedkit.fp8.update_scales: one delayed-scaling step for many tensors equals the reference
(update_amax_history + delayed_scale) bit for bit, including amax 0, inf, NaN and tiny amax; on JAX
arrays (new arrays back, eager and under jax.jit) likewise, but for a subnormal scale_inv that XLA
flushes to zero."""
import numpy as np
import pytest

from fusedkit import fp8
from _backends import backend_params, to_backend, to_numpy
from test_fp8_quantize import rng_for

F32 = np.float32


def _state(rng, L, n):
    h = (np.abs(rng.standard_normal((L, n))) * 10).astype(F32)
    if n >= 6:
        h[:, 0] = 0                      # amax 0: previous scale kept
        h[1 % L, 1] = np.inf             # inf: previous scale kept
        h[L - 1, 2] = np.nan             # NaN: previous scale kept (for "max")
        h[:, 3] = F32(1e-45)             # tiny: fp32 max
        h[0, 4] = F32(448.0 * 4)
    scale = (rng.random(n) + 0.5).astype(F32)
    return h, scale


def _step(h, scale, L, algo, margin, fmax):
    """The recipe and the reference's step: (recipe, new history, new scale)."""
    recipe = fp8.DelayedScaling(margin=margin, amax_history_len=L, amax_compute_algo=algo)
    want_h, amax = fp8.update_amax_history(h, algo)
    return recipe, want_h, fp8.delayed_scale(amax, scale, fmax, margin)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("L", [1, 2, 16, 1024])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_update_scales_matches_reference(backend, L, algo, margin):
    if backend == "torch":
        pytest.importorskip("torch")
    rng = rng_for("upd", backend, L, algo, margin)
    n = 300
    h, scale = _state(rng, L, n)
    recipe, want_h, want_s = _step(h, scale, L, algo, margin, 448.0)
    H, S, SI = (to_backend(a.copy(), backend) for a in (h, scale, np.zeros(n, F32)))
    fp8.update_scales(H, S, SI, recipe=recipe, fmt="e4m3")
    np.testing.assert_array_equal(to_numpy(H).view(np.uint32), want_h.view(np.uint32))
    np.testing.assert_array_equal(to_numpy(S).view(np.uint32), want_s.view(np.uint32))
    np.testing.assert_array_equal(to_numpy(SI).view(np.uint32), (F32(1) / want_s).view(np.uint32))


def test_update_scales_bad_input():
    h = np.zeros((4, 3), F32)
    with pytest.raises(ValueError, match="shape"):
        fp8.update_scales(h, np.zeros(2, F32))
    with pytest.raises(ValueError, match="2-D"):
        fp8.update_scales(np.zeros(4, F32), np.zeros(4, F32))
    with pytest.raises(TypeError, match="DelayedScaling"):
        fp8.update_scales(h, np.zeros(3, F32), recipe=fp8.CurrentScaling())


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("L", [1, 2, 16])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_update_scales_jax(jit, L, algo, margin):
    """JAX arrays: the updated state comes back as new arrays, bit for bit the reference's, eagerly and
    under jax.jit (on whatever device JAX runs); the inputs are left as they were."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    rng = rng_for("updjax", jit, L, algo, margin)
    n = 40
    h, scale = _state(rng, L, n)
    recipe, want_h, want_s = _step(h, scale, L, algo, margin, 57344.0)
    H, S, SI = jnp.asarray(h), jnp.asarray(scale), jnp.zeros(n, jnp.float32)

    def step(H, S, SI):
        return fp8.update_scales(H, S, SI, recipe=recipe, fmt="e5m2")
    got_h, got_s, got_si = (jax.jit(step) if jit else step)(H, S, SI)
    np.testing.assert_array_equal(np.asarray(got_h).view(np.uint32), want_h.view(np.uint32))
    np.testing.assert_array_equal(np.asarray(got_s).view(np.uint32), want_s.view(np.uint32))
    # XLA may flush subnormals (it does on the CPU): a scale_inv below fp32's smallest normal (the
    # tiny-amax column's 1 / fp32 max) may come back 0 (fusedkit.jax._fp8.update_scales documents it)
    want_si = F32(1) / want_s
    got_si = np.asarray(got_si)
    flushed = (np.abs(want_si) < np.finfo(F32).tiny) & (got_si == 0)
    np.testing.assert_array_equal(np.where(flushed, F32(0), got_si).view(np.uint32),
                                  np.where(flushed, F32(0), want_si).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(H).view(np.uint32), h.view(np.uint32))  # untouched
    _, s2, si2 = fp8.update_scales(H, S, recipe=recipe, fmt="e5m2")  # without scale_inv
    assert si2 is None
    np.testing.assert_array_equal(np.asarray(s2).view(np.uint32), want_s.view(np.uint32))
