"""fusedkit.quantize on every backend: bytes, amax and scale_inv equal the CPU reference exactly
(NaN inputs: both NaN, whatever the NaN's sign bit). The GPU cases are the kernels' acceptance test."""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy

F32 = np.float32


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def awkward(rng, shape, dtype, fmax):
    """Random values spread over the format's range, plus beyond-max, +-inf, NaN, subnormals, zeros."""
    x = rand(rng, shape, "float32", scale=fmax / 4)
    flat = x.reshape(-1)
    if flat.size >= 8:
        flat[:8] = [fmax * 3, -fmax * 3, np.inf, -np.inf, np.nan, 2.0**-9, -(2.0**-10), 0.0]
    with np.errstate(over="ignore"):
        return x.astype(F32).astype(rand(rng, (1,), dtype).dtype)


def same_bytes(got, want, fmt):
    g, w = np.asarray(got, np.uint8), np.asarray(want, np.uint8)
    gn, wn = np.isnan(ref.fp8_to_float(g, fmt)), np.isnan(ref.fp8_to_float(w, fmt))
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(g[~gn], w[~wn])


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(0, 16), (7,), (3, 781), (1151, 1024)], ids=str)
def test_quantize_delayed_matches_reference(backend, dtype, fmt, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("qd", backend, dtype, fmt, shape)
    f = fp8.as_format(fmt)
    x = awkward(rng, shape, dtype, f.max)
    scale = F32(0.37)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, scale=float(scale))
    data, sinv, amax = ref.quantize_delayed(x, scale, fmt)
    same_bytes(to_numpy(t.data), data, fmt)
    assert F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == sinv
    assert F32(np.asarray(to_numpy(t.amax)).reshape(-1)[0]) == amax


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("scale_type", [np.float32, np.float64], ids=["np_float32", "np_float64"])
def test_numpy_scalar_scales(backend, scale_type):
    """A NumPy scalar scale (it has a shape and a dtype, but is no array) is the float it holds, in every
    function that takes a delayed scale: the same bytes as a Python float gives."""
    rng = rng_for("npscalar", backend, scale_type.__name__)
    x = to_backend(awkward(rng, (5, 256), "bfloat16", fp8.E4M3.max / 30), backend)
    scale = F32(rng.uniform(20.0, 40.0))
    calls = {"quantize": lambda s: fk.quantize(x, fmt="e4m3", scale=s),
             "cast_transpose": lambda s: fk.cast_transpose(x, fmt="e4m3", scale=s),
             "gelu": lambda s: fk.gelu(x, fp8_fmt="e4m3", fp8_scale=s),
             "rms_norm": lambda s: fk.rms_norm(x, fp8_fmt="e4m3", fp8_scale=s),
             "layer_norm": lambda s: fk.layer_norm(x, fp8_fmt="e4m3", fp8_scale=s)}
    for name, call in calls.items():
        got, want = call(scale_type(scale)), call(float(scale))
        np.testing.assert_array_equal(to_numpy(got.data), to_numpy(want.data), err_msg=name)
        assert F32(to_numpy(got.scale_inv)) == F32(to_numpy(want.scale_inv)), name


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_2_scales=True),
                                    fp8.CurrentScaling(amax_epsilon=1e3)], ids=["plain", "pow2", "eps"])
def test_quantize_current_matches_reference(backend, dtype, recipe):
    skip_unsupported(backend, dtype)
    rng = rng_for("qc", backend, dtype, repr(recipe))
    x = rand(rng, (257, 96), dtype, scale=3.0)
    t = fk.quantize(to_backend(x, backend), fmt="e4m3", recipe=recipe)
    data, sinv, amax, _ = ref.quantize_current(x, "e4m3", recipe.amax_epsilon, recipe.power_of_2_scales)
    same_bytes(to_numpy(t.data), data, "e4m3")
    assert F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == sinv
    assert F32(np.asarray(to_numpy(t.amax)).reshape(-1)[0]) == amax


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
def test_all_zero_tensor_current_scale_is_one(backend):
    skip_unsupported(backend, "float32")
    t = fk.quantize(to_backend(np.zeros((4, 64), F32), backend))
    assert np.all(to_numpy(t.data) == 0)
    assert F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == 1.0


def test_bad_recipe_and_format():
    x = np.ones((2, 8), F32)
    with pytest.raises(TypeError, match="CurrentScaling"):
        fk.quantize(x, recipe=fp8.DelayedScaling())
    with pytest.raises(ValueError, match="e4m3"):
        fk.quantize(x, fmt="int8")


def test_dequantize_host():
    x = rand(rng_for("dq"), (16, 32), "float32", scale=2.0)
    t = fk.quantize(x)
    back = fk.dequantize(t)
    assert back.dtype == np.float32
    assert np.linalg.norm(back - x) / np.linalg.norm(x) < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 3], ids=lambda o: f"offset{o}")
def test_misaligned_input_is_exact(offset):
    """A contiguous view starting off a 16-byte boundary takes narrower vectors, not a fault."""
    torch = pytest.importorskip("torch")
    rng = rng_for("qmis", offset)
    x = awkward(rng, (33 * 96 + offset,), "bfloat16", 448.0)
    X = to_backend(x, "torch")[offset:].view(33, 96)
    xs = x[offset:].reshape(33, 96)
    for t in (fk.quantize(X, fmt="e4m3", scale=0.37), fk.cast_transpose(X, fmt="e4m3", scale=0.37)):
        data, _, amax = ref.quantize_delayed(xs, F32(0.37), "e4m3")
        same_bytes(to_numpy(t.data), data, "e4m3")
        assert F32(np.asarray(to_numpy(t.amax)).reshape(-1)[0]) == amax
    t = fk.quantize(X, fmt="e4m3", recipe=fp8.MXFP8Scaling())
    np.testing.assert_array_equal(np.asarray(to_numpy(t.scale_inv), np.uint8), ref.quantize_mxfp8(xs, "e4m3")[1])


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("scaling", ["delayed", "current", "current_pow2"])
def test_repeat_calls_through_the_call_cache(backend, dtype, scaling):
    """The second and third calls of one signature take fusedkit/_callcache.py's plan (one zeroed buffer
    for amax, scale_inv and the current scale): each, on fresh data, equals the reference exactly, and
    the earlier results are not touched by the later calls."""
    skip_unsupported(backend, dtype)
    from fusedkit import _callcache
    rng = rng_for("qcache", backend, dtype, scaling)
    recipe = fp8.CurrentScaling(power_of_2_scales=scaling == "current_pow2")
    scale = to_backend(np.asarray([0.37], F32), backend) if scaling == "delayed" else None
    results = []
    for _ in range(3):
        x = awkward(rng, (129, 136), dtype, 448.0)
        kw = dict(scale=scale) if scale is not None else dict(recipe=recipe)
        t = fk.quantize(to_backend(x, backend), fmt="e4m3", **kw)
        want = (ref.quantize_delayed(x, F32(0.37), "e4m3") if scale is not None else
                ref.quantize_current(x, "e4m3", recipe.amax_epsilon, recipe.power_of_2_scales)[:3])
        results.append((t, want))
    assert len(_callcache._plans) > 0
    for t, (data, sinv, amax) in results:
        same_bytes(to_numpy(t.data), data, "e4m3")
        assert F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == sinv
        np.testing.assert_array_equal(np.asarray(to_numpy(t.amax), F32).reshape(-1)[0], F32(amax))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["quantize", "cast_transpose", "cast_transpose_odd", "dgelu_ct", "dgelu_ct_odd"])
def test_current_scaling_dependent_launches(case, monkeypatch):
    """Current scaling's cast launched as the programmatic dependent of its amax pass (FUSEDKIT_PDL, on
    by default: the cast issues its first loads, then waits for the amax) gives the bytes of plain
    launches, on calls whose amax differ (a scale read before the amax pass finished would show); the
    quantize calls after the first take the call cache's plan. "_odd": N % 8 != 0, the 64 x 64
    cast-transpose and dact's fp32 g pass."""
    pytest.importorskip("torch")
    from fusedkit import _callcache, _env
    N = 4093 if case.endswith("_odd") else 4096
    rng = rng_for("pdl", case)
    xs = [rand(rng, (1024, N), "bfloat16", scale=s) for s in (3.0, 300.0, 0.5)]
    dys = [rand(rng, (1024, N), "bfloat16", scale=s) for s in (7.0, 0.02, 1.0)]
    got = {}
    for pdl in (False, True):
        monkeypatch.setattr(_env, "PDL", pdl)
        _callcache.clear()
        for k, (x, dy) in enumerate(zip(xs, dys)):
            X, DY = to_backend(x, "torch"), to_backend(dy, "torch")
            if case == "quantize":
                t = fk.quantize(X, fmt="e4m3")
            elif case.startswith("cast_transpose"):
                t = fk.cast_transpose(X, fmt="e4m3")
            else:
                t = fk.dact_cast_transpose(DY, X, activation="gelu", fmt="e5m2")
            got[pdl, k] = [to_numpy(a) for a in (t.data, t.data_t, t.scale_inv, t.amax) if a is not None]
    _callcache.clear()
    for k in range(len(xs)):
        for a, b in zip(got[True, k], got[False, k]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if case == "quantize":
        for k, x in enumerate(xs):
            data, sinv, amax = ref.quantize_current(x, "e4m3")[:3]
            same_bytes(got[True, k][0], data, "e4m3")
            assert F32(np.asarray(got[True, k][1]).reshape(-1)[0]) == sinv
