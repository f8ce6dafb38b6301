"""The CPU backend's fused fp32 softmax / cross-entropy rows (fusedkit/reference/_softmax_numba.py) against
the NumPy path they replace (USE_NUMBA = False): fresh random rows with NaN, +-inf and fully masked
(-inf) rows, odd shapes, leading dims, scale, label smoothing, z-loss, ignored tokens, in-place
gradients of contiguous and strided logits. Equal up to one fp32 ulp (the row sums' order and the
reused exponentials; docs in the module)."""
import importlib
import zlib

import numpy as np
import pytest

import fusedkit as fk

ref_softmax = importlib.import_module("fusedkit.reference.softmax")
ref_ce = importlib.import_module("fusedkit.reference.cross_entropy")
F32 = np.float32


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def with_specials(rng, shape, scale=3.0):
    x = (rng.standard_normal(shape) * scale).astype(F32)
    if x.ndim and x.shape[-1] >= 4 and x.size // x.shape[-1] >= 4:
        rows = x.reshape(-1, x.shape[-1])
        rows[0, 1] = np.nan
        rows[1, 2] = np.inf
        rows[2, :] = -np.inf
        rows[3, 0] = -np.inf
    return x


def both(module, fn, *args, **kw):
    """fn's result with the Numba rows and with the NumPy path."""
    out = []
    for use in (True, False):
        module.USE_NUMBA = use
        try:
            out.append(fn(*args, **kw))
        finally:
            module.USE_NUMBA = True
    return out


def assert_ulp(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1.2e-7, atol=1e-30, err_msg=what)


SHAPES = [(0, 16), (1, 1), (7,), (5, 781), (2, 3, 4096), (64, 33)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_softmax_rows_match_numpy(shape, log, scale):
    x = with_specials(rng_for("sm", shape, log, scale), shape)
    fn = ref_softmax.log_softmax if log else ref_softmax.softmax
    got, want = both(ref_softmax, fn, x, scale=scale)
    assert_ulp(got, want, f"{'log_' if log else ''}softmax {shape}")
    dy = rng_for("dy", shape).standard_normal(shape).astype(F32)
    y = np.nan_to_num(want, nan=0.0, neginf=-30.0)
    bwd = ref_softmax.log_softmax_backward if log else ref_softmax.softmax_backward
    got, want = both(ref_softmax, bwd, dy, y, scale=scale)
    assert_ulp(got, want, f"backward {shape}")


def test_softmax_other_paths_stay_on_numpy():
    """Masks, causal, another axis and other dtypes keep the NumPy path (same results as before)."""
    x = rng_for("other").standard_normal((4, 8, 8)).astype(F32)
    mask = rng_for("mask").random((4, 1, 8)) < 0.3
    for kw in (dict(mask=mask), dict(causal=True), dict(axis=1)):
        got, want = both(ref_softmax, ref_softmax.softmax, x, **kw)
        np.testing.assert_array_equal(got, want)
    got, want = both(ref_softmax, ref_softmax.softmax, x.astype(np.float16))
    np.testing.assert_array_equal(got, want)


CE_OPTIONS = [dict(), dict(label_smoothing=0.1), dict(z_loss=1e-3, reduction="sum"),
              dict(reduction="none", label_smoothing=0.2, z_loss=1e-4), dict(ignore_index=3)]


@pytest.mark.parametrize("shape", [(0, 50), (1, 1), (9, 781), (2, 5, 4099)], ids=str)
@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_cross_entropy_rows_match_numpy(shape, opts):
    rng = rng_for("ce", shape, repr(opts))
    x = with_specials(rng, shape)
    t = rng.integers(0, shape[-1], shape[:-1])
    if t.size > 4:
        t.reshape(-1)[4::5] = opts.get("ignore_index", -100)
    got, want = both(ref_ce, ref_ce.cross_entropy, x, t, return_lse=True, return_grad=True, **opts)
    for g, w, what in zip(got, want, ("loss", "lse", "grad")):
        assert_ulp(g, w, what)
    lse = want[1]
    gl = np.ones(t.shape, F32) * 2 if opts.get("reduction") == "none" else F32(2.0)
    got, want = both(ref_ce, ref_ce.cross_entropy_backward, gl, x, t, lse, **opts)
    assert_ulp(got, want, "backward grad")


@pytest.mark.parametrize("strided", [False, True])
def test_cross_entropy_inplace_grad(strided):
    """inplace_grad writes the gradient into the logits (a strided view included) and returns them."""
    rng = rng_for("inplace", strided)
    base = (rng.standard_normal((6, 2 * 300)) * 2).astype(F32)
    t = rng.integers(0, 300, 6)
    want = ref_ce.cross_entropy(base[:, ::2].copy(), t, return_grad=True)[1]
    x = base[:, ::2] if strided else base[:, ::2].copy()
    loss, g = ref_ce.cross_entropy(x, t, return_grad=True, inplace_grad=True)
    assert g is x
    assert_ulp(x, want, "in-place gradient")
    y = base[:, ::2].copy()
    lse = ref_ce.cross_entropy(y, t, return_lse=True)[1]  # fp32: the backward's gradient differs from
    _, want_b = both(ref_ce, ref_ce.cross_entropy_backward, F32(1.0), y.copy(), t, lse)  # the forward's
    g = ref_ce.cross_entropy_backward(F32(1.0), y, t, lse, inplace_grad=True)
    assert g is y
    assert_ulp(y, want_b, "in-place backward gradient")
    ro = base[:, ::2].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        ref_ce.cross_entropy(ro, t, return_grad=True, inplace_grad=True)


def test_public_api_takes_the_fused_rows():
    """fusedkit.softmax / cross_entropy on NumPy fp32 arrays go through the fused rows (fp64 check)."""
    rng = rng_for("api")
    x = (rng.standard_normal((33, 1000)) * 4).astype(F32)
    y = fk.softmax(x, scale=0.5)
    v = x.astype(np.float64) * 0.5
    e = np.exp(v - v.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-12)
    t = rng.integers(0, 1000, 33)
    loss = fk.cross_entropy(x, t)
    lse = np.log(np.exp(x.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(loss, (lse - x[np.arange(33), t]).mean(), rtol=1e-6)


def test_vectorized_exp_matches_numpy():
    """The rows' exponential (_exp_into: no libm call, so the loops vectorize) against np.exp: within
    2 float64 ulp on [-707, 709.78] (fresh random points plus both ends), 0 below -707 (np.exp is under
    1e-307 there), +inf above ln(max float64), exp(+-inf) and NaN as np.exp; scale and shift applied
    as x * scale - shift in float64."""
    num = importlib.import_module("fusedkit.reference._softmax_numba")
    rng = rng_for("exp")
    d = np.concatenate([rng.uniform(-707.0, 709.78, 200_000), rng.standard_normal(100_000) * 5,
                        [-707.0, 0.0, -0.0, 1e-300, -1e-300, 709.78, 709.7827128933839, 0.5 * np.log(2)]])
    e = np.empty(d.size)
    num._exp_into(d, 1.0, 0.0, e)
    want = np.exp(d)
    assert np.all(np.isfinite(e))
    np.testing.assert_allclose(e, want, rtol=4.5e-16, atol=0)
    specials = np.array([-708.0, -745.2, -1e4, -np.inf, 709.8, 1e4, np.inf, np.nan])
    e = np.empty(specials.size)
    num._exp_into(specials, 1.0, 0.0, e)
    np.testing.assert_array_equal(e, [0, 0, 0, 0, np.inf, np.inf, np.inf, np.nan])
    x = (rng.standard_normal(4096) * 30).astype(F32)  # fp32 input, scale, shift
    e = np.empty(x.size)
    num._exp_into(x, 0.125, -1.5, e)
    np.testing.assert_allclose(e, np.exp(np.float64(x) * 0.125 + 1.5), rtol=4.5e-16, atol=0)
