"""LayerNorm / RMSNorm: one body for every backend (NumPy CPU backend always; CuPy, torch, JAX on a GPU).

Every case draws fresh inputs from its own seed, mean-shifted (-2.3 + 0.5 randn) as real activations
are, rounded to the storage dtype before the float64 reference sees them.
"""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import reference as ref
from _backends import (assert_close, assert_rel, backend_params, framework_of, rand, skip_unsupported,
                       to_backend, to_numpy)

DTYPES = ["float32", "float16", "bfloat16"]
SHAPES = [(0, 64), (1, 1), (7, 7), (3, 781), (1151, 1024), (2, 3, 4096), (5, 16384), (3, 65536),
          (2, 131072), (2, 262144)]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def ref64_forward(x, w, b, eps, rms, zero_centered=False):
    x = x.astype(np.float64)
    mean = np.zeros(x.shape[:-1]) if rms else x.mean(-1)
    d = x - mean[..., None]
    rstd = 1.0 / np.sqrt((d * d).mean(-1) + eps)
    g = 1.0 if w is None else w.astype(np.float64) + (1.0 if zero_centered else 0.0)
    y = d * rstd[..., None] * g
    if b is not None:
        y = y + b.astype(np.float64)
    return y, mean, rstd


def ref64_backward(dy, x, w, eps, rms):
    N = x.shape[-1]
    x = x.astype(np.float64).reshape(-1, N)
    dy = dy.astype(np.float64).reshape(-1, N)
    _, mean, rstd = ref64_forward(x, None, None, eps, rms)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = np.ones(N) if w is None else w.astype(np.float64)
    gd = dy * g
    c1 = (gd * xhat).mean(-1, keepdims=True)
    c2 = 0.0 if rms else gd.mean(-1, keepdims=True)
    dx = rstd[:, None] * (gd - xhat * c1 - c2)
    return dx, (dy * xhat).sum(0), dy.sum(0)


def _make(backend, dtype, shape, w_dtype, seed_key):
    rng = rng_for(*seed_key)
    N = shape[-1]
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    w = rand(rng, (N,), w_dtype, loc=1.0, scale=0.3)
    b = rand(rng, (N,), w_dtype, scale=0.3)
    return rng, x, w, b


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_forward(backend, dtype, shape, rms):
    skip_unsupported(backend, dtype)
    w_dtype = "float32" if shape[-1] % 2 else dtype
    rng, x, w, b = _make(backend, dtype, shape, w_dtype, ("fwd", backend, dtype, shape, rms))
    eps = 1e-5
    X, W, B = (to_backend(a, backend) for a in (x, w, b))
    if rms:
        y, rstd = fk.rms_norm(X, W, eps=eps, return_stats=True)
        mean = None
    else:
        y, mean, rstd = fk.layer_norm(X, W, B, eps=eps, return_stats=True)
    assert framework_of(y) == framework_of(X)
    y64, mean64, rstd64 = ref64_forward(x, w, None if rms else b, eps, rms)
    assert_close(y, y64, dtype, "y")
    assert to_numpy(y).dtype == x.dtype
    if mean is not None:
        np.testing.assert_allclose(to_numpy(mean), mean64, atol=1e-5, rtol=1e-5, err_msg="mean")
    np.testing.assert_allclose(to_numpy(rstd), rstd64, rtol=1e-4, err_msg="rstd")
    if backend != "numpy":  # the GPU kernels against the CPU backend
        y_cpu = ref.rms_norm(x, w, eps=eps) if rms else ref.layer_norm(x, w, b, eps=eps)
        assert_close(y, y_cpu.astype(np.float64), dtype, "y vs CPU backend")


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_backward(backend, dtype, shape, rms):
    skip_unsupported(backend, dtype)
    w_dtype = "float32" if shape[-1] % 2 else dtype
    rng, x, w, b = _make(backend, dtype, shape, w_dtype, ("bwd", backend, dtype, shape, rms))
    dy = rand(rng, shape, dtype)
    eps = 1e-5
    X, W, B, DY = (to_backend(a, backend) for a in (x, w, b, dy))
    if rms:
        _, rstd = fk.rms_norm(X, W, eps=eps, return_stats=True)
        dx, dw = fk.rms_norm_backward(DY, X, W, rstd)
        db = None
    else:
        _, mean, rstd = fk.layer_norm(X, W, B, eps=eps, return_stats=True)
        dx, dw, db = fk.layer_norm_backward(DY, X, W, mean, rstd)
    dx64, dw64, db64 = ref64_backward(dy, x, w, eps, rms)
    assert_close(dx, dx64.reshape(shape), dtype, "dx")
    assert to_numpy(dw).dtype == w.dtype
    if shape[0] == 0:
        assert np.all(to_numpy(dw) == 0)
    else:
        assert_rel(dw, dw64, w_dtype if w_dtype != "float32" else dtype, "dweight")
    if db is not None:
        if shape[0] == 0:
            assert np.all(to_numpy(db) == 0)
        else:
            assert_rel(db, db64, w_dtype if w_dtype != "float32" else dtype, "dbias")


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [781, 4096, 131072])
def test_residual_zero_centered_out_dtype(backend, dtype, N):
    skip_unsupported(backend, dtype)
    rng = rng_for("res", backend, dtype, N)
    x = rand(rng, (3, N), dtype, loc=-2.3, scale=0.5)
    r = rand(rng, (3, N), dtype)
    w = rand(rng, (N,), "float32", scale=0.1)
    X, R, W = (to_backend(a, backend) for a in (x, r, w))
    y, h = fk.rms_norm(X, W, residual=R, zero_centered_gamma=True, out_dtype="float32")
    h_want = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(to_numpy(h), h_want)
    y64, _, _ = ref64_forward(h_want, w, None, 1e-6, True, zero_centered=True)
    assert to_numpy(y).dtype == np.float32
    # input rounding of h is exact (same values), so fp32 output is held to fp32 tolerance
    assert_close(y, y64, "float32", "rms_norm y with residual")
    y2, h2, mean, rstd = fk.layer_norm(X, W, W, residual=R, zero_centered_gamma=True, return_stats=True)
    np.testing.assert_array_equal(to_numpy(h2), h_want)
    y64, _, _ = ref64_forward(h_want, w, w, 1e-5, False, zero_centered=True)
    assert_close(y2, y64, dtype, "layer_norm y with residual")


@pytest.mark.parametrize("backend", backend_params())
def test_no_weight(backend):
    skip_unsupported(backend, "float32")
    rng = rng_for("noweight", backend)
    x = rand(rng, (4, 33), "float32")
    y = fk.layer_norm(to_backend(x, backend))
    assert_close(y, ref64_forward(x, None, None, 1e-5, False)[0], "float32", "y")
    y, rstd = fk.rms_norm(to_backend(x, backend), return_stats=True)
    dx, dw = fk.rms_norm_backward(to_backend(x, backend), to_backend(x, backend), None, rstd)
    assert dw is None
    assert_close(dx, ref64_backward(x, x, None, 1e-6, True)[0], "float32", "dx")


@pytest.mark.parametrize("backend", backend_params())
def test_nan_and_inf_stay_in_their_row(backend):
    """Documented result: a NaN or Inf in a row makes that row's output NaN; other rows are exact."""
    skip_unsupported(backend, "float32")
    rng = rng_for("nan", backend)
    x = rand(rng, (4, 1024), "float32")
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    y = to_numpy(fk.layer_norm(to_backend(x, backend)))
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    good = [0, 3]
    assert_close(y[good], ref64_forward(x[good], None, None, 1e-5, False)[0], "float32", "finite rows")


@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (3, 781), (2, 3, 1024), (2, 262144)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("weights", ["w_b", "none", "zero_centered", "none_zero_centered"])
def test_cpu_fused_fp32_matches_numpy_path(shape, rms, weights):
    """fp32 rows on the CPU backend take the fused Numba kernel (reference/_norms_numba.py); it computes
    the NumPy path's fp32 formulas with float64 row sums: within an ulp of it, stats included."""
    from fusedkit.reference import norms as ref_norms
    rng = rng_for("cpu-fused", shape, rms, weights)
    N = shape[-1]
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    w = None if weights.startswith("none") else rng.standard_normal(N).astype(np.float32)
    b = None if weights.startswith("none") or rms else rng.standard_normal(N).astype(np.float32)
    zc = weights.endswith("zero_centered")  # without a weight, gamma stays 1 (as on the GPU)
    eps = 1e-6 if rms else 1e-5
    assert ref_norms._fused_applies(x, None, None)
    y, _, mean, rstd = ref_norms._forward(x, w, b, None, eps, zc, None, rms)  # the NumPy path
    got = (fk.rms_norm(x, w, eps=eps, zero_centered_gamma=zc, return_stats=True) if rms else
           fk.layer_norm(x, w, b, eps=eps, zero_centered_gamma=zc, return_stats=True))
    np.testing.assert_allclose(got[0], y, rtol=2e-6, atol=2e-6 * max(1.0, float(np.abs(y).max(initial=0))))
    np.testing.assert_allclose(got[-1], rstd, rtol=1e-6)
    if not rms:
        np.testing.assert_allclose(got[1], mean, rtol=1e-6, atol=1e-6)
    assert got[0].dtype == np.float32 and got[0].shape == shape
    assert not ref_norms._fused_applies(x.astype(np.float16), None, None)  # other dtypes: the NumPy path
    assert not ref_norms._fused_applies(x, x, None)                          # residuals too


@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (3, 781), (2, 3, 1024), (64, 512), (2, 262144)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("weights", ["w", "none", "zero_centered", "none_zero_centered"])
def test_cpu_fused_fp32_backward(shape, rms, weights):
    """fp32 backward on the CPU backend (the fused Numba kernel): dx within an ulp-scale bound of the
    NumPy path, dweight / dbias (float64 sums over rows there, fp32 in NumPy) within 2e-5 of it."""
    from fusedkit.reference import norms as ref_norms
    rng = rng_for("cpu-fused-bwd", shape, rms, weights)
    N = shape[-1]
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    w = None if weights.startswith("none") else rng.standard_normal(N).astype(np.float32)
    zc = weights.endswith("zero_centered")
    if rms:
        _, rstd = fk.rms_norm(x, w, zero_centered_gamma=zc, return_stats=True)
        mean = None
        got = fk.rms_norm_backward(dy, x, w, rstd, zero_centered_gamma=zc) + (None,)
    else:
        _, mean, rstd = fk.layer_norm(x, w, zero_centered_gamma=zc, return_stats=True)
        got = fk.layer_norm_backward(dy, x, w, mean, rstd, zero_centered_gamma=zc)
    want = ref_norms._backward(dy, x, w, mean, rstd, zc, rms)  # the NumPy path

    def close(a, b, tol):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(initial=0))))

    close(got[0], want[0], 2e-6)
    assert got[0].dtype == np.float32 and got[0].shape == shape
    if w is not None:
        close(got[1], want[1], 2e-5)
    else:
        assert got[1] is None
    if not rms:
        close(got[2], want[2], 2e-5)



# ------------------------------------------------------------------------------------------------
# bad input: a clear exception that says what was wrong

@pytest.mark.parametrize("backend", backend_params())
def test_bad_inputs(backend):
    skip_unsupported(backend, "float32")
    rng = rng_for("bad", backend)
    x = to_backend(rand(rng, (4, 64), "float32"), backend)
    w_bad = to_backend(rand(rng, (63,), "float32"), backend)
    with pytest.raises(ValueError, match="shape \\(64,\\)"):
        fk.layer_norm(x, w_bad)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        fk.layer_norm(to_backend(np.zeros((4, 64), np.int32), backend))
    w16 = to_backend(rand(rng, (64,), "float16"), backend)
    with pytest.raises(TypeError, match="float32 or x's dtype"):
        fk.layer_norm(x, w16)
    with pytest.raises(ValueError, match="last dimension"):
        fk.layer_norm(to_backend(np.zeros((4, 0), np.float32), backend))
    with pytest.raises(ValueError, match="eps"):
        fk.rms_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="rstd"):
        fk.rms_norm_backward(x, x, None, to_backend(np.zeros((3,), np.float32), backend))
    with pytest.raises(ValueError, match="dy"):
        fk.rms_norm_backward(to_backend(np.zeros((4, 32), np.float32), backend), x, None,
                             to_backend(np.zeros((4,), np.float32), backend))
    if backend != "numpy":
        with pytest.raises(TypeError, match="numpy|host"):
            fk.layer_norm(x, np.ones(64, np.float32))


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
def test_non_contiguous_raises(backend):
    skip_unsupported(backend, "float32")
    x = to_backend(np.ones((64, 32), np.float32), backend)
    xt = x.T
    with pytest.raises(ValueError, match="contiguous"):
        fk.layer_norm(xt)


def test_numpy_non_contiguous_is_accepted():
    x = rand(rng_for("nc"), (32, 64), "float32")
    y = fk.layer_norm(x.T)
    assert_close(y, ref64_forward(x.T, None, None, 1e-5, False)[0], "float32", "strided numpy")


def test_unknown_input_type():
    with pytest.raises(TypeError, match="expects an array"):
        fk.layer_norm([1.0, 2.0])


@pytest.mark.gpu
def test_torch_non_default_stream():
    torch = pytest.importorskip("torch")
    rng = rng_for("stream")
    x = rand(rng, (4096, 1024), "bfloat16", loc=-2.3, scale=0.5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        X = to_backend(x, "torch")            # copy queued on s
        y = fk.layer_norm(X)                 # must run after it, on s
        z = y.float() * 2                    # torch op on s consumes our output
    s.synchronize()
    assert_close(z / 2, ref64_forward(x, None, None, 1e-5, False)[0], "bfloat16", "on a side stream")


@pytest.mark.gpu
def test_cupy_stream_and_cache_across_calls():
    cupy = pytest.importorskip("cupy")
    x = rand(rng_for("cs"), (129, 4096), "float16")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        y = fk.rms_norm(cupy.asarray(x))
    s.synchronize()
    assert_close(y, ref64_forward(x, None, None, 1e-6, True)[0], "float16", "cupy side stream")


@pytest.fixture(params=[True, False], ids=["staged", "registers"])
def kernel_path(request, monkeypatch):
    """Runs a GPU test on both forward/backward paths: staged (bulk copies through shared memory,
    sm_90+) and register-only, by switching the dispatch and dropping the cached launch plans, the
    public calls' own (fusedkit/_callcache.py) included: without that the register-only case of a
    signature the staged case had planned ran the staged backward again."""
    from fusedkit import _callcache
    from fusedkit.backends import cuda_norms as cn
    ok = cn._staged_ok
    monkeypatch.setattr(cn, "_staged_ok", (lambda device: ok(device)) if request.param else (lambda device: False))
    monkeypatch.setattr(cn, "_fwd_plans", {})
    monkeypatch.setattr(cn, "_bwd_plans", {})
    _callcache.clear()
    yield request.param
    _callcache.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1151, 1024), (7, 4096), (13, 8192), (5, 16384), (2, 3, 2048), (1, 32768)],
                         ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_both_kernel_paths(kernel_path, shape, rms):
    """Fresh inputs through both paths, forward with and without a residual, and the backward; row
    counts that leave the last group of rows (and the last ring stage) partly empty."""
    torch = pytest.importorskip("torch")
    dtype = "bfloat16"
    rng, x, w, b = _make("torch", dtype, shape, dtype, ("paths", kernel_path, shape, rms))
    r = rand(rng, shape, dtype)
    dy = rand(rng, shape, dtype)
    X, W, B, R, DY = (to_backend(a, "torch") for a in (x, w, b, r, dy))
    eps = 1e-5
    if rms:
        y, rstd = fk.rms_norm(X, W, eps=eps, return_stats=True)
        dx, dw = fk.rms_norm_backward(DY, X, W, rstd)
        y2, h2 = fk.rms_norm(X, W, eps=eps, residual=R)
    else:
        y, mean, rstd = fk.layer_norm(X, W, B, eps=eps, return_stats=True)
        dx, dw, db = fk.layer_norm_backward(DY, X, W, mean, rstd)
        y2, h2 = fk.layer_norm(X, W, B, eps=eps, residual=R)
    torch.cuda.synchronize()
    assert_close(y, ref64_forward(x, w, None if rms else b, eps, rms)[0], dtype, "y")
    dx64, dw64, db64 = ref64_backward(dy, x, w, eps, rms)
    assert_close(dx, dx64.reshape(shape), dtype, "dx")
    assert_rel(dw, dw64, dtype, "dweight")
    if not rms:
        assert_rel(db, db64, dtype, "dbias")
    h_want = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(to_numpy(h2), h_want)
    assert_close(y2, ref64_forward(h_want, w, None if rms else b, eps, rms)[0], dtype, "y with residual")
    _assert_backward_path(kernel_path)


def _assert_backward_path(staged_allowed):
    """The register-only case ran no staged or pair backward (the dispatch switch took effect)."""
    from fusedkit.backends import cuda_norms as cn
    kinds = {p.kind for p in cn._bwd_plans.values()}
    assert kinds, "no backward was planned"
    if not staged_allowed:
        assert not kinds & {"staged", "pair"}, f"register-only case ran {kinds}"


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["zero_centered", "none"])
@pytest.mark.parametrize("shape", [(37, 1024), (9, 4096), (3, 781)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_backward_weight_forms(kernel_path, weights, shape, rms):
    """The backward kernels read gamma straight from the weight only when it is given and not
    zero-centred (PLAIN_W); the other forms (gamma = w + 1, no weight: gamma = 1) take the general
    path: both against the float64 reference, on both kernel paths."""
    torch = pytest.importorskip("torch")
    dtype = "bfloat16"
    rng, x, w, b = _make("torch", dtype, shape, dtype, ("wforms", kernel_path, weights, shape, rms))
    w = (w.astype(np.float32) - 1.0).astype(w.dtype)  # zero-centred: the kernel adds the 1 back
    dy = rand(rng, shape, dtype)
    X, W, B, DY = (to_backend(a, "torch") for a in (x, w, b, dy))
    zc = weights == "zero_centered"
    Wk = W if zc else None
    eps = 1e-5
    if rms:
        _, rstd = fk.rms_norm(X, Wk, eps=eps, zero_centered_gamma=zc, return_stats=True)
        out = fk.rms_norm_backward(DY, X, Wk, rstd, zero_centered_gamma=zc)
    else:
        _, mean, rstd = fk.layer_norm(X, Wk, B if zc else None, eps=eps, zero_centered_gamma=zc,
                                      return_stats=True)
        out = fk.layer_norm_backward(DY, X, Wk, mean, rstd, zero_centered_gamma=zc)
    torch.cuda.synchronize()
    g = (w.astype(np.float64) + 1.0) if zc else None
    dx64, dw64, db64 = ref64_backward(dy, x, g, eps, rms)
    assert_close(out[0], dx64.reshape(shape), dtype, "dx")
    if zc:
        assert_rel(out[1], dw64, dtype, "dweight")
    else:
        assert out[1] is None
    if not rms:
        assert_rel(out[2], db64, dtype, "dbias")
    _assert_backward_path(kernel_path)


@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [8, 32])
@pytest.mark.parametrize("shape", [(4096, 1024), (777, 96), (2, 3, 4096), (1, 64)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_column_sum_lanes(lanes, shape, rms, monkeypatch):
    """dweight / dbias through column_sum with 8 and 32 lanes (partial rows fewer than, equal to and
    more than 4 x lanes, so the four-load loop and its tail both run; N not a multiple of 32), first
    call and the cached repeat of the call cache, on CuPy arrays."""
    pytest.importorskip("cupy")
    from fusedkit import _callcache
    from fusedkit.backends import cuda_norms as cn
    monkeypatch.setattr(cn, "COLSUM_LANES", lanes)
    monkeypatch.setattr(cn, "_bwd_plans", {})
    _callcache.clear()
    dtype = "float16"
    rng, x, w, b = _make("cupy", dtype, shape, dtype, ("colsum", lanes, shape, rms))
    dy = rand(rng, shape, dtype)
    X, W, B, DY = (to_backend(a, "cupy") for a in (x, w, b, dy))
    dx64, dw64, db64 = ref64_backward(dy, x, w, 1e-5, rms)
    for attempt in ("first call", "cached plan"):
        if rms:
            _, rstd = fk.rms_norm(X, W, return_stats=True)
            dx, dw = fk.rms_norm_backward(DY, X, W, rstd)
        else:
            _, mean, rstd = fk.layer_norm(X, W, B, return_stats=True)
            dx, dw, db = fk.layer_norm_backward(DY, X, W, mean, rstd)
            assert_rel(db, db64, dtype, f"dbias, {attempt}")
        assert_close(dx, dx64.reshape(shape), dtype, f"dx, {attempt}")
        assert_rel(dw, dw64, dtype, f"dweight, {attempt}")
    _callcache.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 1024), (777, 96), (64, 8192), (2, 65536), (3, 262144)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_column_sum_dependent_launch(shape, rms, monkeypatch):
    """column_sum launched as the programmatic dependent of the backward kernel (FUSEDKIT_PDL, on by
    default) gives the bits of a plain launch, on the first call and the call cache's repeat, with
    different dy each call (a sum that read partial rows before the backward wrote them would show)."""
    pytest.importorskip("cupy")
    from fusedkit import _callcache, _env
    rng, x, w, b = _make("cupy", "float16", shape, "float32", ("colsum_pdl", shape, rms))
    X, W, B = (to_backend(a, "cupy") for a in (x, w, b))
    dys = [to_backend(rand(rng, shape, "float16"), "cupy") for _ in range(2)]
    got = {}
    for pdl in (False, True):
        monkeypatch.setattr(_env, "PDL", pdl)
        _callcache.clear()
        for k, DY in enumerate(dys):  # the second call takes the call cache's plan
            if rms:
                _, rstd = fk.rms_norm(X, W, return_stats=True)
                got[pdl, k] = fk.rms_norm_backward(DY, X, W, rstd)
            else:
                _, mean, rstd = fk.layer_norm(X, W, B, return_stats=True)
                got[pdl, k] = fk.layer_norm_backward(DY, X, W, mean, rstd)
    _callcache.clear()
    for k in range(len(dys)):
        for a, c in zip(got[True, k], got[False, k]):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(c))
    dx64, dw64, db64 = ref64_backward(to_numpy(dys[1]), x, w, 1e-5, rms)
    assert_rel(got[True, 1][1], dw64, "float16", "dweight")
    if not rms:
        assert_rel(got[True, 1][2], db64, "float16", "dbias")


def _check_forced_backward(backend, dtype, shape, weights, rms, seed_key):
    """dx, dweight and dbias of the public calls against the float64 reference for one weight form
    ("plain", "zero_centered" or "none"), on the first call and on the cached repeat (the call cache's
    plan): the body of the tests that force a backward kernel through the tuning tables."""
    rng, x, w, b = _make(backend, dtype, shape, dtype, seed_key)
    zc = weights == "zero_centered"
    if zc:
        w = (w.astype(np.float32) - 1.0).astype(w.dtype)
    dy = rand(rng, shape, dtype)
    X, W, B, DY = (to_backend(a, backend) for a in (x, w, b, dy))
    Wk = None if weights == "none" else W
    g = None if weights == "none" else (w.astype(np.float64) + (1.0 if zc else 0.0))
    dx64, dw64, db64 = ref64_backward(dy, x, g, 1e-5, rms)
    for attempt in ("first call", "cached plan"):
        if rms:
            _, rstd = fk.rms_norm(X, Wk, zero_centered_gamma=zc, return_stats=True)
            out = fk.rms_norm_backward(DY, X, Wk, rstd, zero_centered_gamma=zc)
        else:
            _, mean, rstd = fk.layer_norm(X, Wk, B if Wk is not None else None, zero_centered_gamma=zc,
                                          return_stats=True)
            out = fk.layer_norm_backward(DY, X, Wk, mean, rstd, zero_centered_gamma=zc)
            assert_rel(out[2], db64, dtype, f"dbias, {attempt}")
        assert_close(out[0], dx64.reshape(shape), dtype, f"dx, {attempt}")
        if Wk is not None:
            assert_rel(out[1], dw64, dtype, f"dweight, {attempt}")
        else:
            assert out[1] is None


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [(False, 1, 2), (True, 1, 2), (False, 2, 2), (False, 1, 4)],
                         ids=["wait", "pipe", "merge2", "quarters"])
@pytest.mark.parametrize("weights", ["plain", "zero_centered", "none"])
@pytest.mark.parametrize("shape", [(7, 16384), (300, 8192), (1, 16384), (2, 67, 16384)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_pair_backward(variant, weights, shape, rms, monkeypatch):
    """The two-CTA backward (norm_bwd_staged_pair: each row split over a cluster of two CTAs, the row
    sums exchanged through distributed shared memory; with and without PIPE, with two pairs per cluster
    adding their partial rows: MERGE 2, and rows in quarters over four CTAs: SPLIT 4), forced through
    TUNED_PAIR: dx, dweight and dbias against the float64 reference for every weight form, first call
    and cached repeat, with row counts below, at and above the resident clusters (1 row: no next row
    for PIPE, and with MERGE 2 a pair without rows)."""
    pipe, merge, split = variant
    torch = pytest.importorskip("torch")
    from fusedkit import _callcache
    from fusedkit.backends import cuda_norms as cn
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters and bulk copies: sm_90+")
    N = shape[-1]
    monkeypatch.setattr(cn, "TUNED_PAIR",
                        {("rms" if rms else "ln", N, 2): cn.pair_from_half(N, 2, rms, pipe, merge, split)[2:]})
    monkeypatch.setattr(cn, "_bwd_plans", {})
    _callcache.clear()
    _check_forced_backward("torch", "bfloat16", shape, weights, rms, ("pair", weights, shape, rms))
    assert any(p.ctas == split and p.merge == merge for p in cn._bwd_plans.values()), \
        "the pair kernel was not dispatched"
    _callcache.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("weights", ["plain", "zero_centered", "none"])
@pytest.mark.parametrize("case", [("bfloat16", (1151, 1024), None), ("bfloat16", (2, 5, 1024), (2, 2, 2, 0)),
                                  ("bfloat16", (3, 4096), None), ("bfloat16", (301, 8192), None),
                                  ("float32", (77, 2048), None)], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_cluster_merged_partials(cluster, weights, case, rms, monkeypatch):
    """The staged backward whose clusters add their dweight / dbias partial rows through distributed
    shared memory (norm_bwd_staged with CLUSTER > 1), forced through TUNED_STAGED: dx, dweight and
    dbias against the float64 reference for every weight form, first call and cached repeat; fewer
    rows than CTAs (idle CTAs add zeros), two row slots per block, fp32 rows."""
    torch = pytest.importorskip("torch")
    from fusedkit import _callcache
    from fusedkit.backends import cuda_norms as cn
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters and bulk copies: sm_90+")
    dtype, shape, base = case
    N, s = shape[-1], 4 if dtype == "float32" else 2
    base = base or cn._staged_config(N, s, rms)[2:6]
    monkeypatch.setattr(cn, "TUNED_STAGED", {("rms" if rms else "ln", N, s): tuple(base) + (cluster,)})
    monkeypatch.setattr(cn, "TUNED_PAIR", {})
    monkeypatch.setattr(cn, "_bwd_plans", {})
    _callcache.clear()
    _check_forced_backward("torch", dtype, shape, weights, rms, ("cluster", cluster, weights, shape, rms))
    assert any(p.merge == cluster for p in cn._bwd_plans.values()), "the cluster merge was not dispatched"
    _callcache.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2, 4], ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_misaligned_pointers(offset, rms):
    """Contiguous views that start off a 16-byte boundary take narrower vectors, not a fault."""
    torch = pytest.importorskip("torch")
    M, N = 33, 4096
    rng = rng_for("misaligned", offset, rms)
    x = rand(rng, (M * N + offset,), "float16", loc=-2.3, scale=0.5)
    dy = rand(rng, (M * N + offset,), "float16")
    w = rand(rng, (N + offset,), "float16", loc=1.0, scale=0.3)
    X, DY, W = (to_backend(a, "torch")[offset:] for a in (x, dy, w))
    X, DY = X.view(M, N), DY.view(M, N)
    x, dy, w = x[offset:].reshape(M, N), dy[offset:].reshape(M, N), w[offset:]
    if rms:
        y, rstd = fk.rms_norm(X, W, return_stats=True)
        dx, dw = fk.rms_norm_backward(DY, X, W, rstd)
        eps = 1e-6
    else:
        y, mean, rstd = fk.layer_norm(X, W, return_stats=True)
        dx, dw, _ = fk.layer_norm_backward(DY, X, W, mean, rstd)
        eps = 1e-5
    assert_close(y, ref64_forward(x, w, None, eps, rms)[0], "float16", "y")
    dx64, dw64, _ = ref64_backward(dy, x, w, eps, rms)
    assert_close(dx, dx64, "float16", "dx")
    assert_rel(dw, dw64, "float16", "dweight")


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_forward_kernels_are_registered(rms):
    """CPU: every forward kernel the dispatch asks for (plain and FP8 output, PLAIN_W on and off) at the
    tested widths is in the compile-all registry; the fp32-output forward uses the FP8 forward's config, so no shipped instantiation escapes the spill check;
    PLAIN_W is set exactly when weights (and a LayerNorm bias) are given and gamma is not zero-centred."""
    from fusedkit.backends import cuda_norms as cn
    exprs = set(cn.all_expressions()[cn.FILE])
    for x_dt in DTYPES:
        s = 4 if x_dt == "float32" else 2
        for N in (1, 7, 781, 1024, 4096, 14336, 16384, 65536):
            cfg, f8 = cn.fwd_config(N, s, rms), cn.fwd_fp8_config(N, s, rms)
            assert cn.fwd_plain_config(N, s, 4, rms) == f8  # fp32 output: the FP8 forward's config
            for plain_w in (False, True):
                assert cn.fwd_expr(cfg, x_dt, x_dt, x_dt, rms, plain_w=plain_w, N=N) in exprs
                assert cn.fwd_expr(f8, x_dt, x_dt, "float32", rms, plain_w=plain_w, N=N) in exprs
                for fmt in ("e4m3", "e5m2"):
                    assert cn.fwd_fp8_expr(f8, x_dt, x_dt, fmt, rms, plain_w=plain_w, N=N) in exprs
        for N in (4096, 8192, 14336):  # the FP8 forward the dispatch launches (TUNED_FP8_WAVES), any weights
            persistent = cn.fwd_fp8_waves(N, s, rms) is not None
            for w_dt in sorted({x_dt, "float32"}):
                for fmt in ("e4m3", "e5m2"):
                    assert cn.fwd_fp8_expr(cn.fwd_fp8_config(N, s, rms), x_dt, w_dt, fmt, rms, plain_w=True,
                                           persistent=persistent, N=N) in exprs
    for (op, N, s), waves in cn.TUNED_FP8_WAVES.items():
        if (op == "rms") == rms:
            assert cn.fwd_fp8_waves(N, s, rms) == waves
    for (op, N, s), t in cn.TUNED_FP8.items():
        if (op == "rms") == rms:
            assert cn.fwd_fp8_config(N, s, rms) == ("rows", cn.vec_width(N, s)) + tuple(t)
    w, b = 0x1000, 0x2000  # pointers; 0 = absent
    assert cn.plain_weights(w, b, rms, False)
    assert cn.plain_weights(w, 0, rms, False) == rms  # LayerNorm without bias needs the default beta
    assert not cn.plain_weights(0, b, rms, False)
    assert not cn.plain_weights(w, b, rms, True)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_backward_kernels_are_registered(rms):
    """CPU: every backward kernel the dispatch asks for (staged and register rows, PLAIN_W on and off)
    is in the compile-all registry; the tuned staged configs carry all six fields and their shared
    memory (ring + dbias rows) fits one Hopper block (227 KB)."""
    from fusedkit.backends import cuda_norms as cn
    exprs = set(cn.all_expressions()[cn.FILE])
    for x_dt in DTYPES:
        s = 4 if x_dt == "float32" else 2
        for N in (1, 7, 781, 1024, 4096, 8192, 16384, 65536):
            for staged in (False, True):
                cfg = cn.bwd_config(N, s, rms, staged)
                for plain_w in (False, True):
                    assert cn.bwd_expr(cfg, x_dt, x_dt, rms, plain_w=plain_w) in exprs
                if cfg[0] == "staged":
                    assert len(cfg) == 7 and cfg[4] >= 2 and cfg[5] >= 0 and cfg[6] in (1,) + cn.CLUSTER_CHOICES
                    assert cn.bwd_smem_bytes(cfg, rms, N, s) <= 227 * 1024
                    # a cluster merge stages 2 x rpb fp32 rows in the ring
                    assert cfg[4] * 2 * cn.rows_per_block(cfg[3]) * N * s >= 2 * cn.rows_per_block(cfg[3]) * N * 4
                    if x_dt != "float16":  # the variants the cluster-merge test forces are registered
                        for c in cn.CLUSTER_CHOICES:
                            assert cn.bwd_expr(cfg[:6] + (c,), x_dt, x_dt, rms, plain_w=True) in exprs
    for N, pipe, merge, split in ((8192, False, 1, 2), (16384, False, 1, 2), (16384, True, 1, 2), (16384, False, 2, 2),
                                  (8192, False, 2, 2), (16384, False, 1, 4), (8192, False, 1, 4)):
        pair = cn.pair_from_half(N, 2, rms, pipe, merge, split)  # the pair kernels the tests force
        assert pair is not None and pair[3] >= 4 and pair[6:] == (pipe, merge, split)
        for plain_w in (False, True):
            assert cn.bwd_expr(pair, "bfloat16", "bfloat16", rms, plain_w=plain_w) in exprs
        assert cn.bwd_smem_bytes(pair, rms, N, 2) == pair[4] * 2 * (N // split) * 2 + (
            0 if rms or pair[2] * pair[1] < 32 else pair[2] * pair[1] * 32 * pair[3] * 4)
    for (op, N, s), t in cn.TUNED_PAIR.items():  # the shipped pair configs: dispatched, registered
        if (op == "rms") == rms:
            pair = cn.bwd_config(N, s, rms, staged=True)
            assert pair == ("pair", cn.vec_width(N, s)) + tuple(t)
            for plain_w in (False, True):
                assert cn.bwd_expr(pair, "bfloat16", "bfloat16", rms, plain_w=plain_w) in exprs
    assert cn.bwd_plain_weights(0x1000, False) and not cn.bwd_plain_weights(0x1000, True)
    assert not cn.bwd_plain_weights(0, False)
    for (op, N, s), t in cn.TUNED_STAGED.items():
        if (op == "rms") == rms:
            assert cn.bwd_config(N, s, rms, staged=True) == ("staged", cn.vec_width(N, s)) + tuple(t)


def test_forced_config_must_hold_the_row():
    """A forced register-mapped config that leaves part of the row out is refused before anything launches
    (forward, FP8 forward and backward, a pair config holding its split parts)."""
    from fusedkit.backends import cuda_norms as cn
    with pytest.raises(ValueError, match="does not hold rows of 8192"):
        cn.check_covers("norm forward", ("rows", 8, 2, 8), 8192)
    with pytest.raises(ValueError, match="does not hold rows of 8190"):
        cn.check_covers("norm backward", ("rows", 4, 4, 16), 8190)  # not whole vectors of 4
    cn.check_covers("norm backward", ("pair", 8, 2, 16, 2, 0, 0, 1, 2), 16384)  # two halves of 8192
    with pytest.raises(ValueError, match="does not hold rows of 16384"):
        cn.check_covers("norm backward", ("pair", 8, 2, 16, 2, 0, 0, 1, 1), 16384)
    cn.check_covers("norm forward", ("looped", 8), 10**6)
    for N in (1, 7, 781, 1024, 4096, 8192, 14336, 16384, 65536):   # every config the dispatch picks holds its row
        for s in (2, 4):
            cn.check_covers("norm forward", cn.fwd_config(N, s), N)
            cn.check_covers("FP8-output norm forward", cn.fwd_fp8_config(N, s), N)
            for staged in (False, True):
                cn.check_covers("norm backward", cn.bwd_config(N, s, staged=staged), N)
    with pytest.raises(ValueError, match="does not hold rows"):
        cn.forward(0, 0, 0, 0, 0, 0, 0, 0, 4, 8192, "bfloat16", "bfloat16", "bfloat16", 1e-5, False, False, 0, 0,
                   config=("rows", 8, 2, 8))

