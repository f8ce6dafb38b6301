"""``amax_out`` / ``fp8_amax_out``: a per-tensor FP8 cast merges the amax of its input into the caller's
1-element float32 array (Transformer Engine's amax-history slot) instead of a new one. Every backend:
the bytes equal those of the default call, the merge is max on the fp32 bit patterns (so a larger value
already there stays), two casts accumulate, ``.amax`` is the caller's array, and the delayed-scaling
loop with fusedkit.fp8.update_scales needs no zeroing of its own."""
import importlib.util
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy

F32 = np.float32
BACKENDS = backend_params(["numpy", "torch_cpu", "cupy", "torch"])


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def first(a):
    return F32(np.asarray(to_numpy(a)).reshape(-1)[0])


def bits(v):
    return int(np.asarray(v, F32).view(np.uint32))


def inputs(rng, shape, dtype):
    x = rand(rng, shape, dtype, loc=-2.3, scale=3.0)
    w = rand(rng, shape[-1:], dtype, loc=1.0, scale=0.3)
    b = rand(rng, shape[-1:], dtype, scale=0.3)
    dy = rand(rng, shape, dtype)
    return x, w, b, dy


# op name -> call(arrays in the backend, scale, amax_out) -> FP8Tensor
OPS = {
    "quantize": lambda a, s, o: fk.quantize(a["x"], fmt="e4m3", scale=s, amax_out=o),
    "cast_transpose": lambda a, s, o: fk.cast_transpose(a["x"], fmt="e4m3", scale=s, amax_out=o),
    "cast_transpose_dbias": lambda a, s, o: fk.cast_transpose_dbias(a["dy"], fmt="e5m2", scale=s, amax_out=o)[0],
    "dact_cast_transpose": lambda a, s, o: fk.dact_cast_transpose(a["dy"], a["x"], activation="gelu", fmt="e5m2",
                                                                  scale=s, amax_out=o),
    "dact_cast_transpose_dbias": lambda a, s, o: fk.dact_cast_transpose(a["dy"], a["x"], activation="silu",
                                                                        fmt="e5m2", scale=s, dbias=True,
                                                                        amax_out=o)[0],
    "dswiglu_cast_transpose": lambda a, s, o: fk.dact_cast_transpose(a["dy_half"], a["x_even"], activation="swiglu",
                                                                     fmt="e5m2", scale=s, amax_out=o),
    "layer_norm_fp8": lambda a, s, o: fk.layer_norm(a["x"], a["w"], a["b"], fp8_fmt="e4m3", fp8_scale=s,
                                                    fp8_amax_out=o),
    "rms_norm_fp8": lambda a, s, o: fk.rms_norm(a["x"], a["w"], fp8_fmt="e4m3", fp8_scale=s, fp8_amax_out=o),
    "gelu_fp8": lambda a, s, o: fk.gelu(a["x"], fp8_fmt="e4m3", fp8_scale=s, fp8_amax_out=o),
    "swiglu_fp8": lambda a, s, o: fk.swiglu(a["x_even"], fp8_fmt="e4m3", fp8_scale=s, fp8_amax_out=o),
}


def _backend_arrays(backend, shape, dtype, key):
    x, w, b, dy = inputs(rng_for(key), shape, dtype)
    x_even = np.ascontiguousarray(x[..., : shape[-1] // 2 * 2])  # the gated activations halve the last dim
    dy_half = np.ascontiguousarray(dy[..., : shape[-1] // 2])     # their gradient
    return {k: to_backend(v, backend) for k, v in dict(x=x, w=w, b=b, dy=dy, x_even=x_even, dy_half=dy_half).items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("start", ["zero", "below", "above"])
def test_merges_into_the_callers_array(backend, op, start):
    dtype = "float32" if backend == "cupy" else "bfloat16"
    skip_unsupported(backend, dtype)
    a = _backend_arrays(backend, (37, 781), dtype, ("amax_out", backend, op))
    scale = 0.37
    plain = OPS[op](a, scale, None)
    amax = first(plain.amax)
    assert amax > 0
    v0 = {"zero": F32(0), "below": F32(amax * F32(0.5)), "above": F32(amax * F32(3))}[start]
    out = to_backend(np.array([v0], F32), backend)
    t = OPS[op](a, scale, out)
    assert t.amax is out, "the FP8Tensor's amax is the caller's array"
    assert bits(first(out)) == max(bits(v0), bits(amax)), (first(out), v0, amax)
    np.testing.assert_array_equal(to_numpy(t.data), to_numpy(plain.data))
    if plain.data_t is not None:
        np.testing.assert_array_equal(to_numpy(t.data_t), to_numpy(plain.data_t))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["quantize", "cast_transpose", "layer_norm_fp8", "gelu_fp8"])
def test_empty_input_leaves_amax_out(backend, op):
    """No rows: the amax of nothing (0) merged leaves the caller's value as it was."""
    dtype = "float32"
    skip_unsupported(backend, dtype)
    a = _backend_arrays(backend, (0, 64), dtype, ("empty", backend, op))
    out = to_backend(np.array([1.5], F32), backend)
    t = OPS[op](a, 0.37, out)
    assert t.amax is out and first(out) == F32(1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_microbatches_accumulate_and_update_scales_zeroes_the_slot(backend):
    """The delayed-scaling loop of Transformer Engine: casts merge into row 0 of the amax history (two
    micro-batches of tensor 1, one of tensor 0); update_scales takes the max, rolls (row 0 to the end)
    and zeroes row 0."""
    dtype = "float32" if backend == "cupy" else "bfloat16"
    skip_unsupported(backend, dtype)
    rng = rng_for("loop", backend)
    xs = [to_backend(rand(rng, (64, 256), dtype, scale=s), backend) for s in (1.0, 5.0, 2.0)]
    history = to_backend(np.zeros((4, 2), F32), backend)
    scale = to_backend(np.full(2, 8.0, F32), backend)
    want = [first(fk.quantize(x, scale=1.0).amax) for x in xs]
    fk.quantize(xs[0], scale=1.0, amax_out=history[0, 0:1])
    fk.quantize(xs[1], scale=1.0, amax_out=history[0, 1:2])
    fk.quantize(xs[2], scale=1.0, amax_out=history[0, 1:2])
    h = np.asarray(to_numpy(history))
    assert h[0, 0] == want[0] and h[0, 1] == max(want[1], want[2])
    fp8.update_scales(history, scale, recipe=fp8.DelayedScaling(margin=0))
    h, s = np.asarray(to_numpy(history)), np.asarray(to_numpy(scale))
    assert (h[0] == 0).all(), "row 0 is zeroed for the next step: the casts need no zeroing of their own"
    assert h[-1, 0] == want[0] and h[-1, 1] == max(want[1], want[2])  # rolled by -1: row 0 went last
    np.testing.assert_array_equal(s, fp8.delayed_scale(h[-1], np.full(2, 8.0, F32), fp8.E4M3.max, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_amax_out(backend):
    dtype = "float32"
    skip_unsupported(backend, dtype)
    a = _backend_arrays(backend, (4, 64), dtype, ("bad", backend))
    ok = to_backend(np.zeros(1, F32), backend)
    with pytest.raises(ValueError, match="delayed scaling"):
        fk.quantize(a["x"], amax_out=ok)  # current scaling
    with pytest.raises(ValueError, match="delayed scaling"):
        fk.cast_transpose_dbias(a["dy"], amax_out=ok)
    fk.layer_norm(a["x"])  # a plain call first: the host fast path (_callcache) must not take the next one
    with pytest.raises(ValueError, match="fp8_amax_out .* with fp8_fmt"):
        fk.layer_norm(a["x"], fp8_amax_out=ok)
    with pytest.raises(ValueError, match="fp8_amax_out .* with fp8_fmt"):
        fk.rms_norm(a["x"], fp8_amax_out=ok)
    with pytest.raises(ValueError, match="fp8_amax_out goes with them"):
        fk.silu(a["x"], fp8_amax_out=ok)
    for bad in (np.zeros(2, F32), np.zeros(1, np.float64)):
        with pytest.raises(ValueError, match="1-element float32"):
            fk.quantize(a["x"], scale=1.0, amax_out=to_backend(bad, backend))
        with pytest.raises(ValueError, match="1-element float32"):
            fk.rms_norm(a["x"], fp8_fmt="e4m3", fp8_scale=1.0, fp8_amax_out=to_backend(bad, backend))
    other = "numpy" if backend != "numpy" else ("torch_cpu" if importlib.util.find_spec("torch") else None)
    if other is not None:  # another framework's array (NumPy for the device backends and CPU torch)
        with pytest.raises(TypeError, match="framework"):
            fk.quantize(a["x"], scale=1.0, amax_out=to_backend(np.zeros(1, F32), other))


def test_jax_amax_out_is_refused():
    jnp = pytest.importorskip("jax.numpy")
    x = rand(rng_for("jax"), (4, 64), "float32")
    with pytest.raises(TypeError, match="immutable"):
        fk.quantize(x, scale=1.0, amax_out=jnp.zeros(1, jnp.float32))
