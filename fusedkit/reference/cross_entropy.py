"""Cross-entropy on the CPU (NumPy, float64 internally), same signatures as ``fusedkit.cross_entropy``
and ``fusedkit.cross_entropy_backward``: the CPU backend and the reference of the GPU kernels.

Semantics (docs/cross_entropy.rst): the class dimension is the last one; per token
``loss = (1 - e) (lse - x_t) + e (lse - mean x) + z lse^2`` (torch's label smoothing, PaLM z-loss);
ignored tokens get loss 0, lse 0 and a zero gradient row; "mean" divides by the number of non-ignored
tokens (NaN when there is none, as torch); out-of-range targets raise ValueError here.
Outputs: loss and lse in float32, the gradient in the logits' dtype (one rounding from float64).
fp32 logits take the fused Numba rows of ``_softmax_numba.py`` (the same float64 formulas, no float64 copy
of the logits, every core); ``USE_NUMBA = False`` keeps everything on the NumPy path (the tests compare).
"""
from __future__ import annotations

import numpy as np

REDUCTIONS = ("mean", "sum", "none")
USE_NUMBA = True


def _targets(target, ignore_index, N):
    """(int64 targets, valid mask) of the flat tokens; ValueError for an out-of-range target."""
    t = np.asarray(target).astype(np.int64).reshape(-1)
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= N))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"fusedkit: target values must be in [0, {N}) (the vocab) or ignore_index "
                         f"({ignore_index}); got {int(t[i])} at flat token {i}")
    return t, valid


def _rows(logits, target, ignore_index):
    N = logits.shape[-1]
    x = np.asarray(logits).astype(np.float64).reshape(-1, N)
    t, valid = _targets(target, ignore_index, N)
    return x, t, valid, N


def _fused(logits) -> bool:
    a = np.asarray(logits)
    return USE_NUMBA and a.dtype == np.float32 and a.ndim >= 1 and a.shape[-1] > 0


def _fused_rows(logits, target, ignore_index, label_smoothing, z_loss, reduction, want_grad, inplace,
                grad_loss=None, lse_in=None):
    """The Numba rows: (loss, lse) per token in float64, the valid mask and the gradient (with
    ``want_grad``, scaled by ``grad_loss`` as _row_scale does; written into the logits with ``inplace``).
    ``lse_in``: the backward's saved lse (float64 per token) instead of recomputing it."""
    from . import _softmax_numba  # imports Numba: not at `import fusedkit`
    x = np.asarray(logits)
    N = x.shape[-1]
    t, valid = _targets(target, ignore_index, N)
    x2 = np.ascontiguousarray(x).reshape(-1, N)
    grad = None
    if want_grad:
        if inplace and not x.flags.writeable:
            raise ValueError("fusedkit: inplace_grad=True needs writable logits")
        grad = x2 if inplace and np.shares_memory(x2, x) else np.empty(x2.shape, np.float32)
    loss, lse = _softmax_numba.cross_entropy_rows(x2, t, valid, float(label_smoothing), float(z_loss),
                                                   lse_in is None,
                                                   _row_scale(valid, reduction, grad_loss) if want_grad else None,
                                                   grad, lse_in)
    if grad is not None:
        if not inplace:
            grad = grad.reshape(x.shape)
        else:
            if grad is not x2:  # x was not contiguous: the rows went to a copy
                np.copyto(x, grad.reshape(x.shape))
            grad = x
    return loss, lse, valid, grad


def _lse(x, valid):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=-1) if x.shape[0] else np.zeros(0)
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=-1))
    return np.where(valid, lse, 0.0)


def _row_scale(valid, reduction, grad_loss=None):
    """Per-token share of the upstream gradient (float64, 0 for ignored tokens): grad_loss (a scalar, or
    one value per token for "none"), divided by the count of non-ignored tokens for "mean"."""
    gl = np.asarray(1.0 if grad_loss is None else grad_loss, np.float64)
    g = np.full(valid.shape, float(gl.reshape(-1)[0])) if gl.size == 1 else gl.reshape(-1).copy()
    if reduction == "mean":
        g = g / max(int(valid.sum()), 1)
    return np.where(valid, g, 0.0)


def _grad(x, t, valid, lse, g, label_smoothing, z_loss):
    N = x.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(x - lse[:, None])
        G = g[:, None] * (p * (1.0 + 2.0 * z_loss * lse)[:, None] - label_smoothing / N)
    rows = np.flatnonzero(valid)
    G[rows, t[rows]] -= g[rows] * (1.0 - label_smoothing)
    G[~valid] = 0.0
    return G


def _write_grad(G, logits, inplace):
    out = G.reshape(logits.shape).astype(logits.dtype)
    if not inplace:
        return out
    if not logits.flags.writeable:
        raise ValueError("fusedkit: inplace_grad=True needs writable logits")
    np.copyto(logits, out)
    return logits


def _check_options(reduction, label_smoothing, z_loss):
    if reduction not in REDUCTIONS:
        raise ValueError(f"fusedkit: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"fusedkit: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (np.isfinite(z_loss) and z_loss >= 0.0):
        raise ValueError(f"fusedkit: z_loss must be a finite number >= 0, got {z_loss}")


def cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0,
                  return_lse=False, return_grad=False, inplace_grad=False):
    _check_options(reduction, label_smoothing, z_loss)
    if not return_grad and inplace_grad:
        raise ValueError("fusedkit: inplace_grad=True needs return_grad=True")
    if _fused(logits):
        loss, lse, valid, G = _fused_rows(logits, target, ignore_index, label_smoothing, z_loss, reduction,
                                          return_grad, inplace_grad)
        return _outputs(loss, lse, valid, target, reduction, return_lse, G)
    x, t, valid, N = _rows(logits, target, ignore_index)
    lse = _lse(x, valid)
    tc = np.clip(t, 0, N - 1)
    with np.errstate(invalid="ignore", over="ignore"):
        xt = x[np.arange(x.shape[0]), tc] if x.shape[0] else np.zeros(0)
        loss = lse - xt
        if label_smoothing:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - x.mean(axis=-1))
        if z_loss:
            loss = loss + z_loss * lse * lse
    loss = np.where(valid, loss, 0.0)
    G = None
    if return_grad:
        G = _write_grad(_grad(x, t, valid, lse, _row_scale(valid, reduction), float(label_smoothing),
                              float(z_loss)), logits, inplace_grad)
    return _outputs(loss, lse, valid, target, reduction, return_lse, G)


def _outputs(loss, lse, valid, target, reduction, return_lse, grad):
    """The reduction of the per-token float64 losses and the returned tuple (loss[, lse][, grad])."""
    if reduction == "none":
        out = loss.astype(np.float32).reshape(np.shape(target))
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            total = loss.sum() / valid.sum() if reduction == "mean" else loss.sum()
        out = np.asarray(total, np.float32)
    res = (out,)
    if return_lse:
        res += (lse.astype(np.float32).reshape(np.shape(target)),)
    if grad is not None:
        res += (grad,)
    return res[0] if len(res) == 1 else res


def cross_entropy_backward(grad_loss, logits, target, lse, *, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", z_loss=0.0, inplace_grad=False):
    _check_options(reduction, label_smoothing, z_loss)
    if _fused(logits):
        return _fused_rows(logits, target, ignore_index, label_smoothing, z_loss, reduction, True, inplace_grad,
                           grad_loss, np.asarray(lse, np.float64).reshape(-1))[3]
    x, t, valid, N = _rows(logits, target, ignore_index)
    lse64 = np.where(valid, np.asarray(lse, np.float64).reshape(-1), 0.0)
    g = _row_scale(valid, reduction, grad_loss)
    G = _grad(x, t, valid, lse64, g, float(label_smoothing), float(z_loss))
    return _write_grad(G, logits, inplace_grad)
