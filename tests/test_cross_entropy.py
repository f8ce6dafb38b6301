"""Fused cross-entropy: one body for every backend (NumPy CPU backend and torch CPU tensors always; CuPy
and CUDA torch on a GPU), against an independent float64 reference and torch.nn.functional.cross_entropy.

Every case draws fresh inputs from its own seed, rounded to the logits' dtype before the reference sees
them; about a fifth of the tokens are ignored. Gradients are compared element by element against the
size of the terms that make each element (p * (1 + 2 z lse), e / N, (1 - e) at the target), so small
entries of long rows are checked as tightly as the target's.
"""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from _backends import TOL, backend_params, framework_of, rand, skip_unsupported, to_backend, to_numpy

BACKENDS = ("numpy", "torch_cpu", "cupy", "torch")
DTYPES = ["float32", "float16", "bfloat16"]
SHAPES = [(3, 1), (5, 7), (4, 781), (2, 3, 1024), (3, 32768), (3, 50257), (2, 131072), (2, 262144)]
IGNORE = -100


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_targets(rng, shape, N, ignore=IGNORE, frac=0.2):
    t = rng.integers(0, N, size=shape).astype(np.int64)
    flat = t.reshape(-1)
    drop = rng.random(flat.size) < frac
    drop[0] = False  # at least one token counts
    flat[drop] = ignore
    return t


def ref64(x, t, *, ignore=IGNORE, eps=0.0, z=0.0, reduction="mean", grad_loss=1.0):
    """Float64 reference written independently of fusedkit: cross-entropy against the smoothed target
    distribution q = (1 - e) onehot + e / N. Returns loss, lse, grad and the per-element error scale of
    the gradient."""
    N = x.shape[-1]
    x = np.asarray(x).astype(np.float64).reshape(-1, N)
    t = np.asarray(t).reshape(-1)
    valid = t != ignore
    m = x.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    logp = x - lse[:, None]
    rows = np.flatnonzero(valid)
    q = np.full_like(x, eps / N)
    q[rows, t[rows]] += 1.0 - eps
    tok = -(q * logp).sum(-1) + z * lse**2
    tok[~valid] = 0.0
    n = valid.sum()
    w = np.broadcast_to(np.asarray(grad_loss, np.float64).reshape(-1) if np.size(grad_loss) > 1
                        else float(np.asarray(grad_loss).reshape(-1)[0]), tok.shape).astype(np.float64)
    if reduction == "mean":
        w = w / max(n, 1)
    w = np.where(valid, w, 0.0)
    p = np.exp(logp)
    grad = w[:, None] * (p * (1 + 2 * z * lse)[:, None] - q)
    scale = np.abs(w)[:, None] * (p * np.abs(1 + 2 * z * lse)[:, None] + q)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = {"mean": tok.sum() / n, "sum": tok.sum(), "none": tok}[reduction]
    return loss, np.where(valid, lse, 0.0), grad, scale


SUBNORMAL = {"float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}  # spacing near 0


def assert_grad(got, want, scale, dtype, what):
    """|got - want| <= rtol * (size of the terms forming each element) + the subnormal spacing of the
    dtype: the rounding of the result and of p, relative to the terms, whatever the row length."""
    rtol = TOL[dtype][1]
    g = to_numpy(got).astype(np.float64).reshape(want.shape)
    assert not np.isnan(g).any(), f"{what}: NaN"
    err = np.abs(g - want)
    bound = rtol * scale + SUBNORMAL[dtype]
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} elements off; worst at {i}: got {g[i]!r}, want {want[i]!r}, "
                             f"bound {bound[i]:.3g}")


def assert_loss(got, want, what, rtol=2e-5):
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    assert to_numpy(got).dtype == np.float32, f"{what}: dtype {to_numpy(got).dtype}"
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=what)


def _inputs(backend, dtype, shape, key, loc=0.0, scale=2.0, t_dtype="int64"):
    rng = rng_for(*key)
    x = rand(rng, shape, dtype, loc=loc, scale=scale)
    t = make_targets(rng, shape[:-1], shape[-1]).astype(t_dtype)
    return x, t, to_backend(x, backend), to_backend(t, backend)


OPTS = [(0.0, 0.0), (0.1, 1e-3)]


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", OPTS, ids=["plain", "smooth_zloss"])
def test_loss_lse_grad(backend, dtype, shape, reduction, opts):
    skip_unsupported(backend, dtype)
    eps, z = opts
    x, t, X, T = _inputs(backend, dtype, shape, ("main", backend, dtype, shape, reduction, opts))
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=eps, z_loss=z, reduction=reduction,
                                       return_lse=True, return_grad=True)
    assert framework_of(loss) == framework_of(X) == framework_of(grad)
    loss64, lse64, grad64, scale = ref64(x, t, eps=eps, z=z, reduction=reduction)
    assert_loss(loss, loss64.reshape(t.shape) if reduction == "none" else loss64, "loss")
    assert_loss(lse, lse64.reshape(t.shape), "lse")
    assert to_numpy(grad).dtype == x.dtype and tuple(grad.shape) == shape
    assert_grad(grad, grad64, scale, dtype, "grad")
    if z == 0.0:  # gradient rows of the cross-entropy sum to 0 (the target distribution sums to 1)
        rs = to_numpy(grad).astype(np.float64).reshape(-1, shape[-1]).sum(-1)
        assert np.all(np.abs(rs) <= TOL[dtype][1] * scale.reshape(-1, shape[-1]).sum(-1) + 1e-12)
    # loss alone (forward only) gives the same loss
    loss_only = fk.cross_entropy(X, T, label_smoothing=eps, z_loss=z, reduction=reduction)
    np.testing.assert_array_equal(to_numpy(loss_only), to_numpy(loss))


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", [(0.0, 0.0), (0.2, 0.0), (0.0, 1e-2), (0.05, 1e-4)], ids=str)
def test_against_torch(backend, dtype, reduction, opts):
    """torch.nn.functional.cross_entropy (float64, CPU, on the same rounded logits) plus the z-loss
    term, differentiated by autograd."""
    torch = pytest.importorskip("torch")
    skip_unsupported(backend, dtype)
    eps, z = opts
    shape = (37, 1001)
    x, t, X, T = _inputs(backend, dtype, shape, ("torch", backend, dtype, reduction, opts))
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    tt = torch.tensor(t)
    want = torch.nn.functional.cross_entropy(xt, tt, ignore_index=IGNORE, label_smoothing=eps, reduction=reduction)
    valid = (tt != IGNORE).double()
    zterm = z * torch.logsumexp(xt, -1) ** 2 * valid
    want = want + {"mean": zterm.sum() / valid.sum(), "sum": zterm.sum(), "none": zterm}[reduction]
    want.sum().backward()
    loss, grad = fk.cross_entropy(X, T, ignore_index=IGNORE, label_smoothing=eps, z_loss=z, reduction=reduction,
                                  return_grad=True)
    assert_loss(loss, want.detach().numpy(), "loss vs torch")
    _, _, _, scale = ref64(x, t, eps=eps, z=z, reduction=reduction)
    assert_grad(grad, xt.grad.numpy(), scale, dtype, "grad vs torch")


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", [(0.0, 0.0), (0.3, 1e-2)], ids=["plain", "smooth_zloss"])
def test_all_targets_ignored(backend, reduction, opts):
    """Like torch: the mean over no tokens is NaN, a sum is 0; gradients and lse are all zero."""
    skip_unsupported(backend, "float32")
    eps, z = opts
    x = rand(rng_for("ignored", backend, reduction), (6, 333), "float32")
    t = np.full((6,), 7, np.int64)
    loss, lse, grad = fk.cross_entropy(to_backend(x, backend), to_backend(t, backend), ignore_index=7,
                                       label_smoothing=eps, z_loss=z, reduction=reduction, return_lse=True,
                                       return_grad=True)
    loss = to_numpy(loss)
    if reduction == "mean":
        assert loss.shape == () and np.isnan(loss)
    else:
        np.testing.assert_array_equal(loss, np.zeros(loss.shape, np.float32))
    np.testing.assert_array_equal(to_numpy(lse), np.zeros(6, np.float32))
    np.testing.assert_array_equal(to_numpy(grad), np.zeros_like(x))
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(t), ignore_index=7, reduction=reduction,
                                             label_smoothing=eps)
    np.testing.assert_array_equal(np.isnan(loss), np.isnan(want.numpy()))


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1e4, -1e4])
@pytest.mark.parametrize("N", [781, 32768])
def test_large_offsets(backend, dtype, offset, N):
    """Logits around +-1e4 (fp16/bf16 round them coarsely: the reference sees the same values), and, in
    fp32, invariance to adding 1e4 to every logit of a row (exact in fp32 for these values)."""
    skip_unsupported(backend, dtype)
    rng = rng_for("offset", backend, dtype, offset, N)
    x = (rng.standard_normal((4, N)) * 4 + offset).astype(np.float32).astype(rand(rng, (1,), dtype).dtype)
    t = make_targets(rng, (4,), N)
    loss, lse, grad = fk.cross_entropy(to_backend(x, backend), to_backend(t, backend), label_smoothing=0.1,
                                       reduction="none", return_lse=True, return_grad=True)
    loss64, lse64, grad64, scale = ref64(x, t, eps=0.1, reduction="none")
    assert_loss(loss, loss64, "loss at offset", rtol=1e-4)
    assert_loss(lse, lse64, "lse at offset")
    assert_grad(grad, grad64, scale, dtype, "grad at offset")
    if dtype == "float32":
        x0 = (np.round(rng.standard_normal((4, N)) * 256) / 64).astype(np.float32)  # multiples of 1/64
        xs = (x0 + np.float32(offset)).astype(np.float32)
        assert np.array_equal(xs - np.float32(offset), x0)
        l0, g0 = fk.cross_entropy(to_backend(x0, backend), to_backend(t, backend), reduction="none", return_grad=True)
        l1, g1 = fk.cross_entropy(to_backend(xs, backend), to_backend(t, backend), reduction="none", return_grad=True)
        np.testing.assert_allclose(to_numpy(l1), to_numpy(l0), rtol=1e-5, atol=1e-5)
        _, _, g64, sc = ref64(x0, t, reduction="none")
        assert_grad(g1, g64, sc, dtype, "grad of shifted logits")


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [7, 4096, 131072])
def test_inplace_gradient(backend, dtype, N):
    """inplace_grad=True returns the logits object, overwritten by the gradient (same values as the
    out-of-place gradient); the loss is computed from the original logits."""
    skip_unsupported(backend, dtype)
    x, t, _, T = _inputs(backend, dtype, (5, N), ("inplace", backend, dtype, N))
    X = to_backend(x.copy(), backend)  # numpy: to_backend does not copy, and X gets overwritten
    loss_ref, grad_ref = fk.cross_entropy(to_backend(x, backend), T, label_smoothing=0.1, return_grad=True)
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=0.1, return_lse=True, return_grad=True,
                                       inplace_grad=True)
    assert grad is X
    np.testing.assert_array_equal(to_numpy(loss), to_numpy(loss_ref))
    np.testing.assert_array_equal(to_numpy(X), to_numpy(grad_ref))
    # the backward from the saved lse, in place over a fresh copy of the logits
    X2 = to_backend(x.copy(), backend)
    g2 = fk.cross_entropy_backward(1.0, X2, T, lse, label_smoothing=0.1, inplace_grad=True)
    assert g2 is X2
    _, _, g64, scale = ref64(x, t, eps=0.1)
    assert_grad(g2, g64, scale, dtype, "in-place backward")


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("N", [7, 781, 32768])
def test_backward_from_lse(backend, dtype, reduction, N):
    """cross_entropy_backward(grad_loss, logits, target, lse): a Python scalar, a one-element array, and
    for "none" one upstream value per token."""
    skip_unsupported(backend, dtype)
    x, t, X, T = _inputs(backend, dtype, (2, 3, N), ("bwd", backend, dtype, reduction, N))
    _, lse = fk.cross_entropy(X, T, z_loss=1e-3, label_smoothing=0.05, reduction=reduction, return_lse=True)
    kw = dict(z_loss=1e-3, label_smoothing=0.05, reduction=reduction)
    rng = rng_for("gl", backend, dtype, reduction, N)
    cases = [0.7, to_backend(np.array(1.3, np.float32), backend)]
    if reduction == "none":
        cases.append(to_backend(rng.standard_normal((2, 3)).astype(np.float32), backend))
    for gl in cases:
        grad = fk.cross_entropy_backward(gl, X, T, lse, **kw)
        assert framework_of(grad) == framework_of(X) and to_numpy(grad).dtype == x.dtype
        _, _, g64, scale = ref64(x, t, eps=0.05, z=1e-3, reduction=reduction, grad_loss=to_numpy(gl))
        assert_grad(grad, g64, scale, dtype, f"backward, grad_loss {np.shape(to_numpy(gl))}")


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
def test_int32_targets_and_leading_dims(backend):
    skip_unsupported(backend, "float32")
    x, t, X, T = _inputs(backend, "float32", (2, 5, 3, 300), ("int32", backend))
    T32 = to_backend(t.astype(np.int32), backend)
    for red in ("mean", "none"):
        a = fk.cross_entropy(X, T, reduction=red, return_lse=True, return_grad=True)
        b = fk.cross_entropy(X, T32, reduction=red, return_lse=True, return_grad=True)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(to_numpy(u), to_numpy(v))
    assert tuple(a[0].shape) == (2, 5, 3) and tuple(a[1].shape) == (2, 5, 3)


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
def test_many_tokens_reduce_deterministically(backend):
    """More tokens than one reduction block (65536) with a tiny vocab: the two-level sum, run twice,
    gives the same bits; the mean matches the reference."""
    skip_unsupported(backend, "float32")
    x, t, X, T = _inputs(backend, "float32", (70001, 3), ("many", backend))
    a = fk.cross_entropy(X, T, return_grad=True)
    b = fk.cross_entropy(X, T, return_grad=True)
    np.testing.assert_array_equal(to_numpy(a[0]), to_numpy(b[0]))
    np.testing.assert_array_equal(to_numpy(a[1]), to_numpy(b[1]))
    loss64, _, grad64, scale = ref64(x, t)
    assert_loss(a[0], loss64, "mean over 70001 tokens")
    assert_grad(a[1], grad64, scale, "float32", "grad over 70001 tokens")
    s = fk.cross_entropy(X, T, reduction="sum")
    assert_loss(s, ref64(x, t, reduction="sum")[0], "sum over 70001 tokens", rtol=1e-4)


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
def test_zero_tokens(backend):
    skip_unsupported(backend, "float32")
    X = to_backend(np.zeros((0, 11), np.float32), backend)
    T = to_backend(np.zeros((0,), np.int64), backend)
    loss, grad = fk.cross_entropy(X, T, return_grad=True)
    assert np.isnan(to_numpy(loss)) and tuple(grad.shape) == (0, 11)
    assert to_numpy(fk.cross_entropy(X, T, reduction="sum")) == 0
    assert tuple(fk.cross_entropy(X, T, reduction="none").shape) == (0,)


# ---------------------------------------------------------------------------------------------------
# bad input: a clear exception that says what was wrong

@pytest.mark.parametrize("backend", backend_params(BACKENDS))
def test_bad_inputs(backend):
    skip_unsupported(backend, "float32")
    rng = rng_for("bad", backend)
    x = to_backend(rand(rng, (4, 10), "float32"), backend)
    t = to_backend(np.array([1, 2, 3, 4]), backend)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        fk.cross_entropy(to_backend(np.zeros((4, 10), np.int32), backend), t)
    with pytest.raises(TypeError, match="int32 or int64"):
        fk.cross_entropy(x, to_backend(np.zeros(4, np.float32), backend))
    with pytest.raises(ValueError, match=r"target must have shape logits.shape\[:-1\] = \(4,\)"):
        fk.cross_entropy(x, to_backend(np.zeros(5, np.int64), backend))
    with pytest.raises(ValueError, match="target must have shape"):
        fk.cross_entropy(x, to_backend(np.zeros((4, 1), np.int64), backend))
    with pytest.raises(ValueError, match="vocab"):
        fk.cross_entropy(to_backend(np.zeros((4, 0), np.float32), backend), t)
    with pytest.raises(ValueError, match="reduction"):
        fk.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        fk.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="z_loss"):
        fk.cross_entropy(x, t, z_loss=-1.0)
    with pytest.raises(ValueError, match="inplace_grad=True needs return_grad=True"):
        fk.cross_entropy(x, t, inplace_grad=True)
    _, lse = fk.cross_entropy(x, t, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        fk.cross_entropy_backward(1.0, x, t, to_backend(np.zeros(3, np.float32), backend))
    with pytest.raises(ValueError, match="grad_loss"):
        fk.cross_entropy_backward(to_backend(np.ones(4, np.float32), backend), x, t, lse, reduction="mean")
    if backend != "numpy":
        with pytest.raises(TypeError, match="numpy|host"):
            fk.cross_entropy(x, np.array([1, 2, 3, 4]))
        with pytest.raises(TypeError, match="numpy|host"):
            fk.cross_entropy_backward(np.ones((), np.float32), x, t, lse)


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu"]))
def test_out_of_range_target_cpu_raises(backend):
    skip_unsupported(backend, "float32")
    x = to_backend(rand(rng_for("oor"), (3, 10), "float32"), backend)
    for bad in (10, -1, 1000):
        t = to_backend(np.array([1, bad, IGNORE]), backend)
        with pytest.raises(ValueError, match=r"target values must be in \[0, 10\)"):
            fk.cross_entropy(x, t)
        with pytest.raises(ValueError, match=r"target values must be in \[0, 10\)"):
            fk.cross_entropy_backward(1.0, x, t, to_backend(np.zeros(3, np.float32), backend))


@pytest.mark.parametrize("backend", backend_params(BACKENDS))
@pytest.mark.parametrize("N", [10, 32768, 131072, 262144])
def test_nan_logits_make_their_row_nan(backend, N):
    """One NaN at a row's end, or a row's first half NaN (whole threads whose running max stays -inf while
    their sums take in the NaN): those rows' losses are NaN, the others' are untouched."""
    skip_unsupported(backend, "float32")
    x, _, _, _ = _inputs(backend, "float32", (4, N), ("nan", backend, N))
    x[1, N - 1] = np.nan
    x[2, : N // 2] = np.nan
    t = np.array([0, 1, N - 1, 3])
    loss = to_numpy(fk.cross_entropy(to_backend(x, backend), to_backend(t, backend), reduction="none"))
    assert np.isnan(loss[1]) and np.isnan(loss[2]), loss
    l64 = ref64(x[[0, 3]], t[[0, 3]], reduction="none")[0]
    assert_loss(loss[[0, 3]], l64, "finite rows next to NaN rows")


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("N", [10, 32768, 131072])
def test_out_of_range_target_gpu_is_nan_not_a_fault(backend, N):
    """No host check on the GPU: the token's loss is NaN (so the mean is NaN), its gradient row zero, the
    other rows untouched by it."""
    skip_unsupported(backend, "float32")
    x, t, X, _ = _inputs(backend, "float32", (3, N), ("oor_gpu", backend, N))
    t = np.array([1, N + 5, 2])
    loss, grad = fk.cross_entropy(X, to_backend(t, backend), reduction="none", return_grad=True)
    loss = to_numpy(loss)
    assert np.isnan(loss[1]) and np.isfinite(loss[[0, 2]]).all()
    np.testing.assert_array_equal(to_numpy(grad)[1], np.zeros(N, np.float32))
    t_ok = t.copy()
    t_ok[1] = IGNORE
    l64, _, g64, scale = ref64(x, t_ok, reduction="none")
    assert_loss(loss[[0, 2]], l64[[0, 2]], "valid rows next to a bad one")
    assert np.isnan(to_numpy(fk.cross_entropy(X, to_backend(t, backend))))


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
def test_non_contiguous_raises(backend):
    skip_unsupported(backend, "float32")
    x = to_backend(np.ones((64, 32), np.float32), backend)
    t = to_backend(np.zeros(32, np.int64), backend)
    with pytest.raises(ValueError, match="contiguous"):
        fk.cross_entropy(x.T, t)


def test_numpy_non_contiguous_is_accepted():
    x = rand(rng_for("nc"), (32, 64), "float32")
    t = make_targets(rng_for("nct"), (64,), 32)
    loss, grad = fk.cross_entropy(x.T, t, return_grad=True)
    l64, _, g64, scale = ref64(x.T, t)
    assert_loss(loss, l64, "strided numpy")
    assert_grad(grad, g64, scale, "float32", "strided numpy")


# ---------------------------------------------------------------------------------------------------
# GPU paths: every kernel variant against the reference

@pytest.fixture
def looped_only(monkeypatch):
    """Routes every vocab size to the looped (two-pass) kernel."""
    from fusedkit.backends import cuda_cross_entropy as ce
    monkeypatch.setattr(ce, "fwd_config", lambda N, s, cluster=True, max_vec=16: ("looped", ce.vec_width(N, s, max_vec)))
    monkeypatch.setattr(ce, "_plans", {})


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(5, 7), (3, 781), (2, 32768), (2, 262144)], ids=str)
def test_looped_kernel(looped_only, shape):
    torch = pytest.importorskip("torch")
    dtype = "bfloat16"
    x, t, X, T = _inputs("torch", dtype, shape, ("looped", shape))
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=0.1, z_loss=1e-3, return_lse=True, return_grad=True)
    torch.cuda.synchronize()
    l64, lse64, g64, scale = ref64(x, t, eps=0.1, z=1e-3)
    assert_loss(loss, l64, "looped loss")
    assert_loss(lse, lse64, "looped lse")
    assert_grad(grad, g64, scale, dtype, "looped grad")
    X2 = to_backend(x.copy(), "torch")
    g2 = fk.cross_entropy(X2, T, label_smoothing=0.1, z_loss=1e-3, return_grad=True, inplace_grad=True)[1]
    assert_grad(g2, g64, scale, dtype, "looped grad in place")


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 3], ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("N", [4096, 32768, 131072])
def test_misaligned_views(offset, N):
    """Contiguous views that start off a 16-byte boundary take narrower vectors, not a fault."""
    pytest.importorskip("torch")
    M = 3
    rng = rng_for("misaligned", offset, N)
    buf = rand(rng, (M * N + offset,), "float16")
    X = to_backend(buf, "torch")[offset:].view(M, N)
    x = buf[offset:].reshape(M, N)
    t = make_targets(rng, (M,), N)
    loss, grad = fk.cross_entropy(X, to_backend(t, "torch"), reduction="none", return_grad=True)
    l64, _, g64, scale = ref64(x, t, reduction="none")
    assert_loss(loss, l64, "misaligned loss")
    assert_grad(grad, g64, scale, "float16", "misaligned grad")


@pytest.fixture
def registers_only(monkeypatch):
    """Routes every vocab size to the register kernels (a block's registers, or a cluster's on sm_90)."""
    from fusedkit.backends import cuda_cross_entropy as ce
    monkeypatch.setattr(ce, "STAGED_MIN_BYTES", 1 << 62)
    monkeypatch.setattr(ce, "_plans", {})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [32768, 131072, 262144])
def test_register_kernels(registers_only, dtype, N):
    pytest.importorskip("torch")
    x, t, X, T = _inputs("torch", dtype, (3, N), ("registers", dtype, N))
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=0.1, z_loss=1e-3, return_lse=True, return_grad=True)
    l64, lse64, g64, scale = ref64(x, t, eps=0.1, z=1e-3)
    assert_loss(loss, l64, "register-kernel loss")
    assert_loss(lse, lse64, "register-kernel lse")
    assert_grad(grad, g64, scale, dtype, "register-kernel grad")


@pytest.fixture(params=[(c, b) for b in (1, 2) for c in (1, 2, 4, 8)], ids=lambda p: f"cluster{p[0]}_buffers{p[1]}")
def staged_cluster(request, monkeypatch):
    """Routes every vocab size whose rows allow 16-byte vectors to the staged kernel with a cluster of
    the given size and one or two row buffers (however short the row: CTAs past the row's end get an empty chunk). Where two
    chunks do not fit in one SM's shared memory (fp32 rows on one CTA) the register rule runs instead."""
    from fusedkit.backends import cuda_cross_entropy as ce
    monkeypatch.setattr(ce, "STAGED_MIN_BYTES", 0)
    monkeypatch.setattr(ce, "STAGED_CLUSTERS", (request.param[0],))
    monkeypatch.setattr(ce, "STAGED_BUFFERS", request.param[1])
    monkeypatch.setattr(ce, "STAGE_CHUNK_BYTES", 1 << 30)
    monkeypatch.setattr(ce, "STAGED_MAX_GROUPS", 3)
    monkeypatch.setattr(ce, "_plans", {})
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [8, 4096, 32768, 50264])
def test_staged_kernel(staged_cluster, dtype, N):
    """The staged kernel at every cluster size: uneven chunks (50264 = 8 x 6283 vectors), CTAs with no
    vectors (N = 8), ignored rows, smoothing and z-loss, loss only, in place, and the target in every
    chunk; a grid of 3 clusters for 7 rows, so each cluster walks rows through both buffers (an ignored
    row in between: no copy, no wait)."""
    torch = pytest.importorskip("torch")
    from fusedkit.backends import cuda_cross_entropy as ce
    M = 7
    x, t, X, T = _inputs("torch", dtype, (M, N), ("staged", staged_cluster, dtype, N))
    assert ce.fwd_config(N, x.itemsize)[0] == "staged"
    t[1:6] = np.linspace(0, N - 1, 5).astype(np.int64)  # targets in the first to the last chunk
    t[2] = IGNORE
    T = to_backend(t, "torch")
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=0.1, z_loss=1e-3, reduction="none", return_lse=True,
                                       return_grad=True)
    l64, lse64, g64, scale = ref64(x, t, eps=0.1, z=1e-3, reduction="none")
    assert_loss(loss, l64, "staged loss")
    assert_loss(lse, lse64, "staged lse")
    assert_grad(grad, g64, scale, dtype, "staged grad")
    assert not to_numpy(grad)[2].any(), "an ignored row's gradient is 0"
    loss_only = fk.cross_entropy(X, T, label_smoothing=0.1, z_loss=1e-3, reduction="none")
    np.testing.assert_array_equal(to_numpy(loss_only), to_numpy(loss))
    X2 = to_backend(x.copy(), "torch")
    _, g2 = fk.cross_entropy(X2, T, label_smoothing=0.1, z_loss=1e-3, reduction="none", return_grad=True,
                             inplace_grad=True)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(g2), to_numpy(grad))


PERSISTENT_CASES = [
    ("bfloat16", 262144, ("persistent", 8, 8, 16, 8)),   # the first sweep candidate at the largest vocab
    ("float16", 50264, ("persistent", 8, 4, 16, 4)),     # uneven chunks: 6283 vectors over 4 CTAs
    ("bfloat16", 32768, ("persistent", 8, 8, 16, 1)),    # no cluster
    ("bfloat16", 8, ("persistent", 8, 1, 1, 4)),         # three CTAs of the cluster hold nothing
    ("float32", 32768, ("persistent", 4, 8, 16, 2)),
    ("bfloat16", 131072, ("persistent", 8, 4, 16, 8, 2)),  # a ring of 2 (two rows loaded ahead)
    ("float16", 50264, ("persistent", 8, 4, 16, 4, 3)),    # a ring of 3 over an ignored row
    ("bfloat16", 8, ("persistent", 8, 1, 1, 4, 4)),        # a ring of 4 deeper than the rows walked
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,N,cfg", PERSISTENT_CASES, ids=str)
def test_persistent_kernel(monkeypatch, dtype, N, cfg):
    """The persistent kernel (registers + the next row's chunk by bulk copy) against the float64 reference
    and bit for bit against the register cluster kernel of the same split: ignored rows, smoothing and
    z-loss, targets in the first to the last chunk, loss only, in place; a grid of 3 clusters for 7 rows,
    so each cluster walks rows (an ignored row in between: no copy, no wait)."""
    torch = pytest.importorskip("torch")
    from fusedkit.backends import cuda_cross_entropy as ce
    M = 7
    x, t, X, _ = _inputs("torch", dtype, (M, N), ("persistent", dtype, N, cfg))
    t[1:6] = np.linspace(0, N - 1, 5).astype(np.int64)
    t[2] = IGNORE
    T = to_backend(t, "torch")
    kw = dict(label_smoothing=0.1, z_loss=1e-3, reduction="none")
    monkeypatch.setattr(ce, "STAGED_MAX_GROUPS", 3)
    got = {}
    for kind in ("persistent", "rows"):
        # a rows config has five fields: the persistent one's ring depth stays with it
        forced = cfg if kind == "persistent" else ("rows",) + cfg[1:5]
        monkeypatch.setattr(ce, "fwd_config", lambda *a, f=forced, **_: f)
        monkeypatch.setattr(ce, "_plans", {})
        got[kind] = fk.cross_entropy(X, T, return_lse=True, return_grad=True, **kw)
        assert [plan.cap is not None for plan in ce._plans.values()] == [kind == "persistent"]
        if kind == "persistent":
            loss_only = fk.cross_entropy(X, T, **kw)
            X2 = to_backend(x.copy(), "torch")
            _, g2 = fk.cross_entropy(X2, T, return_grad=True, inplace_grad=True, **kw)
    loss, lse, grad = got["persistent"]
    l64, lse64, g64, scale = ref64(x, t, eps=0.1, z=1e-3, reduction="none")
    assert_loss(loss, l64, "persistent loss")
    assert_loss(lse, lse64, "persistent lse")
    assert_grad(grad, g64, scale, dtype, "persistent grad")
    assert not to_numpy(grad)[2].any(), "an ignored row's gradient is 0"
    for a, b in zip(got["persistent"], got["rows"]):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(loss_only), to_numpy(loss))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(g2), to_numpy(grad))


def test_forced_config_must_hold_the_row():
    """A forced register-mapped config that leaves part of the row out is refused before anything launches."""
    from fusedkit.backends import cuda_cross_entropy as ce
    for cfg in (("persistent", 8, 4, 16, 4), ("rows", 8, 8, 16, 2)):
        with pytest.raises(ValueError, match="does not hold rows of 262144"):
            ce.forward(0, 0, False, 0, 0, 0, 0, 4, 262144, "bfloat16", -100, 0.0, 0.0, 1.0, 0, 0, config=cfg)


def test_persistent_rule(monkeypatch):
    """A TUNED_PERSISTENT entry is taken only where the kernel can run (clusters, 16-byte vectors); its
    candidates cover their rows and are among the compile-all check's instantiations."""
    from fusedkit.backends import cuda_cross_entropy as ce
    assert ce.fwd_config(262144, 2)[0] == "staged"  # tuned to the staged kernel there
    monkeypatch.setitem(ce.TUNED_PERSISTENT, (262144, 2), (8, 16, 8))
    assert ce.fwd_config(262144, 2) == ("persistent", 8, 8, 16, 8)
    assert ce.fwd_config(262144, 2, max_vec=4)[0] != "persistent"
    assert ce.fwd_config(262144, 2, cluster=False)[0] != "persistent"
    assert ce.persistent_chunk_bytes(("persistent", 8, 8, 16, 8), 262144) == 4096 * 16
    exprs = set(ce.all_expressions()[ce.FILE])
    for N, cands in ce.PERSISTENT_CANDIDATES.items():
        for cand in cands:
            items, warps, c = cand[:3]
            cfg = ("persistent", 8) + tuple(cand)
            assert c * 32 * warps * items * 8 >= N > c * 32 * warps * items * 4
            assert ce.persistent_chunk_bytes(cfg, N) <= 200 * 1024
            assert ce.fwd_expr(cfg, "bfloat16") in exprs
    # the ring depth: a sixth field, in the kernel's name only when it is not 1, times the shared memory
    expr = "fk::ce_fwd_persistent<fk::bf16, 8, 4, 16, 16"
    assert ce.fwd_expr(("persistent", 8, 4, 16, 16, 2), "bfloat16") == expr + ", 2>"
    assert ce.fwd_expr(("persistent", 8, 4, 16, 16, 1), "bfloat16") == expr + ">"
    assert ce.persistent_chunk_bytes(("persistent", 8, 4, 16, 16, 3), 262144) == 3 * 2048 * 16
    for tail in ((5,), (0,), (2, 1)):
        bad = ("persistent", 8, 4, 16, 16) + tail
        with pytest.raises(ValueError, match="ring depth of 1 to 4"):
            ce.fwd_expr(bad, "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [1, 2], ids=["spread", "load_balancing"])
def test_cluster_scheduling_policy_same_bits(monkeypatch, policy):
    """A cluster scheduling policy preference on the staged launch changes where clusters run, not what
    they compute."""
    pytest.importorskip("torch")
    from fusedkit.backends import cuda_cross_entropy as ce
    x, t, X, T = _inputs("torch", "bfloat16", (5, 131072), ("policy", policy))
    base = fk.cross_entropy(X, T, reduction="none", return_lse=True, return_grad=True)
    monkeypatch.setattr(ce, "STAGED_CLUSTER_POLICY", policy)
    got = fk.cross_entropy(X, T, reduction="none", return_lse=True, return_grad=True)
    for a, b in zip(got, base):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


@pytest.mark.gpu
def test_torch_non_default_stream():
    torch = pytest.importorskip("torch")
    x, t, _, _ = _inputs("numpy", "bfloat16", (64, 32768), ("stream",))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        X, T = to_backend(x, "torch"), to_backend(t, "torch")
        loss, grad = fk.cross_entropy(X, T, return_grad=True)
        g2 = grad.float() * 2
    s.synchronize()
    l64, _, g64, scale = ref64(x, t)
    assert_loss(loss, l64, "loss on a side stream")
    assert_grad(g2 / 2, g64, scale, "bfloat16", "grad on a side stream")


# Each kind of fused kernel (and the backward) as a programmatic dependent of the count kernel, and the
# final sum as the fused kernel's: (M, N, forced config or None for the shipped one). 1 << 18 tokens of 8:
# a count and a sum of four blocks plus ce_reduce_final, the fused kernel's rows done long before the
# count (a missing wait reads a stale count).
DEPENDENT_CASES = [
    (1 << 18, 8, None),
    (600, 32768, None),                              # staged, one CTA a row
    (300, 131072, None),                             # persistent (TUNED_PERSISTENT)
    (160, 262144, None),                             # staged, clusters of 16, two buffers
    (300, 32768, ("rows", 8, 8, 16, 2)),             # registers over a cluster of 2
    (100, 4096, ("rows", 8, 1, 16, 1)),              # registers, one block a row
    (40, 32768, ("looped", 8)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,cfg", DEPENDENT_CASES, ids=str)
def test_dependent_launches(monkeypatch, M, N, cfg):
    """The count -> fused -> sum chain with programmatic dependent launches (FUSEDKIT_PDL, on by
    default) gives the bits of plain launches, on two calls whose counts differ (the second call's count
    buffer is likely the first's, so a count read before the count kernel finished would show), and
    the backward from lse likewise; the loss and gradient against the float64 reference."""
    torch = pytest.importorskip("torch")
    from fusedkit import _env
    from fusedkit.backends import cuda_cross_entropy as ce
    if cfg is not None:
        monkeypatch.setattr(ce, "fwd_config", lambda *a, f=cfg, **_: f)
        monkeypatch.setattr(ce, "_plans", {})
    rng = rng_for("dependent", M, N)
    x = rand(rng, (M, N), "bfloat16")
    X = to_backend(x, "torch")
    targets = [make_targets(rng, (M,), N, frac=f) for f in (0.1, 0.6)]
    got = {}
    for pdl in (False, True):
        monkeypatch.setattr(_env, "PDL", pdl)
        for k, t in enumerate(targets):
            T = to_backend(t, "torch")
            loss, lse, grad = fk.cross_entropy(X, T, return_lse=True, return_grad=True)
            gb = fk.cross_entropy_backward(1.0, X, T, lse)
            got[pdl, k] = [to_numpy(a) for a in (loss, lse, grad, gb)]
    torch.cuda.synchronize()
    for k, t in enumerate(targets):
        for a, b in zip(got[True, k], got[False, k]):
            np.testing.assert_array_equal(a, b)
        if M * N <= 1 << 24:
            l64, _, g64, scale = ref64(x, t)
            assert_loss(got[True, k][0], l64, f"loss, call {k}")
            assert_grad(got[True, k][2], g64, scale, "bfloat16", f"grad, call {k}")
            assert_grad(got[True, k][3], g64, scale, "bfloat16", f"backward, call {k}")


# ---------------------------------------------------------------------------------------------------
# PyTorch autograd adapter

@pytest.mark.parametrize("backend", backend_params(["torch_cpu", "torch"]))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_autograd(backend, dtype, reduction):
    """fusedkit.torch.cross_entropy against torch.nn.functional.cross_entropy (float64, CPU), loss and
    logits.grad, with a non-unit upstream gradient, leading dims and ignored tokens."""
    torch = pytest.importorskip("torch")
    skip_unsupported(backend, dtype)
    import fusedkit.torch as ft
    shape = (2, 5, 777)
    x, t, X, T = _inputs(backend, dtype, shape, ("autograd", backend, dtype, reduction))
    X.requires_grad_(True)
    up = rng_for("up", backend, dtype, reduction).standard_normal(t.shape).astype(np.float32)
    loss = ft.cross_entropy(X, T, label_smoothing=0.1, reduction=reduction)
    w = to_backend(up, backend) if reduction == "none" else 1.7
    (loss * w).sum().backward()
    x64 = torch.tensor(x.astype(np.float64).reshape(-1, shape[-1]), requires_grad=True)
    want = torch.nn.functional.cross_entropy(x64, torch.tensor(t.reshape(-1)), label_smoothing=0.1,
                                             reduction=reduction)
    (want * (torch.tensor(up.reshape(-1), dtype=torch.float64) if reduction == "none" else 1.7)).sum().backward()
    assert loss.dtype == torch.float32 and tuple(loss.shape) == (t.shape if reduction == "none" else ())
    assert_loss(loss.detach(), want.detach().numpy().reshape(t.shape if reduction == "none" else ()), "loss")
    gl = up if reduction == "none" else 1.7
    _, _, _, scale = ref64(x, t, eps=0.1, reduction=reduction, grad_loss=gl)
    assert_grad(X.grad, x64.grad.numpy().reshape(-1, shape[-1]), scale, dtype, "logits.grad")


# ---------------------------------------------------------------------------------------------------
# launch plumbing (no GPU needed)

def test_cluster_launch_structs_match_cuda_h():
    """CUlaunchAttribute / CUlaunchConfig as laid out by cuda.h (CUDA 12/13)."""
    import ctypes
    from fusedkit import _launch as L
    assert ctypes.sizeof(L._CUlaunchAttribute) == 72 and L._CUlaunchAttribute.value.offset == 8
    assert ctypes.alignment(L._CUlaunchAttribute) == 8
    assert ctypes.sizeof(L._CUlaunchConfig) == 56
    assert (L._CUlaunchConfig.hStream.offset, L._CUlaunchConfig.attrs.offset, L._CUlaunchConfig.numAttrs.offset) == \
        (32, 40, 48)
    assert L._cluster_dims(None) == (1, 1, 1) and L._cluster_dims(4) == (4, 1, 1)
    assert L._cluster_dims((2, 2)) == (2, 2, 1)
    # the value union's members all start at its first byte (policy is an int there)
    V = L._CUlaunchAttributeValue
    assert V.clusterDim.offset == V.policy.offset == 0 and ctypes.sizeof(V) == 64
    assert V.allowed.offset == 0
    assert (L._CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            L._CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
            L._CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) == (4, 5, 6)  # CUlaunchAttributeID


def test_configs():
    """The row stays on chip for every benchmarked vocab (registers of one block, or a cluster on sm_90),
    within the register budget of its launch bounds; every config of a registered vocab is compiled by
    the compile-all check."""
    from fusedkit.backends import cuda_cross_entropy as ce
    assert ce.fwd_config(32768, 2) == ("staged", 256, 1, 1)
    assert ce.staged_config(131072, 2) == ("staged", 256, 4, 1)  # the rule; tuned: persistent
    assert ce.fwd_config(131072, 2) == ("persistent", 8, 8, 32, 2)
    assert ce.staged_config(262144, 2) == ("staged", 256, 8, 1)  # the rule; tuned: 16 CTAs, two buffers
    assert ce.fwd_config(262144, 2) == ("staged", 256, 16, 2)
    assert ce.fwd_config(262144, 4) == ("staged", 256, 16, 1)
    assert ce.staged_chunk_bytes(("staged", 256, 4, 1), 50264, 2) == 1571 * 16  # 6283 vectors over 4 CTAs
    assert ce.fwd_config(32768, 2, max_vec=4) == ("rows", 4, 8, 16, 2)  # a view off 16 bytes: registers
    assert ce.fwd_config(50257, 2)[0] == "rows"  # rows not made of 16-byte vectors: registers
    assert ce.fwd_config(8192, 2) == ("rows", 8, 2, 16, 1)  # below STAGED_MIN_BYTES
    assert ce.fwd_config(262144, 2, cluster=False)[0] == "looped"
    assert ce.fwd_config(7, 2) == ("rows", 1, 1, 1, 1)
    exprs = set(ce.all_expressions()[ce.FILE])
    for N in range(1, 300000, 997):
        for s in (2, 4):
            for cluster in (True, False):
                cfg = ce.fwd_config(N, s, cluster)
                if cfg[0] == "rows":
                    _, vec, items, warps, c = cfg
                    assert N % vec == 0 and items * ce.regs_per_item(vec, s) <= 32
                    assert -(-(N // vec) // c) <= items * 32 * warps, (N, s, cfg)
                    assert c == 1 or (cluster and warps == 16)
                elif cfg[0] == "staged":
                    assert cluster and N % (16 // s) == 0 and ce.staged_chunk_bytes(cfg, N, s) <= ce.STAGE_CHUNK_BYTES
    for N in (1, 7, 781, 32768, 131072, 262144):
        for s, dt in ((2, "bfloat16"), (4, "float32")):
            for max_vec in (16, 1):
                assert ce.fwd_expr(ce.fwd_config(N, s, max_vec=max_vec), dt) in exprs
