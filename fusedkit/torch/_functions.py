"""autograd.Function wrappers: forward keeps the statistics, backward calls fusedkit's backward."""
from __future__ import annotations

import torch

from .. import norms as _fk


def _c(t):
    """Contiguous (a no-op for contiguous tensors) or None."""
    return None if t is None else t.contiguous()


def _needs_grad(*ts) -> bool:
    if not torch.is_grad_enabled():
        return False
    for t in ts:
        if t is not None and t.requires_grad:
            return True
    return False


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, zero_centered_gamma):
        x, weight, bias = _c(x), _c(weight), _c(bias)
        ctx.vec = x.dim() == 1  # run a 1-D x as one row: its statistics are then (1,), not ()
        if ctx.vec:
            x = x.view(1, -1)
        y, mean, rstd = _fk.layer_norm(x, weight, bias, eps=eps, zero_centered_gamma=zero_centered_gamma,
                                       return_stats=True)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.zero_centered_gamma = zero_centered_gamma
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.view(-1) if ctx.vec else y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx, dw, db = _fk.layer_norm_backward(dy.contiguous().view(x.shape), x, weight, mean, rstd,
                                             zero_centered_gamma=ctx.zero_centered_gamma)
        if ctx.vec:
            dx = dx.view(-1)
        if need_b and db.dtype != ctx.bias_dtype:  # bias fp32 next to a weightless bf16/fp16 x
            db = db.to(ctx.bias_dtype)
        return (dx if need_x else None, dw if need_w else None, db if need_b else None, None, None)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, zero_centered_gamma):
        x, weight = _c(x), _c(weight)
        ctx.vec = x.dim() == 1
        if ctx.vec:
            x = x.view(1, -1)
            residual = None if residual is None else residual.reshape(1, -1)
        if residual is None:
            y, rstd = _fk.rms_norm(x, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
                                   return_stats=True)
            h = x
        else:
            y, h, rstd = _fk.rms_norm(x, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
                                      return_stats=True, residual=residual.contiguous())
        ctx.save_for_backward(h, weight, rstd)
        ctx.zero_centered_gamma = zero_centered_gamma
        ctx.set_materialize_grads(False)  # an unused y or h gives None, not a zeros tensor
        if ctx.vec:
            return y.view(-1) if residual is None else (y.view(-1), h.view(-1))
        return y if residual is None else (y, h)

    @staticmethod
    def backward(ctx, dy, dh=None):
        h, weight, rstd = ctx.saved_tensors
        need_x, need_w, need_r = ctx.needs_input_grad[:3]
        dw = None
        if dy is not None:
            dx, dw = _fk.rms_norm_backward(dy.contiguous().view(h.shape), h, weight, rstd,
                                           zero_centered_gamma=ctx.zero_centered_gamma)
            if ctx.vec:
                dx = dx.view(-1)
            if dh is not None:
                dx.add_(dh)  # dx is freshly allocated by fusedkit
        else:
            dx = dh
        # h = x + residual: both receive dL/dh (the normalisation's dx plus h's own incoming grad)
        return (dx if need_x else None, dw if need_w else None, dx if need_r else None, None, None)


def layer_norm(x, weight=None, bias=None, eps=1e-5, zero_centered_gamma=False):
    """LayerNorm over the last dimension with autograd (drop-in for ``F.layer_norm(x, (N,), w, b, eps)``).

    Non-contiguous inputs are made contiguous here. Without autograd (no input requires grad, or
    grad mode is off) it is a plain ``fusedkit.layer_norm`` call and keeps no statistics.
    """
    if _needs_grad(x, weight, bias):
        return _LayerNormFn.apply(x, weight, bias, float(eps), bool(zero_centered_gamma))
    return _fk.layer_norm(_c(x), _c(weight), _c(bias), eps=float(eps),
                          zero_centered_gamma=bool(zero_centered_gamma))


def rms_norm(x, weight=None, eps=1e-6, zero_centered_gamma=False, residual=None):
    """RMSNorm over the last dimension with autograd.

    With ``residual`` returns ``(y, h)`` where ``h = x + residual`` (rounded to x's dtype) is the
    normalised input; gradients flow to x and residual through both y and h.
    """
    if _needs_grad(x, weight, residual):
        return _RMSNormFn.apply(x, weight, residual, float(eps), bool(zero_centered_gamma))
    return _fk.rms_norm(_c(x), _c(weight), eps=float(eps), zero_centered_gamma=bool(zero_centered_gamma),
                        residual=_c(residual))
