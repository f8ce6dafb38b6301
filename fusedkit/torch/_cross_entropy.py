"""autograd.Function over fusedkit's cross-entropy: the forward returns the loss and keeps (logits,
target, lse); the backward calls ``fusedkit.cross_entropy_backward`` with the upstream gradient (no
reduction over the vocab, one read of the logits and one write of the gradient). CUDA tensors run the
kernels on torch's current stream, CPU tensors the CPU reference."""
from __future__ import annotations

import torch

from ..cross_entropy import cross_entropy as _ce, cross_entropy_backward as _ce_backward


class _CrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, reduction, z_loss):
        logits, target = logits.contiguous(), target.contiguous()
        opts = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction, z_loss=z_loss)
        loss, lse = _ce(logits.detach(), target, return_lse=True, **opts)
        ctx.save_for_backward(logits, target, lse)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, target, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 6
        g = _ce_backward(grad_loss.detach().float().contiguous(), logits.detach(), target, lse, **ctx.opts)
        return (g, None, None, None, None, None)


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0):
    """``torch.nn.functional.cross_entropy`` for logits ``(..., V)`` (classes LAST, as LM heads produce
    them) and int32/int64 targets ``(...)``, plus PaLM's ``z_loss * lse**2``; differentiable in the
    logits. Loss in float32. See ``fusedkit.cross_entropy`` for the semantics."""
    return _CrossEntropyFn.apply(logits, target, int(ignore_index), float(label_smoothing), reduction,
                                 float(z_loss))
