"""LayerNorm / RMSNorm on the CPU (NumPy), same signatures as ``fusedkit.layer_norm`` and friends.

Numerics follow cuda/norms.cu: fp32 math, x + residual rounded to x's dtype before the statistics,
exact two-pass mean / variance, rstd = 1 / sqrt(var + eps), g = w + 1 with zero_centered_gamma.
``layer_norm_fp8`` / ``rms_norm_fp8``: the fp32 y cast to FP8 with a delayed scale (reference.fp8).
fp32 rows without a residual run a fused Numba kernel (``_norms_numba.py``: same formulas, float64 row
sums, parallel over rows), the FP8 output of such rows included (its bytes are the cast of that y), and
so does the backward of fp32 dy / x / weight (float64 weight-gradient sums); everything else runs this
NumPy code.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def _gamma(weight, zero_centered_gamma):
    if weight is None:
        return F32(1.0)
    g = weight.astype(F32)
    return g + F32(1.0) if zero_centered_gamma else g


def _forward(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, rms):
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf rows give NaN rows, as on the GPU
        return _forward_f32(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, rms)


def _forward_f32(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, rms):
    out_dtype = x.dtype if out_dtype is None else out_dtype
    xf = x.astype(F32, copy=False)
    h = None
    if residual is not None:
        h = (xf + residual.astype(F32)).astype(x.dtype)
        xf = h.astype(F32)
    if rms:
        mean = np.zeros(x.shape[:-1], F32)
        d = xf
    else:
        mean = xf.mean(axis=-1, dtype=F32)
        d = xf - mean[..., None]
    var = np.mean(d * d, axis=-1, dtype=F32)
    rstd = (F32(1.0) / np.sqrt(var + F32(eps))).astype(F32)
    y = d * rstd[..., None] * _gamma(weight, zero_centered_gamma)
    if bias is not None and not rms:
        y = y + bias.astype(F32)
    return y.astype(out_dtype), h, mean, rstd


def _pack(y, h, stats):
    out = (y,) + ((h,) if h is not None else ()) + stats
    return out[0] if len(out) == 1 else out


def _gamma_row(weight, zero_centered_gamma, N):
    """_gamma as a contiguous fp32 row of N (the fused kernels' g)."""
    return np.ascontiguousarray(np.broadcast_to(_gamma(weight, zero_centered_gamma), (N,)), F32)


def _fused_applies(x, residual, out_dtype) -> bool:
    """fp32 x and output, no residual: the fused Numba kernel (_norms_numba.py) takes the call."""
    return (residual is None and x.dtype == F32 and x.ndim >= 1
            and (out_dtype is None or np.dtype(out_dtype) == F32))


def _forward_any(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, rms):
    """fp32 rows without a residual take the fused Numba kernel, the rest NumPy (_forward)."""
    if _fused_applies(x, residual, out_dtype):
        from . import _norms_numba  # imports Numba: not at `import fusedkit`
        y, mean, rstd = _norms_numba.forward(x, _gamma_row(weight, zero_centered_gamma, x.shape[-1]), bias, eps,
                                             rms)
        return y, None, mean, rstd
    return _forward(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, rms)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, zero_centered_gamma=False, out_dtype=None,
               return_stats=False, residual=None):
    y, h, mean, rstd = _forward_any(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, False)
    return _pack(y, h, (mean, rstd) if return_stats else ())


def rms_norm(x, weight=None, *, eps=1e-6, zero_centered_gamma=False, out_dtype=None,
             return_stats=False, residual=None):
    y, h, _, rstd = _forward_any(x, weight, None, residual, eps, zero_centered_gamma, out_dtype, True)
    return _pack(y, h, (rstd,) if return_stats else ())


def _forward_fp8(x, weight, bias, residual, eps, zero_centered_gamma, fp8_fmt, fp8_scale, return_stats, rms):
    """The fp32 y of the forward above, cast with a delayed scale (reference.fp8.quantize_delayed):
    (FP8Tensor with NumPy bytes, fp32 scalar scale_inv and amax of the fp32 y), then h, then the stats."""
    from ..fp8.formats import as_format
    from ..fp8.tensor import FP8Tensor
    from .fp8 import quantize_delayed
    f = as_format(fp8_fmt)
    y, h, mean, rstd = _forward_any(x, weight, bias, residual, eps, zero_centered_gamma, F32, rms)
    data, scale_inv, amax = quantize_delayed(y, F32(np.asarray(fp8_scale).reshape(())), f)
    stats = ((rstd,) if rms else (mean, rstd)) if return_stats else ()
    return _pack(FP8Tensor(data, scale_inv, f, amax), h, stats)


def layer_norm_fp8(x, weight=None, bias=None, *, eps=1e-5, zero_centered_gamma=False, fp8_fmt="e4m3",
                   fp8_scale=1.0, return_stats=False, residual=None):
    """``layer_norm`` with FP8 output: the fp32 y as ``fusedkit.layer_norm(..., fp8_fmt=, fp8_scale=)``
    returns it (an FP8Tensor; amax of the fp32 y before scaling, scale_inv = 1 / scale)."""
    return _forward_fp8(x, weight, bias, residual, eps, zero_centered_gamma, fp8_fmt, fp8_scale, return_stats,
                        False)


def rms_norm_fp8(x, weight=None, *, eps=1e-6, zero_centered_gamma=False, fp8_fmt="e4m3", fp8_scale=1.0,
                 return_stats=False, residual=None):
    """``rms_norm`` with FP8 output (see ``layer_norm_fp8``)."""
    return _forward_fp8(x, weight, None, residual, eps, zero_centered_gamma, fp8_fmt, fp8_scale, return_stats,
                        True)


def _backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms):
    N = x.shape[-1]
    xf = x.astype(F32).reshape(-1, N)
    g = dy.astype(F32).reshape(-1, N)
    mean = np.zeros(xf.shape[0], F32) if rms else mean.astype(F32).reshape(-1)
    rstd = rstd.astype(F32).reshape(-1)
    xhat = (xf - mean[:, None]) * rstd[:, None]
    gd = g * _gamma(weight, zero_centered_gamma)
    c1 = np.mean(gd * xhat, axis=-1, dtype=F32)[:, None]
    c2 = np.zeros_like(c1) if rms else np.mean(gd, axis=-1, dtype=F32)[:, None]
    dx = (rstd[:, None] * (gd - xhat * c1 - c2)).astype(x.dtype).reshape(x.shape)
    wdt = weight.dtype if weight is not None else x.dtype
    dw = None if weight is None else np.sum(g * xhat, axis=0, dtype=F32).astype(wdt)
    db = np.sum(g, axis=0, dtype=F32).astype(wdt)
    return dx, dw, db


def _backward_any(dy, x, weight, mean, rstd, zero_centered_gamma, rms):
    """fp32 dy, x and weight take the fused Numba kernel (_norms_numba.py), the rest NumPy (_backward)."""
    if dy.dtype == F32 and x.dtype == F32 and (weight is None or weight.dtype == F32) and x.ndim >= 1:
        from . import _norms_numba  # imports Numba: not at `import fusedkit`
        return _norms_numba.backward(dy, x, weight, _gamma_row(weight, zero_centered_gamma, x.shape[-1]), mean,
                                     rstd, rms)
    return _backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms)


def layer_norm_backward(dy, x, weight, mean, rstd, *, zero_centered_gamma=False):
    return _backward_any(dy, x, weight, mean, rstd, zero_centered_gamma, False)


def rms_norm_backward(dy, x, weight, rstd, *, zero_centered_gamma=False):
    dx, dw, _ = _backward_any(dy, x, weight, None, rstd, zero_centered_gamma, True)
    return dx, dw
