"""The CPU backend's fused LayerNorm / RMSNorm forward and backward for fp32 rows (Numba, parallel
over rows).

``fusedkit.reference.norms.layer_norm`` / ``rms_norm`` (and their FP8-output forms) route fp32 inputs
without a residual here: a pass per row for each statistic and one for the output, no temporaries,
every core; ``layer_norm_backward`` / ``rms_norm_backward`` of fp32 dy, x and weight likewise. The
NumPy path (``_forward_f32`` / ``_backward`` in norms.py) stays for the other dtypes and residuals, and
is what this is tested against (tests/test_norms.py: within an ulp; the two differ in the last
bit of a row's mean or rstd now and then, so one FP8 code in ~8000 can differ between them).

Numerics: the same fp32 formulas and order as the NumPy path: mean, then var = mean((x - mean)^2) from
the fp32 differences, rstd = 1 / sqrt(var + eps) in fp32, y = ((x - mean) * rstd) * g (+ b). The row
sums accumulate in float64 (NumPy's fp32 pairwise sums are within a few fp32 ulp of them), so a long
row loses nothing to a sequential fp32 sum. NaN / Inf rows give NaN rows, as on the GPU.
"""
from __future__ import annotations

import numba
import numpy as np

# Module-level kernels with cache=True: the first call in a process loads the machine code from Numba's
# cache (the __pycache__ beside this file, or Numba's per-user cache when that is read-only) instead of
# compiling it (about 1.5 s). This module imports Numba, so norms.py imports it at the first fp32 call.


def _njit(**options):
    """numba.njit with its disk cache, or without it where Numba finds no writable cache location
    (it raises RuntimeError when the function is decorated): then each process compiles once."""
    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:
            return numba.njit(cache=False, **options)(fn)
    return decorate


# The row sums may be reassociated (vectorized float64 adds); the output loop may not (its fp32 rounding
# order is the NumPy path's).
@_njit(fastmath={"reassoc"})
def _row_sum(row):
    s = 0.0
    for j in range(row.shape[0]):
        s += row[j]
    return s


@_njit(fastmath={"reassoc"})
def _row_sq_dev(row, mu):
    s = 0.0
    for j in range(row.shape[0]):
        d = row[j] - mu  # fp32 difference, squared in fp32, as the NumPy path
        s += d * d
    return s


@_njit(parallel=True, nogil=True)
def _norm_rows(x, g, b, eps, rms, has_b, y, mean_out, rstd_out):
    M, N = x.shape
    f32 = np.float32
    for i in numba.prange(M):
        row = x[i]
        mu = f32(0.0) if rms else f32(_row_sum(row) / N)
        rstd = f32(1.0) / np.sqrt(f32(_row_sq_dev(row, mu) / N) + eps)
        out = y[i]
        if has_b:
            for j in range(N):
                out[j] = (row[j] - mu) * rstd * g[j] + b[j]
        else:
            for j in range(N):
                out[j] = (row[j] - mu) * rstd * g[j]
        mean_out[i] = mu
        rstd_out[i] = rstd


def forward(x, g, bias, eps, rms):
    """(y, mean, rstd) of fp32 x (any leading dims): as norms._forward_f32 without a residual. g: the
    fp32 gamma row (norms._gamma: weight, + 1 when zero-centred, ones without a weight)."""
    N = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, N)
    f32 = np.float32
    has_b = bias is not None and not rms
    b = np.ascontiguousarray(bias, f32) if has_b else g  # unread without a bias
    M = x2.shape[0]
    y = np.empty((M, N), f32)
    mean = np.empty(M, f32)
    rstd = np.empty(M, f32)
    if M:
        _norm_rows(x2, g, b, f32(eps), rms, has_b, y, mean, rstd)
    lead = x.shape[:-1]
    mean = np.zeros(lead, f32) if rms else mean.reshape(lead)
    return y.reshape(x.shape), mean, rstd.reshape(lead)


# ---------------------------------------------------------------------------------------------------
# Backward: dx = rstd (g dy - xhat c1 - c2) with c1 = mean(g dy xhat), c2 = mean(g dy) (0 for RMSNorm),
# the NumPy path's fp32 formulas (norms._backward); dweight = sum over rows of dy xhat, dbias = sum dy,
# accumulated in float64 per chunk of rows and added over the chunks in a fixed order.

@_njit(fastmath={"reassoc"})
def _row_bwd_sums(dyr, xr, g, mu, rs):
    s1 = 0.0
    s2 = 0.0
    for j in range(xr.shape[0]):
        gd = dyr[j] * g[j]
        s1 += gd * ((xr[j] - mu) * rs)
        s2 += gd
    return s1, s2


@_njit(parallel=True, nogil=True)
def _norm_rows_bwd(dy, x, g, mean, rstd, rms, dx, dw_part, db_part, chunk):
    M, N = x.shape
    f32 = np.float32
    for p in numba.prange(dw_part.shape[0]):
        dwp = dw_part[p]
        dbp = db_part[p]
        for i in range(p * chunk, min(M, (p + 1) * chunk)):
            mu = mean[i]
            rs = rstd[i]
            dyr = dy[i]
            xr = x[i]
            s1, s2 = _row_bwd_sums(dyr, xr, g, mu, rs)
            c1 = f32(s1 / N)
            c2 = f32(0.0) if rms else f32(s2 / N)
            out = dx[i]
            for j in range(N):
                xhat = (xr[j] - mu) * rs
                out[j] = rs * (dyr[j] * g[j] - xhat * c1 - c2)
                dwp[j] += dyr[j] * xhat
                dbp[j] += dyr[j]


def backward(dy, x, weight, g, mean, rstd, rms):
    """(dx, dweight, dbias) of fp32 dy and x (any leading dims): as norms._backward; g as in forward,
    weight only for its presence and dtype."""
    N = x.shape[-1]
    f32 = np.float32
    x2 = np.ascontiguousarray(x).reshape(-1, N)
    dy2 = np.ascontiguousarray(dy).reshape(-1, N)
    M = x2.shape[0]
    mu = np.zeros(M, f32) if rms else np.ascontiguousarray(mean, f32).reshape(-1)
    rs = np.ascontiguousarray(rstd, f32).reshape(-1)
    P = max(1, min(M, 16))  # chunks of rows: fixed (not the thread count), so the sums are the same anywhere
    chunk = -(-M // P) if M else 1
    dx = np.empty((M, N), f32)
    dw_part = np.zeros((P, N), np.float64)
    db_part = np.zeros((P, N), np.float64)
    if M:
        _norm_rows_bwd(dy2, x2, g, mu, rs, rms, dx, dw_part, db_part, chunk)
    wdt = weight.dtype if weight is not None else x.dtype
    dw = None if weight is None else dw_part.sum(axis=0).astype(wdt)
    return dx.reshape(x.shape), dw, db_part.sum(axis=0).astype(wdt)
