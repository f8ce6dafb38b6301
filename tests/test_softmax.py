"""Softmax / log-softmax and their backwards: one body for every backend (NumPy CPU backend and torch CPU
tensors always; CuPy and CUDA torch on a GPU, marked `gpu`).

Every case draws fresh inputs from its own seed, rounded to the storage dtype before the float64
reference (written here, independent of fusedkit.reference) sees them. Softmax values shrink like 1/N,
so results are compared after dividing each row by the row's largest reference magnitude: the dtype
tolerances of tests/_backends.py then mean what they say at every N.
"""
import zlib

import ml_dtypes
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import reference as ref
from fusedkit.backends import cuda_softmax as cs
from _backends import assert_close, backend_params, framework_of, rand, skip_unsupported, to_backend, to_numpy

DTYPES = ["float32", "float16", "bfloat16"]
BACKENDS = backend_params(["numpy", "torch_cpu", "cupy", "torch"])  # JAX GPU arrays: not implemented (docs)
SHAPES = {1: (5, 1), 7: (3, 7), 781: (2, 3, 781), 1024: (67, 1024), 4096: (9, 4096), 65536: (3, 65536),
          262144: (2, 262144)}


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ------------------------------------------------------------------------------------------------
# float64 references

def hidden(shape, mask=None, causal=False):
    h = np.zeros(shape, bool)
    if mask is not None:
        h |= np.broadcast_to(mask, shape)
    if causal:
        sq, sk = shape[-2], shape[-1]
        h |= np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
    return h


def softmax64(x, scale=1.0, hide=None):
    v = x.astype(np.float64) * scale
    if hide is not None:
        v = np.where(hide, -np.inf, v)
    m = v.max(-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(v - m)
    s = e.sum(-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def log_softmax64(x, scale=1.0):
    v = x.astype(np.float64) * scale
    m = v.max(-1, keepdims=True)
    return v - m - np.log(np.exp(v - m).sum(-1, keepdims=True))


def grad64(x, dy, scale, log):
    """d(loss)/dx for loss = sum(dy * f(x * scale)), f = softmax or log_softmax, from the Jacobian for
    short rows (J = diag(p) - p p^T, or I - 1 p^T for log-softmax) and its closed form for long ones."""
    p = softmax64(x, scale)
    g = dy.astype(np.float64)
    N = x.shape[-1]
    if N <= 64:
        pf, gf = p.reshape(-1, N), g.reshape(-1, N)
        out = np.empty_like(pf)
        for r in range(pf.shape[0]):
            J = np.eye(N) - np.outer(np.ones(N), pf[r]) if log else np.diag(pf[r]) - np.outer(pf[r], pf[r])
            out[r] = scale * (J.T @ gf[r])
        return out.reshape(x.shape)
    if log:
        return scale * (g - p * g.sum(-1, keepdims=True))
    return scale * p * (g - (g * p).sum(-1, keepdims=True))


def assert_rows(got, want, dtype, what):
    """Rows compared relative to each row's largest |want| (exact zeros where want's row is all zero)."""
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    den = np.abs(w).max(-1, keepdims=True) if w.size else np.ones(w.shape[:-1] + (1,))
    zero_rows = np.broadcast_to(den == 0, w.shape)
    assert np.all(g[zero_rows] == 0), f"{what}: rows that must be exactly zero are not"
    den = np.where(den > 0, den, 1.0)
    assert_close(g / den, w / den, dtype, what)


# ------------------------------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", list(SHAPES))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_forward(backend, dtype, N, log):
    skip_unsupported(backend, dtype)
    shape = SHAPES[N]
    rng = rng_for("fwd", backend, dtype, N, log)
    x = rand(rng, shape, dtype, scale=3.0)
    scale = 0.7
    X = to_backend(x, backend)
    y = fk.log_softmax(X, scale=scale) if log else fk.softmax(X, scale=scale)
    assert framework_of(y) == framework_of(X)
    assert to_numpy(y).dtype == x.dtype
    if log:
        assert_close(y, log_softmax64(x, scale), dtype, "log_softmax")
        lse = np.log(np.exp(to_numpy(y).astype(np.float64)).sum(-1))
        np.testing.assert_allclose(lse, 0.0, atol=2 * max(1e-5, 10 * float(ml_dtypes.finfo(x.dtype).eps)), err_msg="logsumexp(y)")
    else:
        assert_rows(y, softmax64(x, scale), dtype, "softmax")
        sums = to_numpy(y).astype(np.float64).sum(-1)
        np.testing.assert_allclose(sums, 1.0, atol=max(1e-5, float(ml_dtypes.finfo(x.dtype).eps)), err_msg="rows sum to 1")
    if backend not in ("numpy", "torch_cpu"):  # the GPU kernels against the CPU backend
        want = ref.log_softmax(x, scale=scale) if log else ref.softmax(x, scale=scale)
        (assert_close if log else assert_rows)(y, want.astype(np.float64), dtype, "vs CPU backend")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1e4, -1e4])
@pytest.mark.parametrize("N", [781, 4096, 65536])
def test_large_offsets(backend, dtype, offset, N):
    """Inputs around +-1e4 (after rounding to the dtype): no overflow, no NaN, exact-enough results."""
    skip_unsupported(backend, dtype)
    rng = rng_for("offset", backend, dtype, offset, N)
    x = rand(rng, (3, N), dtype, loc=offset, scale=4.0 if dtype == "float32" else 200.0)
    X = to_backend(x, backend)
    assert_rows(fk.softmax(X), softmax64(x), dtype, "softmax, offset input")
    assert_close(fk.log_softmax(X), log_softmax64(x), dtype, "log_softmax, offset input")


# (grid step, per-row constants) that keep x + c exact in each dtype
SHIFTS = {"bfloat16": (1.0, [-120.0, 0.0, 64.0, 100.0]), "float16": (0.125, [-200.0, 0.0, 100.0, 200.0]),
          "float32": (0.125, [-1e4, 0.0, 5e3, 1e4])}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [7, 1024, 65536])
def test_shift_invariance(backend, dtype, N):
    """softmax(x + c) == softmax(x) for a constant c per row (x on a grid where x + c is exact)."""
    skip_unsupported(backend, dtype)
    step, cs_ = SHIFTS[dtype]
    rng = rng_for("shift", backend, dtype, N)
    k = rng.integers(-6, 7, size=(len(cs_), N))
    x = (k * step).astype(np.float32)
    xs = x + np.asarray(cs_, np.float32)[:, None]
    from fusedkit._dtypes import numpy_dtype
    x, xs = x.astype(numpy_dtype(dtype)), xs.astype(numpy_dtype(dtype))
    assert np.array_equal(xs.astype(np.float64) - x.astype(np.float64), np.broadcast_to(np.asarray(cs_)[:, None], x.shape))
    y0 = to_numpy(fk.softmax(to_backend(x, backend))).astype(np.float64)
    y1 = fk.softmax(to_backend(xs, backend))
    assert_rows(y1, y0, dtype, "softmax(x + c) vs softmax(x)")
    assert_rows(y1, softmax64(x), dtype, "softmax(x + c) vs float64")


# ------------------------------------------------------------------------------------------------
# masks

X_SHAPES = [(2, 3, 5, 64), (2, 3, 4, 37)]
MASK_FORMS = ["full", "b1qk", "11qk", "qk", "b11k", "k", "bhq1", "q1", "1", "b1q1", "h11"]


def mask_shape(form, shape):
    B, H, Q, K = shape
    return {"full": (B, H, Q, K), "b1qk": (B, 1, Q, K), "11qk": (1, 1, Q, K), "qk": (Q, K), "b11k": (B, 1, 1, K),
            "k": (K,), "bhq1": (B, H, Q, 1), "q1": (Q, 1), "1": (1,), "b1q1": (B, 1, Q, 1), "h11": (H, 1, 1)}[form]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", X_SHAPES, ids=str)
@pytest.mark.parametrize("form", MASK_FORMS)
@pytest.mark.parametrize("causal", [False, True], ids=["mask", "mask+causal"])
def test_masks(backend, dtype, shape, form, causal):
    """Every broadcast form of a boolean mask (True = masked out), alone and with causal; rows that end
    up fully masked are exactly zero."""
    skip_unsupported(backend, dtype)
    rng = rng_for("mask", backend, dtype, shape, form, causal)
    x = rand(rng, shape, dtype, scale=2.0)
    ms = mask_shape(form, shape)
    mask = rng.random(ms) < 0.3
    if ms[-1] != 1 and len(ms) >= 2 and ms[-2] > 1:
        mask[..., 1, :] = True        # some rows fully masked
    elif ms[-1] == 1 and mask.size > 1:
        mask.flat[0], mask.flat[-1] = True, False
    scale = 0.125
    y = fk.softmax(to_backend(x, backend), scale=scale, mask=to_backend(mask, backend), causal=causal)
    h = hidden(shape, mask, causal)
    want = softmax64(x, scale, h)
    assert not np.isnan(to_numpy(y).astype(np.float64)).any(), "NaN in a masked softmax"
    assert_rows(y, want, dtype, f"mask {ms}{' + causal' if causal else ''}")
    yn = to_numpy(y).astype(np.float64)
    assert np.all(yn[np.broadcast_to(h, shape)] == 0), "masked positions must be exactly 0"
    full = np.broadcast_to(h.all(-1), shape[:-1])
    assert np.all(yn[full] == 0), "fully masked rows must be zero"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 16, 16), (2, 5, 12), (3, 7, 4), (2, 33, 1024), (1, 3, 65536)], ids=str)
def test_causal(backend, dtype, shape):
    """Square and rectangular (bottom-right aligned): row i sees columns j <= i + Sk - Sq; with Sq > Sk
    the first Sq - Sk rows see nothing and are zero."""
    skip_unsupported(backend, dtype)
    rng = rng_for("causal", backend, dtype, shape)
    x = rand(rng, shape, dtype, scale=2.0)
    y = fk.softmax(to_backend(x, backend), causal=True, scale=0.5)
    h = hidden(shape, None, True)
    want = softmax64(x, 0.5, h)
    assert_rows(y, want, dtype, "causal softmax")
    yn = to_numpy(y).astype(np.float64)
    assert np.all(yn[np.broadcast_to(h, shape)] == 0)
    sq, sk = shape[-2], shape[-1]
    if sq > sk:
        assert np.all(yn[..., : sq - sk, :] == 0), "rows above the first visible one must be zero"
        assert np.allclose(yn[..., sq - sk:, :].sum(-1), 1.0, atol=2e-2)
    else:
        np.testing.assert_allclose(yn.sum(-1), 1.0, atol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("N", [7, 4096, 65536])
def test_fully_masked_and_neg_inf_rows_are_zero(backend, N):
    skip_unsupported(backend, "float32")
    rng = rng_for("allmasked", backend, N)
    x = rand(rng, (4, N), "float32")
    x[2] = -np.inf
    mask = np.zeros((4, N), bool)
    mask[1] = True
    y = to_numpy(fk.softmax(to_backend(x, backend), mask=to_backend(mask, backend)))
    assert not np.isnan(y).any()
    assert np.all(y[1] == 0) and np.all(y[2] == 0)
    assert_rows(y[[0, 3]], softmax64(x[[0, 3]]), "float32", "unmasked rows")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("N", [1024, 65536, 262144])
def test_nan_stays_in_its_row(backend, dtype, N):
    # one NaN, one +inf, and a run of NaN that fills whole threads' parts of the row (their keys are NaN
    # in the packed 16-bit max): each makes its own row NaN and no other, in every row-merge shape
    skip_unsupported(backend, dtype)
    x = rand(rng_for("nan", backend, N), (5, N), "float32")
    x[1, 5] = np.nan
    x[2, N - 9] = np.inf
    x[3, : N // 2] = np.nan
    xb = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
    y = to_numpy(fk.softmax(to_backend(xb, backend))).astype(np.float32)
    assert np.isnan(y[1:4]).all()
    assert_rows(y[[0, 4]], softmax64(xb[[0, 4]].astype(np.float64)), dtype, "finite rows")


# ------------------------------------------------------------------------------------------------
# backward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", list(SHAPES))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward(backend, dtype, N, log):
    """dx from the forward's y against the float64 gradient of the exact softmax at x."""
    skip_unsupported(backend, dtype)
    shape = SHAPES[N]
    rng = rng_for("bwd", backend, dtype, N, log)
    x = rand(rng, shape, dtype, scale=2.0)
    dy = rand(rng, shape, dtype)
    scale = 0.5
    X, DY = to_backend(x, backend), to_backend(dy, backend)
    if log:
        dx = fk.log_softmax_backward(DY, fk.log_softmax(X, scale=scale), scale=scale)
    else:
        dx = fk.softmax_backward(DY, fk.softmax(X, scale=scale), scale=scale)
    assert to_numpy(dx).dtype == dy.dtype
    assert_rows(dx, grad64(x, dy, scale, log), dtype, "dx")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_of_masked_rows_is_zero(backend, dtype):
    skip_unsupported(backend, dtype)
    rng = rng_for("bwdmask", backend, dtype)
    shape = (2, 4, 6, 40)
    x, dy = rand(rng, shape, dtype), rand(rng, shape, dtype)
    mask = rng.random((2, 1, 6, 40)) < 0.4
    mask[:, :, 2] = True
    y = fk.softmax(to_backend(x, backend), mask=to_backend(mask, backend), causal=True)
    dx = to_numpy(fk.softmax_backward(to_backend(dy, backend), y)).astype(np.float64)
    h = hidden(shape, mask, True)
    assert np.all(dx[np.broadcast_to(h, shape)] == 0)
    p = softmax64(x, 1.0, h)
    g = dy.astype(np.float64)
    assert_rows(dx, p * (g - (g * p).sum(-1, keepdims=True)), dtype, "masked dx")


# ------------------------------------------------------------------------------------------------
# edge cases and options

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 16), (3, 0)], ids=str)
def test_empty(backend, shape):
    skip_unsupported(backend, "float16")
    x = to_backend(np.zeros(shape, np.float16), backend)
    for y in (fk.softmax(x), fk.log_softmax(x), fk.softmax(x, causal=len(shape) > 1),
              fk.softmax_backward(x, x), fk.log_softmax_backward(x, x)):
        assert tuple(y.shape) == shape and to_numpy(y).dtype == np.float16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_out_dtype_float32(backend, dtype):
    skip_unsupported(backend, dtype)
    x = rand(rng_for("odt", backend, dtype), (5, 781), dtype, scale=3.0)
    y = fk.softmax(to_backend(x, backend), out_dtype="float32")
    assert to_numpy(y).dtype == np.float32
    assert_rows(y, softmax64(x), "float32", "fp32 output of 16-bit input")
    y = fk.log_softmax(to_backend(x, backend), out_dtype="float32")
    assert_close(y, log_softmax64(x), "float32", "fp32 log_softmax output")


@pytest.mark.parametrize("backend", BACKENDS)
def test_axis_rules(backend):
    skip_unsupported(backend, "float32")
    x = rand(rng_for("axis", backend), (4, 8), "float32")
    X = to_backend(x, backend)
    assert_rows(fk.softmax(X, axis=1), softmax64(x), "float32", "axis=1 is the last axis")
    with pytest.raises(ValueError, match="last axis"):
        fk.softmax(X, axis=0)
    with pytest.raises(ValueError, match="out of range"):
        fk.softmax(X, axis=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs(backend):
    skip_unsupported(backend, "float32")
    rng = rng_for("bad", backend)
    x = to_backend(rand(rng, (2, 3, 8), "float32"), backend)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        fk.softmax(to_backend(np.zeros((4, 8), np.int32), backend))
    with pytest.raises(TypeError, match="boolean"):
        fk.softmax(x, mask=to_backend(np.zeros((3, 8), np.float32), backend))
    with pytest.raises(ValueError, match="does not broadcast"):
        fk.softmax(x, mask=to_backend(np.zeros((4, 8), bool), backend))
    with pytest.raises(ValueError, match="does not broadcast"):
        fk.softmax(x, mask=to_backend(np.zeros((5, 2, 3, 8), bool), backend))
    with pytest.raises(ValueError, match="causal"):
        fk.softmax(to_backend(np.zeros(8, np.float32), backend), causal=True)
    with pytest.raises(ValueError, match="at least one dimension"):
        fk.softmax(to_backend(np.zeros((1,), np.float32), backend).reshape(()))
    with pytest.raises(ValueError, match="dy"):
        fk.softmax_backward(to_backend(np.zeros((2, 3, 7), np.float32), backend), x)
    with pytest.raises(ValueError, match="dy"):
        fk.log_softmax_backward(to_backend(np.zeros((2, 3, 8), np.float16), backend), x)
    with pytest.raises(TypeError):
        fk.softmax(x, out_dtype="int8")
    if backend != "numpy":
        with pytest.raises(TypeError, match="numpy|host"):
            fk.softmax(x, mask=np.zeros((3, 8), bool))
        with pytest.raises(TypeError, match="numpy|host"):
            fk.softmax_backward(np.zeros((2, 3, 8), np.float32), x)


def test_unknown_input_type():
    with pytest.raises(TypeError, match="expects an array"):
        fk.softmax([1.0, 2.0])


# ------------------------------------------------------------------------------------------------
# the kernels' mask addressing, checked on the CPU

@pytest.mark.parametrize("x_shape, m_shape", [
    ((2, 3, 5, 8), (2, 3, 5, 8)), ((2, 3, 5, 8), (2, 1, 5, 8)), ((2, 3, 5, 8), (1, 3, 1, 8)),
    ((2, 3, 5, 8), (5, 8)), ((2, 3, 5, 8), (2, 1, 1, 8)), ((2, 3, 5, 8), (8,)), ((2, 3, 5, 8), (2, 3, 5, 1)),
    ((2, 3, 5, 8), (3, 1, 1)), ((2, 3, 5, 8), (1,)), ((4, 2, 3, 5, 8), (4, 1, 3, 1, 8)),
    ((2, 1, 3, 5, 8), (2, 1, 1, 5, 8)), ((7, 8), (7, 1)), ((3, 2, 3, 2, 3, 8), (3, 1, 3, 1, 1, 8)),
])
def test_mask_layout_matches_broadcasting(x_shape, m_shape):
    layout = cs.mask_layout(x_shape, m_shape)
    n = int(np.prod(m_shape))
    ids = np.arange(n).reshape(m_shape)
    full = np.broadcast_to(ids, x_shape).reshape(-1, x_shape[-1])
    mcol = layout[-1]
    for row in range(full.shape[0]):
        off = cs.mask_offset(row, layout)
        got = ids.reshape(-1)[off:off + x_shape[-1]] if mcol else np.full(x_shape[-1], ids.reshape(-1)[off])
        np.testing.assert_array_equal(got, full[row], err_msg=f"row {row}")


def test_mask_layout_too_many_alternations():
    with pytest.raises(ValueError, match="at most 4"):
        cs.mask_layout((2, 2, 2, 2, 2, 2, 2, 8), (2, 1, 2, 1, 2, 1, 2, 8))


def device_fast_div(n, packed):
    """FastDiv::div of cuda/common/fastdiv.cuh on uint64 NumPy arrays, step by step: umulhi, a 33-bit
    sum, and the low word of a funnel shift right by min(l, 32)."""
    n = np.asarray(n, np.uint64)
    m, l = np.uint64(packed & 0xFFFFFFFF), np.uint64(packed >> 32)
    hi = (n * m) >> np.uint64(32)          # n, m < 2**32: the product fits 64 bits
    t = hi + n                             # < 2**33
    return (t >> np.minimum(l, np.uint64(32))) & np.uint64(0xFFFFFFFF)


def test_fast_div_is_exact():
    """The host multipliers (cs.fast_div) reproduce n // d exactly through the device formula, for random
    and edge-case divisors and dividends below 2**31 (and the rest of the 32-bit range, which the kernels
    also rely on), and the parameter fits the launcher's signed 64-bit code."""
    rng = rng_for("fast_div")
    top = 2**31 - 1
    ds = [1, 2, 3, 5, 6, 7, 10, 12, 16, 24, 25, 100, 641, 1000, 1023, 1024, 1025, 4096, 6700417, 2**16 - 1,
          2**16 + 1, 2**30 - 1, 2**30 + 1, top - 1, top, 2**31, 2**31 + 1, 2**32 - 1]
    ds += [2**k for k in range(32)] + [2**k + 1 for k in range(1, 32)] + [2**k - 1 for k in range(2, 33)]
    ds += rng.integers(1, 2**31, 400).tolist() + rng.integers(1, 1 << 16, 200).tolist()
    ds += rng.integers(2**31, 2**32, 50).tolist()
    for d in sorted(set(int(v) for v in ds)):
        p = cs.fast_div(d)
        assert 0 <= p < 2**63 and (p & 0xFFFFFFFF) > 0 and (p >> 32) <= 32, (d, p)
        lim = top + 1 if d <= top else 2**32
        ns = [0, 1, 2, d - 1, d, d + 1, 2 * d - 1, 2 * d, 3 * d - 1, top, top - 1, 2**31, 2**32 - 1]
        ns += [(top // d) * d + e for e in (-1, 0, 1)] + [((2**32 - 1) // d) * d + e for e in (-1, 0, 1)]
        ns += rng.integers(0, lim, 200).tolist() + rng.integers(0, min(lim, 64 * d), 50).tolist()
        n = np.array(sorted(set(v for v in ns if 0 <= v < 2**32)), np.uint64)
        got = device_fast_div(n, p)
        want = n // np.uint64(d)
        bad = np.nonzero(got != want)[0]
        assert bad.size == 0, f"d={d}: n={n[bad[:5]]} gives {got[bad[:5]]}, want {want[bad[:5]]}"
    # d >= 2**32 (possible only for launches of >= 2**32 rows): quotient 0 for every 32-bit n
    for d in (2**32, 2**32 + 1, 3 * 2**40):
        assert np.all(device_fast_div(np.array([0, 1, 2**31, 2**32 - 1], np.uint64), cs.fast_div(d)) == 0)
    with pytest.raises(ValueError):
        cs.fast_div(0)


@pytest.mark.parametrize("x_shape, m_shape", [((2, 3, 5, 8), (2, 1, 5, 8)), ((4, 2, 3, 5, 8), (4, 1, 3, 1, 8)),
                                              ((3, 2, 3, 2, 3, 8), (3, 1, 3, 1, 1, 8)), ((6, 7, 8), (7, 1))])
def test_mask_offset_through_fast_div(x_shape, m_shape):
    """row_mask's offsets (cuda/softmax.cu) computed as the kernels do, by FastDiv and the wrap-around
    32-bit remainder n - q * d, equal mask_offset's."""
    layout = cs.mask_layout(x_shape, m_shape)
    n1, n2, n3, s0, s1, s2, s3, _ = layout
    rows = int(np.prod(x_shape[:-1]))
    for row in range(rows):
        off, r = 0, row
        for n, s in ((n3, s3), (n2, s2), (n1, s1)):
            if n > 1:
                q = int(device_fast_div(r, cs.fast_div(n)))
                off += ((r - q * n) & 0xFFFFFFFF) * s
                r = q
        assert off + r * s0 == cs.mask_offset(row, layout), row


def test_configs():
    """Every config covers its row, with the 64-element (mask-bit) cap per thread."""
    for itemsize in (2, 4):
        for N in (1, 7, 781, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 65537, 1 << 20):
            for clusters in (True, False):
                for cfg in (cs.fwd_config(N, itemsize, clusters), cs.bwd_config(N, itemsize, clusters),
                            cs.fwd_config(N, itemsize, clusters, masked=True),
                            cs.fwd_config(N, itemsize, clusters, staged=True)):
                    if cfg[0] == "looped":
                        continue
                    vec, items, warps = cfg[1:4]
                    c = cfg[4] if cfg[0] in ("cluster", "staged") else 1
                    assert c == 1 or clusters
                    assert N % vec == 0 and items * vec <= 64
                    assert c * 32 * warps * items * vec >= N, (N, cfg)
    assert cs.fwd_config(262144, 2)[0] == "cluster" and cs.fwd_config(65536, 4)[0] == "cluster"
    assert cs.bwd_config(262144, 2)[0] == "cluster"
    assert cs.fwd_config(262144, 2, clusters=False)[0] == "looped"  # the tuned cluster of 16 needs clusters
    assert cs.fwd_config(1024, 2, masked=True) == ("rows", 8, 4, 1) != cs.fwd_config(1024, 2)
    assert cs.fwd_config(262144, 2, staged=True, masked=True)[0] == "cluster"  # the staged kernel has no masks
    assert cs.fwd_config(262144, 2, staged=True)[0] == "staged"
    assert cs.fwd_config(262144, 2, staged=True, max_vec=4)[0] == "cluster"  # bulk copies need 16-byte vectors
    assert cs.fwd_config(262144, 2, clusters=False, staged=True)[0] == "looped"  # and sm_90
    assert cs.bwd_config(262144, 2, staged=True) == ("staged", 8, 4, 16, 16)  # TUNED_STAGED_BWD
    for N, cands in cs.STAGED_BWD_CANDIDATES.items():
        for cfg in cands:
            vec, items, warps, c = cfg[1:5]
            assert cfg[0] == "staged" and c * 32 * warps * items * vec >= N and items <= 8
            assert cs.staged_smem(cfg, N, 2) <= 200 * 1024


def test_staged_backward_rule(monkeypatch):
    """A TUNED_STAGED_BWD entry is taken only where the staged kernel can run (clusters, 16-byte vectors)."""
    monkeypatch.setitem(cs.TUNED_STAGED_BWD, (262144, 2), (4, 32, 8))
    assert cs.bwd_config(262144, 2, staged=True) == ("staged", 8, 4, 32, 8)
    assert cs.bwd_config(262144, 2) == ("cluster", 8, 4, 32, 8)  # callers that cannot stage
    assert cs.bwd_config(262144, 2, staged=True, max_vec=4)[0] != "staged"  # bulk copies need 16-byte vectors
    assert cs.bwd_config(262144, 2, clusters=False, staged=True)[0] == "looped"
    assert cs.bwd_expr(("staged", 8, 4, 32, 8), "bfloat16", False) == "fk::softmax_bwd_staged<fk::bf16, 8, 4, 32, 8, false>"
    assert cs.staged_smem(("staged", 8, 4, 32, 8), 262144, 2) == 2 * 4096 * 16


def test_forced_config_must_hold_the_row():
    """A forced launch config that leaves part of the row out is refused before anything launches."""
    with pytest.raises(ValueError, match="does not hold rows of 8192"):
        cs.forward(0, 0, 0, 4, 8192, "bfloat16", "bfloat16", 1.0, False, cs.MASK_NONE, cs.NO_MASK, 0, 0,
                   config=("rows", 8, 1, 8))
    with pytest.raises(ValueError, match="does not hold rows of 262144"):
        cs.backward(0, 0, 0, 4, 262144, "bfloat16", 1.0, False, 0, 0, config=("staged", 8, 4, 16, 8))
    with pytest.raises(ValueError, match="does not hold rows of 1001"):
        cs.forward(0, 0, 0, 4, 1001, "float32", "float32", 1.0, False, cs.MASK_NONE, cs.NO_MASK, 0, 0,
                   config=("cluster", 4, 8, 16, 2))  # 1001 is not whole vectors of 4
    cs.check_covers("softmax_fwd", ("looped", 8), 10**6)
    cs.check_covers("softmax_bwd", ("staged", 8, 4, 16, 16), 262144)


def test_staged_ring_config():
    """The staged kinds' optional ring depth (a sixth field): in the kernel's name only when it is not 1,
    times the shared memory, 1 to 4; the compile-all check builds the forward's candidates."""
    cfg = ("staged", 8, 4, 16, 16, 2)
    assert (cs.fwd_expr(cfg, "bfloat16", "bfloat16", False, cs.MASK_NONE)
            == "fk::softmax_fwd_staged<fk::bf16, fk::bf16, 8, 4, 16, 16, false, 2>")
    assert (cs.fwd_expr(cfg[:5], "bfloat16", "bfloat16", False, cs.MASK_NONE)
            == cs.fwd_expr(cfg[:5] + (1,), "bfloat16", "bfloat16", False, cs.MASK_NONE)
            == "fk::softmax_fwd_staged<fk::bf16, fk::bf16, 8, 4, 16, 16, false>")
    assert (cs.bwd_expr(("staged", 8, 4, 16, 16, 3), "bfloat16", True)
            == "fk::softmax_bwd_staged<fk::bf16, 8, 4, 16, 16, true, 3>")
    assert cs._geometry(cfg) == ((512, 1), 1, 16)
    assert cs.staged_smem(cfg, 262144) == 2 * 2048 * 16
    assert cs.staged_smem(("staged", 8, 4, 16, 16, 3), 262144, 2) == 3 * 2 * 2048 * 16
    cs.check_covers("softmax_fwd", cfg, 262144)
    for bad in (("staged", 8, 4, 16, 16, 5), ("staged", 8, 4, 16, 16, 0), ("staged", 8, 4, 16, 16, 2, 2)):
        with pytest.raises(ValueError, match="ring depth of 1 to 4"):
            cs.fwd_expr(bad, "bfloat16", "bfloat16", False, cs.MASK_NONE)
    exprs = set(cs.all_expressions()[cs.FILE])
    for N, cands in cs.STAGED_FWD_CANDIDATES.items():
        for c in cands:
            assert c[0] == "staged" and cs.staged_smem(c, N) <= 200 * 1024
            cs.check_covers("softmax_fwd", c, N)
            assert cs.fwd_expr(c, "bfloat16", "bfloat16", False, cs.MASK_NONE) in exprs


def test_full_rows_flag():
    """The FULL flag (bounds tests compiled out) only where an unmasked row fills its register config
    exactly, and those kernels are among the compile-all check's instantiations."""
    exprs = set(cs.all_expressions()[cs.FILE])
    for N in (1024, 4096, 8192, 16384):
        cfg = cs.fwd_config(N, 2)
        assert cfg[0] == "rows" and cs.full_rows(cfg, N, cs.MASK_NONE)
        e = cs.fwd_expr(cfg, "bfloat16", "bfloat16", False, cs.MASK_NONE, N)
        assert e.endswith(", true>") and e in exprs
    for N in (7, 781):
        cfg = cs.fwd_config(N, 2)
        assert not cs.full_rows(cfg, N, cs.MASK_NONE)
        assert not cs.fwd_expr(cfg, "bfloat16", "bfloat16", False, cs.MASK_NONE, N).endswith(", true>")
    cfg = cs.fwd_config(1024, 2)
    for masking in (cs.MASK_CAUSAL, cs.MASK_TENSOR):
        assert not cs.full_rows(cfg, 1024, masking)
    assert not cs.full_rows(cfg, None, cs.MASK_NONE)
    assert not cs.full_rows(cs.fwd_config(262144, 2), 262144, cs.MASK_NONE)  # cluster kernels: no flag


# ------------------------------------------------------------------------------------------------
# GPU only

@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
def test_non_contiguous_raises(backend):
    skip_unsupported(backend, "float32")
    x = to_backend(np.ones((64, 32), np.float32), backend)
    with pytest.raises(ValueError, match="contiguous"):
        fk.softmax(x.T)
    m = to_backend(np.zeros((32, 64), bool), backend)
    with pytest.raises(ValueError, match="contiguous"):
        fk.softmax(x, mask=m.T)


@pytest.mark.gpu
def test_wrong_device_mask():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 16, device="cuda")
    with pytest.raises(TypeError, match="torch_cpu"):
        fk.softmax(x, mask=torch.zeros(4, 16, dtype=torch.bool))


@pytest.fixture
def forced(monkeypatch):
    """Forces the forward and backward launch configs (then drops the cached launch plans)."""
    def force(fwd_cfg, bwd_cfg):
        monkeypatch.setattr(cs, "fwd_config", lambda *a, **k: fwd_cfg)
        monkeypatch.setattr(cs, "bwd_config", lambda *a, **k: bwd_cfg)
        monkeypatch.setattr(cs, "_fwd_plans", {})
        monkeypatch.setattr(cs, "_bwd_plans", {})
    return force


@pytest.mark.gpu
@pytest.mark.parametrize("N, fwd_cfg, bwd_cfg", [
    (4096, ("looped", 8), ("looped", 8)),
    (4096, ("rows", 8, 1, 16), ("rows", 8, 2, 8)),
    (4096, ("rows", 8, 8, 2), ("rows", 8, 4, 4)),
    (4096, ("cluster", 8, 2, 4, 2), ("cluster", 8, 1, 4, 4)),
    (4096, ("cluster", 8, 1, 2, 8), ("cluster", 8, 1, 4, 8)),
    (1000, ("cluster", 8, 1, 4, 8), ("cluster", 8, 1, 1, 4)),     # chunks of 16 vectors, last CTA partial
    (1000, ("cluster", 8, 1, 1, 16), ("cluster", 8, 1, 1, 16)),   # non-portable 16: chunks of 8, last 5
    (65536, ("cluster", 8, 8, 8, 4), ("cluster", 8, 2, 16, 16)),
    (4104, ("cluster", 8, 4, 4, 4), ("looped", 8)),
    (65536, ("rows", 8, 8, 32), ("cluster", 8, 4, 32, 2)),
], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "mask+causal"])
def test_every_kernel_kind(forced, N, fwd_cfg, bwd_cfg, masked):
    """Each kernel kind (rows, several rows per block, clusters of 2 to 16 with partial chunks, looped)
    against the float64 reference, forward (plain / mask + causal, softmax and log) and backward."""
    torch = pytest.importorskip("torch")
    forced(fwd_cfg, bwd_cfg)
    dtype = "bfloat16"
    rng = rng_for("kinds", N, fwd_cfg, bwd_cfg, masked)
    shape = (2, 3, 5, N)
    x, dy = rand(rng, shape, dtype, scale=2.0), rand(rng, shape, dtype)
    mask = (rng.random((2, 1, 5, N)) < 0.3) if masked else None
    X, DY = to_backend(x, "torch"), to_backend(dy, "torch")
    y = fk.softmax(X, mask=to_backend(mask, "torch"), causal=masked, scale=0.5)
    h = hidden(shape, mask, masked) if masked else None
    assert_rows(y, softmax64(x, 0.5, h), dtype, "y")
    dx = fk.softmax_backward(DY, y, scale=0.5)
    p, g = softmax64(x, 0.5, h), dy.astype(np.float64)
    assert_rows(dx, 0.5 * p * (g - (g * p).sum(-1, keepdims=True)), dtype, "dx")
    if not masked:
        assert_close(fk.log_softmax(X), log_softmax64(x), dtype, "log_softmax")
        dxl = fk.log_softmax_backward(DY, fk.log_softmax(X))
        assert_rows(dxl, grad64(x, dy, 1.0, True), dtype, "log dx")
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("N, cfg, max_grid", [
    (65536, ("staged", 8, 8, 32, 1), None),      # one CTA per row, rows walked by the resident grid
    (65536, ("staged", 8, 8, 32, 1), 2),         # two CTAs walk 3 rows each
    (65544, ("staged", 8, 8, 32, 2), 2),         # cluster of 2, last chunk partial, 3 rows per cluster
    (4104, ("staged", 8, 2, 4, 4), 4),           # chunks of 129 vectors (last 126)
    (800, ("staged", 8, 1, 1, 16), 1),           # non-portable cluster of 16; the last CTA holds nothing
    (65544, ("staged", 8, 8, 32, 2, 2), 2),      # a ring of 2: 3 rows per cluster, the ring wraps
    (4104, ("staged", 8, 2, 4, 4, 3), 1),        # a ring of 3, one cluster walks all 6 rows
    (800, ("staged", 8, 1, 1, 16, 4), 1),        # a ring of 4 with an empty chunk in the last CTA
    (4104, ("staged", 8, 2, 4, 4, 4), None),     # a ring deeper than the rows a cluster walks
    (262144, ("staged", 8, 4, 16, 16, 2), None), # a sweep candidate
], ids=str)
def test_staged_forward(monkeypatch, N, cfg, max_grid):
    """The persistent staged forward (bulk copies of the next rows' chunks per CTA, a ring of 1 to 4
    buffers) against the float64 reference: softmax with a scale, log-softmax, fp32 output; grids that
    make each CTA walk rows. A ring gives the bits of one buffer (the same sums; only the loads move)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cs, "fwd_config", lambda *a, **k: cfg)
    monkeypatch.setattr(cs, "_fwd_plans", {})
    monkeypatch.setattr(cs, "STAGED_MAX_GRID", max_grid)
    rng = rng_for("staged", N, cfg, max_grid)
    x = rand(rng, (2, 3, N), "bfloat16", scale=2.0)
    x[0, 1, :5] += 1e4  # an offset row
    X = to_backend(x, "torch")
    assert_rows(fk.softmax(X, scale=0.5), softmax64(x, 0.5), "bfloat16", "y")
    assert_close(fk.log_softmax(X), log_softmax64(x), "bfloat16", "log_softmax")
    assert_rows(fk.softmax(X, out_dtype="float32"), softmax64(x, 1.0), "float32", "y fp32")
    assert all(plan.cap is not None for plan in cs._fwd_plans.values())  # the staged kernel ran
    if len(cfg) > 5:
        y = fk.softmax(X, scale=0.5)
        monkeypatch.setattr(cs, "fwd_config", lambda *a, **k: cfg[:5])
        monkeypatch.setattr(cs, "_fwd_plans", {})
        assert torch.equal(y.view(torch.int16), fk.softmax(X, scale=0.5).view(torch.int16)), \
            "a ring of buffers changed the bits"
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("N, cfg, max_grid", [
    (262144, ("staged", 8, 4, 32, 8), None),     # the first sweep candidate: clusters of 8 x 1024 threads
    (262144, ("staged", 8, 8, 16, 8), 1),        # one cluster walks all 6 rows; 8 vectors of y and dy a thread
    (65544, ("staged", 8, 4, 32, 4), 2),         # cluster of 4, last chunk partial, 3 rows per cluster
    (4104, ("staged", 8, 2, 4, 4), 4),           # chunks of 129 vectors (last 126)
    (800, ("staged", 8, 1, 1, 16), 1),           # non-portable cluster of 16; the last CTA holds nothing
    (65544, ("staged", 8, 4, 32, 4, 2), 2),      # a ring of 2 (y and dy per buffer), the ring wraps
    (800, ("staged", 8, 1, 1, 16, 3), 1),        # a ring of 3, one cluster walks all 6 rows
], ids=str)
def test_staged_backward(monkeypatch, N, cfg, max_grid):
    """The persistent staged backward (bulk copies of the next row's y and dy per CTA) against the float64
    reference (softmax with a scale, log-softmax), and bit-equal to the cluster kernel of the same split
    (the same order of every sum)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cs, "STAGED_MAX_GRID", max_grid)
    rng = rng_for("staged_bwd", N, cfg, max_grid)
    x, dy = rand(rng, (2, 3, N), "bfloat16", scale=2.0), rand(rng, (2, 3, N), "bfloat16")
    X, DY = to_backend(x, "torch"), to_backend(dy, "torch")
    for log in (False, True):
        scale = 1.0 if log else 0.5
        y = fk.log_softmax(X) if log else fk.softmax(X, scale=scale)
        backward = fk.log_softmax_backward if log else fk.softmax_backward
        got = {}
        for kind in ("staged", "cluster"):
            forced = cfg if kind == "staged" else ("cluster",) + cfg[1:5]  # a cluster config has five fields
            monkeypatch.setattr(cs, "bwd_config", lambda *a, f=forced, **kw: f)
            monkeypatch.setattr(cs, "_bwd_plans", {})
            got[kind] = backward(DY, y, scale=scale)
            assert [plan.cap is not None for plan in cs._bwd_plans.values()] == [kind == "staged"]
        assert_rows(got["staged"], grad64(x, dy, scale, log), "bfloat16",
                    f"dx log={log}")
        assert torch.equal(got["staged"].view(torch.int16), got["cluster"].view(torch.int16)), \
            f"staged and cluster backward differ (log={log})"
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_cluster_not_resident_falls_back(monkeypatch):
    """A cluster config that cannot be resident (the tuned 16 CTAs at 262144 on a partitioned GPU) gives
    way to the portable rule, then to no clusters: here, none can be resident, so the looped kernels."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cs, "_fwd_plans", {})
    monkeypatch.setattr(cs, "_bwd_plans", {})
    monkeypatch.setattr(cs, "_resident_clusters", lambda *a: 0)
    rng = rng_for("fallback")
    x, dy = rand(rng, (3, 262144), "bfloat16", scale=2.0), rand(rng, (3, 262144), "bfloat16")
    y = fk.softmax(to_backend(x, "torch"))
    assert_rows(y, softmax64(x, 1.0), "bfloat16", "y")
    p, g = softmax64(x, 1.0), dy.astype(np.float64)
    assert_rows(fk.softmax_backward(to_backend(dy, "torch"), y), p * (g - (g * p).sum(-1, keepdims=True)),
                "bfloat16", "dx")
    # one plan each, without clusters (CTAs per row = 1)
    assert [plan.ctas_per_row for plan in cs._fwd_plans.values()] == [1]
    assert [plan.ctas_per_row for plan in cs._bwd_plans.values()] == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_pointers(offset):
    """Contiguous views that start off a 16-byte boundary (x, y, mask) take narrower vectors."""
    torch = pytest.importorskip("torch")
    M, N = 6, 4096
    rng = rng_for("misaligned", offset)
    x = rand(rng, (M * N + offset,), "float16", scale=2.0)
    m = rng.random(M * N + offset) < 0.2
    X = to_backend(x, "torch")[offset:].view(M, N)
    MK = to_backend(m, "torch")[offset:].view(M, N)
    x, m = x[offset:].reshape(M, N), m[offset:].reshape(M, N)
    y = fk.softmax(X, mask=MK)
    assert_rows(y, softmax64(x, 1.0, m), "float16", "y")
    dx = fk.softmax_backward(X, y)
    p, g = softmax64(x, 1.0, m), x.astype(np.float64)
    assert_rows(dx, p * (g - (g * p).sum(-1, keepdims=True)), "float16", "dx")


@pytest.mark.gpu
def test_torch_non_default_stream():
    torch = pytest.importorskip("torch")
    x = rand(rng_for("stream"), (4096, 1024), "bfloat16", scale=2.0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        X = to_backend(x, "torch")
        y = fk.softmax(X)
        z = y.float() * 2
    s.synchronize()
    assert_rows(z / 2, softmax64(x), "bfloat16", "on a side stream")


# ------------------------------------------------------------------------------------------------
# PyTorch autograd adapter (CPU tensors here; CUDA tensors on a GPU)

@pytest.mark.parametrize("backend", backend_params(["torch_cpu", "torch"]))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_torch_autograd(backend, log):
    torch = pytest.importorskip("torch")
    import fusedkit.torch as fkt
    rng = rng_for("autograd", backend, log)
    shape = (2, 3, 6, 40)
    x = to_backend(rand(rng, shape, "float32", scale=2.0), backend).requires_grad_(True)
    dy = to_backend(rand(rng, shape, "float32"), backend)
    xr = x.detach().clone().requires_grad_(True)
    if log:
        y, want = fkt.log_softmax(x, scale=0.5), torch.log_softmax(xr * 0.5, -1)
    else:
        mask = to_backend(rng.random((2, 1, 6, 40)) < 0.3, backend)
        y = fkt.softmax(x, scale=0.5, mask=mask, causal=True)
        hide = mask | torch.ones(6, 40, dtype=torch.bool, device=mask.device).triu(40 - 6 + 1)
        want = torch.softmax((xr * 0.5).masked_fill(hide, float("-inf")), -1)
        want = torch.nan_to_num(want, nan=0.0)
    (y * dy).sum().backward()
    (want * dy).sum().backward()
    assert_close(y.detach(), to_numpy(want.detach()).astype(np.float64), "float32", "y vs torch")
    assert_close(x.grad, to_numpy(xr.grad).astype(np.float64), "float32", "dx vs torch autograd")
