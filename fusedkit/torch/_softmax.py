"""autograd.Function over fusedkit's softmax / log-softmax: the forward keeps its output y, the backward
calls ``fusedkit.softmax_backward`` / ``log_softmax_backward`` (one read of y and dy, one write of dx;
masks need not be kept: masked positions have y = 0). CUDA tensors run the kernels on torch's current
stream, CPU tensors the CPU reference."""
from __future__ import annotations

import torch

from ..softmax import _backward, _forward


class _SoftmaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, scale, mask, causal, log):
        y = _forward(x.detach().contiguous(), dim, scale, None if mask is None else mask.contiguous(), causal,
                     None, log)
        ctx.save_for_backward(y)
        ctx.scale, ctx.log = scale, log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 6
        dx = _backward(dy.detach().contiguous().to(y.dtype), y, ctx.scale, ctx.log)
        return (dx, None, None, None, None, None)


def softmax(x, dim=-1, scale=1.0, mask=None, causal=False):
    """``torch.softmax(x * scale, dim)`` with fusedkit's boolean ``mask`` (True = masked out, broadcast
    to x) and ``causal`` options, differentiable in x. ``dim`` must be the last dim (see
    ``fusedkit.softmax``)."""
    return _SoftmaxFn.apply(x, dim, float(scale), mask, bool(causal), False)


def log_softmax(x, dim=-1, scale=1.0):
    """``torch.log_softmax(x * scale, dim)``, differentiable in x; ``dim`` must be the last dim."""
    return _SoftmaxFn.apply(x, dim, float(scale), None, False, True)
