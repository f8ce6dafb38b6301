"""LayerNorm / RMSNorm with FP8 output (``fp8_fmt`` / ``fp8_scale``): one body for every backend.

What "correct" means here, and why it is not byte-exact everywhere:

* The FP8 bytes are ``sat(y * scale)`` of the fp32 ``y`` (round to nearest even), ``scale_inv`` is
  ``1 / scale`` in fp32 and ``amax`` is ``max |y|`` of the fp32 ``y`` before scaling.
* CPU backends (numpy, torch_cpu): the library casts the CPU reference's own fp32 ``y``, so bytes,
  ``scale_inv`` and ``amax`` must equal ``reference.fp8.quantize_delayed`` of that ``y`` exactly.
* GPU backends (cupy, torch): the FP8 kernels run the same row code as the plain forward, so their bytes
  must equal ``quantize_delayed`` of the GPU's own ``out_dtype="float32"`` result exactly, and ``amax``
  its max exactly (max is order-independent). The GPU's fp32 ``y`` itself may differ from NumPy's in the
  last ulp (``rsqrtf`` against ``1 / np.sqrt``, fused multiply-adds, summation order), and an ulp can move
  a value across an FP8 rounding boundary: against the CPU reference the codes may differ by at most one
  step on the number line, for at most 0.1 % of the elements, and ``amax`` to 1e-6 relative.
* Independent of both implementations: every code lies between the casts of ``y64 - tol`` and
  ``y64 + tol`` (the cast is monotone), with ``y64`` the float64 result and ``tol`` a bound on the fp32
  error: a few ulp of ``y`` plus, where ``x - mean`` cancels, the rounding of the mean and of ``x``
  (an absolute error: tiny values of ``y`` may sit several E5M2 subnormal steps from the float64 cast).
Inputs are mean-shifted (-2.3 + 0.5 randn, fresh per case) and the scale makes a few percent of the values
saturate (|y| beyond fmt.max / scale).
"""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref_fp8
from fusedkit.reference import norms as ref_norms
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy

BACKENDS = backend_params(["numpy", "torch_cpu", "cupy", "torch"])
GPU = ("cupy", "torch")
FMTS = ["e4m3", "e5m2"]
# M in {0, 1, 7, 1151} x N in {1, 7, 781, 1024, 4096, 14336, 16384, 65536} (65536: the looped kernel;
# M small; 14336: a benchmark width with its own FP8 config, TUNED_FP8's 12 warps x 5 vectors)
SHAPES = [(0, 1), (0, 16384), (1, 1), (1151, 1), (1, 7), (7, 7), (1151, 7), (7, 781), (1151, 781),
          (1, 1024), (1151, 1024), (7, 4096), (2, 3, 4096), (5, 14336), (1, 16384), (7, 16384), (1, 65536),
          (7, 65536)]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _ordinal(b):
    """FP8 bytes -> signed position on the number line (sign-magnitude codes are ordered within a sign)."""
    b = np.asarray(b, np.int16)
    return np.where(b & 0x80, -(b & 0x7F), b)


def _scalar(a):
    return np.float32(np.asarray(to_numpy(a)).reshape(-1)[0])


def _ref64(x, w, b, eps, rms, zero_centered):
    """float64 y, and a bound on |fp32 y - y| per element: a few ulp of y, plus what the fp32 rounding of
    the mean and of x costs where x - mean cancels (tiny y: an absolute error, not a relative one)."""
    x = x.astype(np.float64)
    mean = np.zeros(x.shape[:-1]) if rms else x.mean(-1)
    d = x - mean[..., None]
    rstd = 1.0 / np.sqrt((d * d).mean(-1) + eps)
    g = np.ones(x.shape[-1]) if w is None else w.astype(np.float64) + (1.0 if zero_centered else 0.0)
    y = d * rstd[..., None] * g
    bb = np.zeros(x.shape[-1]) if b is None or rms else b.astype(np.float64)
    y = y + bb
    xmax = np.abs(x).max(-1, initial=0.0)
    tol = 2.0**-19 * np.abs(y) + 2.0**-20 * (((np.abs(mean) + xmax) * rstd)[..., None] * np.abs(g) + np.abs(bb))
    return y, tol


def _call(backend, x, w, b, rms, **kw):
    X, W, B = (to_backend(a, backend) for a in (x, w, b))
    kw = {k: (to_backend(v, backend) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    if rms:
        return fk.rms_norm(X, W, **kw)
    return fk.layer_norm(X, W, B, **kw)


def _check(t, y32, scale, fmt, exact, what):
    """t against quantize_delayed(y32): exact, or codes at most one step apart for at most 0.1 %."""
    want, sinv, amax = ref_fp8.quantize_delayed(y32, scale, fmt)
    assert isinstance(t, fp8.FP8Tensor) and t.fmt is fp8.as_format(fmt), what
    got = np.asarray(to_numpy(t.data))
    assert got.dtype == np.uint8 and got.shape == want.shape, f"{what}: {got.dtype} {got.shape}"
    assert _scalar(t.scale_inv) == sinv, f"{what}: scale_inv {_scalar(t.scale_inv)} != {sinv}"
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=f"{what}: bytes")
        assert _scalar(t.amax) == amax, f"{what}: amax {_scalar(t.amax)} != {amax}"
    else:
        # one code apart, except where y cancels ((x - mean) of a mean-shifted row near 0): there a few
        # fp32 ulp of y are several codes of the scaled value; the float64 bound below covers them
        diff = np.abs(_ordinal(got) - _ordinal(want))
        near0 = np.abs(y32) <= 2.0**-13
        assert ((diff <= 1) | near0).all(), f"{what}: codes {diff[~near0].max(initial=0)} steps apart"
        assert (diff > 0).mean() <= 1e-3 if diff.size else True, f"{what}: {(diff > 0).mean():.2%} differ"
        np.testing.assert_allclose(_scalar(t.amax), amax, rtol=1e-6, err_msg=f"{what}: amax")


def _check_all(backend, t, x, w, b, rms, fmt, scale, eps=1e-5, zero_centered=False, residual=None):
    """The three criteria of the module docstring; returns nothing, asserts."""
    h = x if residual is None else (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
    kw = dict(eps=eps, zero_centered_gamma=zero_centered, out_dtype=np.float32)
    y32 = ref_norms.rms_norm(h, w, **kw) if rms else ref_norms.layer_norm(h, w, b, **kw)
    if backend in GPU:  # exact against the GPU's own fp32 y, bounded against NumPy's
        kwg = dict(eps=eps, zero_centered_gamma=zero_centered, out_dtype="float32")
        if residual is not None:
            kwg["residual"] = residual
        y32_gpu = _call(backend, x, w, b, rms, **kwg)
        y32_gpu = to_numpy(y32_gpu[0] if isinstance(y32_gpu, tuple) else y32_gpu)
        _check(t, y32_gpu, scale, fmt, True, "vs the GPU's fp32 y")
        _check(t, y32, scale, fmt, False, "vs the CPU reference")
    else:
        _check(t, y32, scale, fmt, True, "vs the CPU reference")
    # the cast is monotone: a y32 within tol of y64 casts to a code between those of y64 -+ tol
    y64, tol = _ref64(h, w, b, eps, rms, zero_centered)
    got = _ordinal(to_numpy(t.data))
    lo, hi = (_ordinal(ref_fp8.quantize_delayed(v, scale, fmt)[0]) for v in (y64 - tol, y64 + tol))
    bad = (got < lo) | (got > hi)
    assert not bad.any(), f"vs float64: {bad.sum()} codes outside the cast of y64 -+ tol"


def _make(key, shape, dtype, w_dtype):
    rng = rng_for(*key)
    N = shape[-1]
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    w = rand(rng, (N,), w_dtype, loc=1.0, scale=0.3)
    b = rand(rng, (N,), w_dtype, scale=0.3)
    return rng, x, w, b


def _scale(rng, fmt):
    # |y| beyond 2.6-3.5 saturates (a few percent of the values with these weights)
    return np.float32(fp8.as_format(fmt).max / rng.uniform(2.6, 3.5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("fmt", FMTS)
def test_fp8_forward(backend, dtype, shape, rms, fmt):
    """Weights and bias (fp32 for odd N, else x's dtype), statistics returned alongside."""
    skip_unsupported(backend, dtype)
    w_dtype = "float32" if shape[-1] % 2 else dtype
    rng, x, w, b = _make(("fp8fwd", backend, dtype, shape, rms, fmt), shape, dtype, w_dtype)
    scale = _scale(rng, fmt)
    out = _call(backend, x, w, b, rms, eps=1e-5, return_stats=True, fp8_fmt=fmt, fp8_scale=float(scale))
    t, stats = out[0], out[1:]
    assert len(stats) == (1 if rms else 2)
    _check_all(backend, t, x, w, b, rms, fmt, scale)
    # the statistics are those of the plain forward
    _, *want = (ref_norms.rms_norm(x, w, eps=1e-5, return_stats=True) if rms
                else ref_norms.layer_norm(x, w, b, eps=1e-5, return_stats=True))
    for g, s in zip(stats, want):
        assert to_numpy(g).dtype == np.float32 and to_numpy(g).shape == shape[:-1]
        np.testing.assert_allclose(to_numpy(g), s, rtol=1e-5, atol=1e-5)


OPTIONS = ["no_weight", "weight_only", "x_dtype_weights", "fp32_weights", "zero_centered", "residual",
           "array_scale", "numpy_scalar_scale", "eps"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", [(7, 781), (5, 4096)], ids=str)
def test_fp8_options(backend, option, rms, fmt, shape):
    dtype = "bfloat16" if backend != "cupy" else "float16"
    skip_unsupported(backend, dtype)
    w_dtype = "float32" if option in ("fp32_weights", "zero_centered") or shape[-1] % 2 else dtype
    rng, x, w, b = _make(("fp8opt", backend, option, rms, fmt, shape), shape, dtype, w_dtype)
    scale = _scale(rng, fmt)
    kw = dict(fp8_fmt=fmt, fp8_scale=float(scale))
    residual, zc, eps = None, False, 1e-5
    if option == "no_weight":
        w = b = None
    elif option == "weight_only":
        b = None
    elif option == "zero_centered":
        w = rand(rng, (shape[-1],), w_dtype, scale=0.2)  # stored as gamma - 1
        zc = kw["zero_centered_gamma"] = True
    elif option == "residual":
        residual = kw["residual"] = rand(rng, shape, dtype)
    elif option == "array_scale":
        kw["fp8_scale"] = np.array([scale], np.float32)
    elif option == "numpy_scalar_scale":  # np.float32 has a shape and a dtype but is no array
        kw["fp8_scale"] = np.float32(scale)
    elif option == "eps":
        eps = 0.5  # large enough to change every value
    kw["eps"] = eps
    out = _call(backend, x, w, b, rms, **kw)
    if residual is not None:
        t, h = out
        h_want = (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
        np.testing.assert_array_equal(to_numpy(h), h_want)
    else:
        t = out
    _check_all(backend, t, x, w, b, rms, fmt, scale, eps=eps, zero_centered=zc, residual=residual)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FMTS)
def test_fp8_nan_row(backend, fmt):
    """A NaN in a row makes that row's bytes NaN codes; amax ignores NaN (the max of the other rows)."""
    skip_unsupported(backend, "float32")
    rng, x, w, b = _make(("fp8nan", backend, fmt), (4, 1024), "float32", "float32")
    x[2, 17] = np.nan
    scale = _scale(rng, fmt)
    t = _call(backend, x, w, b, False, fp8_fmt=fmt, fp8_scale=float(scale))
    got = np.asarray(to_numpy(t.data))
    assert np.isnan(ref_fp8.fp8_to_float(got[2], fmt)).all()
    good = [0, 1, 3]
    y32 = ref_norms.layer_norm(x[good], w, b, out_dtype=np.float32)
    want, _, amax = ref_fp8.quantize_delayed(y32, scale, fmt)
    diff = np.abs(_ordinal(got[good]) - _ordinal(want))
    if backend in GPU:
        assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3
        np.testing.assert_allclose(_scalar(t.amax), amax, rtol=1e-6)
    else:
        assert diff.max() == 0 and _scalar(t.amax) == amax


@pytest.mark.parametrize("backend", backend_params(GPU))
def test_fp8_misaligned_views_and_device_scale(backend):
    """x starting mid-vector (narrower vectors) and a device scale array, reused across calls."""
    skip_unsupported(backend, "float32")
    rng = rng_for("fp8misaligned", backend)
    M, N = 5, 1024
    flat = to_backend(rand(rng, (M * N + 1,), "float32", loc=-2.3, scale=0.5), backend)
    X = flat[1:].reshape(M, N)
    x = to_numpy(X)
    s = to_backend(np.array([100.0], np.float32), backend)
    for rms in (False, True):
        t = fk.rms_norm(X, fp8_fmt="e4m3", fp8_scale=s) if rms else fk.layer_norm(X, fp8_fmt="e4m3", fp8_scale=s)
        y32 = to_numpy(fk.rms_norm(X, out_dtype="float32") if rms else fk.layer_norm(X, out_dtype="float32"))
        _check(t, y32, np.float32(100.0), "e4m3", True, "misaligned vs the GPU's fp32 y")
        y_ref = ref_norms.rms_norm(x, out_dtype=np.float32) if rms else ref_norms.layer_norm(x, out_dtype=np.float32)
        _check(t, y_ref, np.float32(100.0), "e4m3", False, "misaligned vs the CPU reference")


@pytest.mark.parametrize("backend", backend_params(GPU))
@pytest.mark.parametrize("grid", [1, 3, 7, "one_group"])
@pytest.mark.parametrize("N", [7, 781, 1024, 4096, 8192, 14336])
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_fp8_grid_stride(backend, grid, N, rms, monkeypatch):
    """The register forward walks row groups grid-stride: a grid much smaller than the groups (several
    groups per block, the amax merged once per block, rows of the last group missing) gives the same
    bytes, scale_inv and amax as the CPU reference, and the statistics of every row. "one_group": the
    non-persistent kernel (FWD_FP8_WAVES = None: one row group per block, the amax merged per warp).
    N = 8192 and 14336: LayerNorm's blocks prefetch their next row group into L2 (PREFETCH, groups of
    16 KB or more), which only happens with several groups per block."""
    from fusedkit.backends import cuda_norms
    if grid == "one_group":
        monkeypatch.setattr(cuda_norms, "FWD_FP8_WAVES", None)
    else:
        monkeypatch.setattr(cuda_norms, "FWD_FP8_MAX_GRID", grid)
    skip_unsupported(backend, "bfloat16")
    M = 1151  # not a multiple of any rows-per-block
    rng, x, w, b = _make(("fp8grid", backend, grid, N, rms), (M, N), "bfloat16", "bfloat16")
    scale = _scale(rng, "e4m3")
    out = _call(backend, x, w, b, rms, eps=1e-5, return_stats=True, fp8_fmt="e4m3", fp8_scale=float(scale))
    _check_all(backend, out[0], x, w, b, rms, "e4m3", scale)
    _, *want = (ref_norms.rms_norm(x, w, eps=1e-5, return_stats=True) if rms
                else ref_norms.layer_norm(x, w, b, eps=1e-5, return_stats=True))
    for g, s in zip(out[1:], want):
        np.testing.assert_allclose(to_numpy(g), s, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# bad input: a clear exception that says what was wrong

@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_bad_inputs(backend):
    skip_unsupported(backend, "float32")
    x = to_backend(rand(rng_for("fp8bad", backend), (4, 64), "float32"), backend)
    for fn in (fk.layer_norm, fk.rms_norm):
        with pytest.raises(ValueError, match="fp8_fmt .* without fp8_scale"):
            fn(x, fp8_fmt="e4m3")
        with pytest.raises(ValueError, match="fp8_scale without fp8_fmt"):
            fn(x, fp8_scale=1.0)
        with pytest.raises(ValueError, match="out_dtype"):
            fn(x, fp8_fmt="e4m3", fp8_scale=1.0, out_dtype="float32")
        with pytest.raises(ValueError, match="unknown FP8 format"):
            fn(x, fp8_fmt="e3m4", fp8_scale=1.0)
        for bad in (0.0, -2.0, float("nan"), float("inf"), 1e39):
            with pytest.raises(ValueError, match="positive finite"):
                fn(x, fp8_fmt="e4m3", fp8_scale=bad)
        with pytest.raises(ValueError, match="positive finite"):
            fn(x, fp8_fmt="e4m3", fp8_scale=np.zeros(1, np.float32))
        with pytest.raises(ValueError, match="1-element float32"):
            fn(x, fp8_fmt="e4m3", fp8_scale=to_backend(np.ones(2, np.float32), backend))
        with pytest.raises(ValueError, match="1-element float32"):
            fn(x, fp8_fmt="e4m3", fp8_scale=to_backend(np.ones(1, np.float64), backend))
        with pytest.raises(TypeError, match="fp8_scale"):
            fn(x, fp8_fmt="e4m3", fp8_scale=object())
    if backend in GPU:  # a host scale array for device x
        with pytest.raises(TypeError, match="fp8_scale"):
            fk.layer_norm(x, fp8_fmt="e4m3", fp8_scale=np.ones(1, np.float32))


def test_fp8_jax():
    """JAX CPU arrays run on the CPU backend; traced values (jax.jit) go through a buffer callback and
    give the same bytes (tests/test_fp8_jax.py has the variants and the GPU cases)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    rng = rng_for("fp8jax")
    x = rand(rng, (3, 40), "float32", loc=-2.3, scale=0.5)
    xj = jax.device_put(jnp.asarray(x), jax.devices("cpu")[0])
    t = fk.layer_norm(xj, fp8_fmt="e4m3", fp8_scale=50.0)
    assert isinstance(t.data, jax.Array)
    _check(t, ref_norms.layer_norm(x, out_dtype=np.float32), np.float32(50.0), "e4m3", True, "jax cpu")
    t = jax.jit(lambda a: fk.layer_norm(a, fp8_fmt="e4m3", fp8_scale=50.0))(xj)
    _check(t, ref_norms.layer_norm(x, out_dtype=np.float32), np.float32(50.0), "e4m3", True, "jax traced")
