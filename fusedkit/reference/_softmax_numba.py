"""The CPU backend's fused softmax / log-softmax (forward and backward) and cross-entropy (loss, lse and
gradient) for fp32 rows (Numba, parallel over rows).

``fusedkit.reference.softmax`` / ``cross_entropy`` route fp32 inputs here (softmax: the last axis, no mask
and no causal; the rest stays on the NumPy path, which is what this is tested against:
tests/test_softmax_numba.py). Each row is read once per statistic and once for the output, with no
temporaries the size of the input, on every core; the NumPy path makes float64 copies of the whole
tensor and ~8 passes over them.

Numerics: the NumPy path's, element by element in float64: v = x * scale, m = the row max (NaN if the
row holds one, 0 for a row of -inf), s = sum exp(v - m), y = exp(v - m) / s (0 when s = 0) or
(v - m) - log s; one rounding to fp32 at the store. The row sums add in a different order than NumPy's
pairwise sums, the exponential is this module's own (``_exp_into``: within 2 float64 ulp of np.exp, and
0 where np.exp is below 1e-307) and LLVM's log may differ from NumPy's in the last float64 bit, so an
fp32 result can differ from the NumPy path's by one ulp now and then.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ._norms_numba import _njit


@_njit(fastmath={"reassoc"})
def _row_max(row, scale):
    """max(row * scale) in float64, NaN if the row holds a NaN (np.max's rule)."""
    m = -np.inf
    nan = False
    for j in range(row.shape[0]):
        v = np.float64(row[j]) * scale
        if v != v:
            nan = True
        elif v > m:
            m = v
    return np.nan if nan else m


# exp without a libm call per element, so that LLVM vectorizes the row loops (np.exp in a Numba loop is
# one scalar call per element; with it the fp32 softmax rows ran at 0.65x NumPy's SIMD fp32 exp, with
# this 4x faster exponentials on a 2-core AVX2 machine). k = round(d / ln 2) by the 1.5 x 2^52 shift (k
# lands in the low mantissa bits of t = d log2 e + 1.5 x 2^52), r = d - k ln 2 in two parts (Cody and
# Waite; |r| <= ln 2 / 2), exp(r) by its Taylor polynomial to r^13 (truncation below 1e-17), times 2^(k-1)
# built from k's bits, times 2. Relative error against np.exp at most ~2.2e-16 (1 ulp) on [-707, 709.7]
# (tests/test_softmax_numba.py). Outside: exp(d < -707) = 0 (np.exp gives < 1e-307 there), d > 709.78
# gives +inf, NaN stays NaN. No "reassoc": it would fold (t + 1.5 x 2^52) - 1.5 x 2^52 into t.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01   # ln 2 with its low 32 bits zero: k * _LN2_HI is exact for |k| < 2^20
_LN2_LO = 1.90821492927058770002e-10   # ln 2 - _LN2_HI
_SHIFTER = 6755399441055744.0          # 1.5 x 2^52
_SHIFTER_BITS = int(np.float64(_SHIFTER).view(np.int64))
_EXP_LO, _EXP_HI = -707.0, 709.7827128933840  # 2^(k-1) stays a normal number; ln(max float64)
_INV_FACT = tuple(1.0 / math.factorial(i) for i in range(14))


@_njit(fastmath={"contract"})
def _exp_into(x, scale, shift, e):
    """e[j] = exp(x[j] * scale - shift) in float64 for every j of x (e: float64, at least as long)."""
    n = x.shape[0]
    eb = e.view(np.int64)
    for j in range(n):  # t: k in its low bits
        d = np.float64(x[j]) * scale - shift
        d = d if not d < _EXP_LO else _EXP_LO
        d = d if not d > _EXP_HI else _EXP_HI
        e[j] = d * _LOG2E + _SHIFTER
    c = _INV_FACT
    for j in range(n):  # d again (a multiply and two selects: cheaper than a second float64 buffer)
        t = e[j]
        kb = eb[j] - _SHIFTER_BITS
        k = t - _SHIFTER
        d = np.float64(x[j]) * scale - shift
        under = d < _EXP_LO
        over = d > _EXP_HI
        d = d if not under else _EXP_LO
        d = d if not over else _EXP_HI
        r = d - k * _LN2_HI
        r = r - k * _LN2_LO
        p = c[13]
        for i in range(12, -1, -1):  # Horner; a constant trip count, unrolled by LLVM
            p = p * r + c[i]
        eb[j] = (kb + 1022) << 52  # 2^(k-1): k = 1024 (d near ln(max float64)) stays finite
        v = p * e[j] * 2.0
        v = v if not under else 0.0
        e[j] = v if not over else np.inf


@_njit(fastmath={"reassoc"})
def _sum64(e, n):
    s = 0.0
    for j in range(n):
        s += e[j]
    return s


@_njit()
def _row_sum_exp(row, scale, m):
    """sum exp(row * scale - m) in float64."""
    e = np.empty(row.shape[0], np.float64)
    _exp_into(row, scale, m, e)
    return _sum64(e, row.shape[0])


@_njit()
def _row_exp(row, scale, m, e):
    """e[j] = exp(row[j] * scale - m) in float64 -> their sum (one exp per element: the output reuses e)."""
    _exp_into(row, scale, m, e)
    return _sum64(e, row.shape[0])


@_njit(parallel=True, nogil=True)
def _softmax_rows(x, scale, log, y):
    M, N = x.shape
    for i in numba.prange(M):
        row = x[i]
        out = y[i]
        m = _row_max(row, scale)
        if m == -np.inf:  # a row of -inf: softmax 0 (s = 0 below), log-softmax NaN, as the NumPy path
            m = 0.0
        if log:
            ls = np.log(_row_sum_exp(row, scale, m))
            for j in range(N):
                out[j] = (np.float64(row[j]) * scale - m) - ls
        else:
            e = np.empty(N, np.float64)  # the row's exponentials (a thread's scratch, N x 8 bytes)
            s = _row_exp(row, scale, m, e)
            inv = 0.0 if s == 0.0 else 1.0 / s
            for j in range(N):
                out[j] = e[j] * inv


def softmax(x, scale, log):
    """softmax (or log-softmax) of fp32 x over the last axis (any leading dims) -> fp32, x's shape."""
    N = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, N)
    y = np.empty(x2.shape, np.float32)
    if x2.size:
        _softmax_rows(x2, np.float64(scale), bool(log), y)
    return y.reshape(x.shape)


@_njit(parallel=True, nogil=True)
def _softmax_bwd_rows(dy, y, scale, log, dx):
    M, N = y.shape
    for i in numba.prange(M):
        g = dy[i]
        yr = y[i]
        out = dx[i]
        acc = 0.0
        if log:
            for j in range(N):
                acc += np.float64(g[j])
            e = np.empty(N, np.float64)
            _exp_into(yr, 1.0, 0.0, e)
            for j in range(N):
                out[j] = scale * (np.float64(g[j]) - e[j] * acc)
        else:
            for j in range(N):
                acc += np.float64(g[j]) * np.float64(yr[j])
            for j in range(N):
                out[j] = scale * np.float64(yr[j]) * (np.float64(g[j]) - acc)


def softmax_backward(dy, y, scale, log):
    """dx of softmax (``log``: of log-softmax) from fp32 dy and y over the last axis -> fp32."""
    N = y.shape[-1]
    y2 = np.ascontiguousarray(y).reshape(-1, N)
    dy2 = np.ascontiguousarray(dy).reshape(-1, N)
    dx = np.empty(y2.shape, np.float32)
    if y2.size:
        _softmax_bwd_rows(dy2, y2, np.float64(scale), bool(log), dx)
    return dx.reshape(y.shape)


# ---------------------------------------------------------------------------------------------------
# Cross-entropy: per token lse = m + log sum exp(x - m) (m the row max, NaN rule as np.max), loss =
# (1 - e)(lse - x_t) + e (lse - mean x) + z lse^2 (e the label smoothing, z the z-loss), 0 (and lse 0)
# for ignored tokens; gradient row g (exp(x - lse) (1 + 2 z lse) - e / N), minus g (1 - e) at the
# target, 0 for ignored tokens.

@_njit(fastmath={"reassoc"})
def _row_sum(row):
    s = 0.0
    for j in range(row.shape[0]):
        s += np.float64(row[j])
    return s


@_njit(parallel=True, nogil=True)
def _ce_rows(x, t, valid, smoothing, z_loss, want_loss, g, lse_in, loss, lse, grad):
    M, N = x.shape
    for i in numba.prange(M):
        if not valid[i]:
            loss[i] = 0.0
            lse[i] = 0.0
            if g.shape[0]:
                out = grad[i]
                for j in range(N):
                    out[j] = 0.0
            continue
        row = x[i]
        ex = np.empty(N if g.shape[0] and not lse_in.shape[0] else 0, np.float64)  # exp(x - m), reused
        inv = 0.0
        if lse_in.shape[0]:  # the backward: the forward's lse
            le = lse_in[i]
        else:
            m = _row_max(row, 1.0)  # a row of -inf keeps m = -inf: lse NaN, as the NumPy path
            if ex.shape[0]:
                s = _row_exp(row, 1.0, m, ex)
                inv = 1.0 / s
            else:
                s = _row_sum_exp(row, 1.0, m)
            le = m + np.log(s)
        lse[i] = le
        xt = np.float64(row[t[i]])  # read before the gradient row may overwrite it (in place)
        if want_loss:
            li = le - xt
            if smoothing != 0.0:
                li = (1.0 - smoothing) * li + smoothing * (le - _row_sum(row) / N)
            if z_loss != 0.0:
                li = li + z_loss * le * le
            loss[i] = li
        if g.shape[0]:
            gi = g[i]
            k = 1.0 + 2.0 * z_loss * le
            eps = smoothing / N
            out = grad[i]
            if ex.shape[0]:  # p = exp(x - m) / s (= exp(x - lse) up to the last float64 bit)
                for j in range(N):
                    out[j] = gi * (ex[j] * inv * k - eps)
                out[t[i]] = gi * (ex[t[i]] * inv * k - eps) - gi * (1.0 - smoothing)
            else:  # the backward: p = exp(x - lse), all taken before the row may be overwritten
                p = np.empty(N, np.float64)
                _exp_into(row, 1.0, le, p)
                for j in range(N):
                    out[j] = gi * (p[j] * k - eps)
                out[t[i]] = gi * (p[t[i]] * k - eps) - gi * (1.0 - smoothing)


def cross_entropy_rows(x, t, valid, smoothing, z_loss, want_loss, g, grad_out, lse_in=None):
    """(loss, lse) per token in float64 of fp32 logits x (M, N), int64 targets t (in range where
    ``valid``); with ``g`` (float64 per-token gradient scale) the gradient rows go to ``grad_out``
    (fp32 (M, N), may be x itself: each row is read before it is written). ``lse_in`` (float64 per
    token): the backward's saved lse, used instead of recomputing it."""
    M = x.shape[0]
    loss = np.zeros(M, np.float64)
    lse = np.zeros(M, np.float64)
    gg = np.zeros(0, np.float64) if g is None else np.ascontiguousarray(g, np.float64)
    out = grad_out if g is not None else np.empty((0, x.shape[1]), np.float32)
    li = np.zeros(0, np.float64) if lse_in is None else np.ascontiguousarray(lse_in, np.float64)
    if M:
        _ce_rows(x, np.ascontiguousarray(t, np.int64), np.ascontiguousarray(valid), np.float64(smoothing),
                 np.float64(z_loss), bool(want_loss), gg, li, loss, lse, out)
    return loss, lse
