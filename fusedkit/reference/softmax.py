"""Softmax / log-softmax on the CPU (NumPy, float64 inside), same signatures as ``fusedkit.softmax`` and
friends; results in the input's dtype (or ``out_dtype``).

Semantics shared with cuda/softmax.cu:

* ``v = x * scale``; masked positions (``mask`` True, or above the causal diagonal) become -inf.
* A row whose values are all -inf (fully masked) gives zeros from ``softmax``, never NaN.
* A NaN anywhere in a row makes the whole row NaN; so does +inf.
* ``causal``: row i of an (Sq, Sk) score matrix (the last two dims) sees columns j <= i + Sk - Sq
  (bottom-right aligned, as Transformer Engine and flash-attention for Sq != Sk).
* ``log_softmax`` of a row of -inf is NaN (as in torch).

Unlike the public API, ``axis`` may be any axis here when neither ``mask`` nor ``causal`` is given.

fp32 inputs over the last axis without a mask or causal take the fused Numba rows of
``_softmax_numba.py`` (same float64 formulas, one pass per statistic, every core); ``USE_NUMBA = False``
keeps everything on the NumPy path (the tests compare the two).
"""
from __future__ import annotations

import numpy as np

F64 = np.float64
F32 = np.float32
USE_NUMBA = True


def _fused(x, axis=-1, mask=None, causal=False, out_dtype=None) -> bool:
    return (USE_NUMBA and x.dtype == F32 and x.ndim >= 1 and axis in (-1, x.ndim - 1) and mask is None
            and not causal and (out_dtype is None or np.dtype(out_dtype) == F32))


def _causal_mask(sq: int, sk: int) -> np.ndarray:
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return j > i + (sk - sq)


def _masked_values(x, axis, scale, mask, causal):
    v = x.astype(F64) * F64(scale)
    if mask is None and not causal:
        return v, axis
    if axis not in (-1, x.ndim - 1):
        raise ValueError("fusedkit.reference: mask and causal apply to the last axis only")
    hide = np.zeros(x.shape, bool)
    if mask is not None:
        hide = hide | np.broadcast_to(np.asarray(mask, bool), x.shape)
    if causal:
        if x.ndim < 2:
            raise ValueError("fusedkit.reference: causal needs at least two dims (Sq, Sk)")
        hide = hide | _causal_mask(x.shape[-2], x.shape[-1])
    return np.where(hide, -np.inf, v), -1


def _stats(v, axis):
    """(v - m, sum exp(v - m)) with m = the row max, and m = 0 for rows of -inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(v, axis=axis, keepdims=True, initial=-np.inf)
        m = np.where(m == -np.inf, 0.0, m)
        d = v - m
        s = np.sum(np.exp(d), axis=axis, keepdims=True)
    return d, s


def softmax(x, axis=-1, *, scale=1.0, mask=None, causal=False, out_dtype=None):
    x = np.asarray(x)
    if _fused(x, axis, mask, causal, out_dtype):
        from . import _softmax_numba  # imports Numba: not at `import fusedkit`
        return _softmax_numba.softmax(x, scale, False)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    v, axis = _masked_values(x, axis, scale, mask, causal)
    d, s = _stats(v, axis)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inv = np.where(s == 0, 0.0, 1.0 / np.where(s == 0, 1.0, s))
        y = np.exp(d) * inv
    return y.astype(out_dtype)


def log_softmax(x, axis=-1, *, scale=1.0, out_dtype=None):
    x = np.asarray(x)
    if _fused(x, axis, out_dtype=out_dtype):
        from . import _softmax_numba
        return _softmax_numba.softmax(x, scale, True)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    v, axis = _masked_values(x, axis, scale, None, False)
    d, s = _stats(v, axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = d - np.log(s)
    return y.astype(out_dtype)


def _fused_bwd(dy, y) -> bool:
    dy, y = np.asarray(dy), np.asarray(y)
    return USE_NUMBA and dy.dtype == F32 and y.dtype == F32 and y.ndim >= 1 and dy.shape == y.shape


def softmax_backward(dy, y, *, scale=1.0):
    """dx = scale * y * (dy - sum(dy * y)) over the last axis, in dy's dtype."""
    if _fused_bwd(dy, y):
        from . import _softmax_numba
        return _softmax_numba.softmax_backward(np.asarray(dy), np.asarray(y), scale, False)
    g, yy = np.asarray(dy).astype(F64), np.asarray(y).astype(F64)
    dot = np.sum(g * yy, axis=-1, keepdims=True)
    return (F64(scale) * yy * (g - dot)).astype(np.asarray(dy).dtype)


def log_softmax_backward(dy, y, *, scale=1.0):
    """dx = scale * (dy - exp(y) * sum(dy)) over the last axis, in dy's dtype."""
    if _fused_bwd(dy, y):
        from . import _softmax_numba
        return _softmax_numba.softmax_backward(np.asarray(dy), np.asarray(y), scale, True)
    g, yy = np.asarray(dy).astype(F64), np.asarray(y).astype(F64)
    tot = np.sum(g, axis=-1, keepdims=True)
    return (F64(scale) * (g - np.exp(yy) * tot)).astype(np.asarray(dy).dtype)
