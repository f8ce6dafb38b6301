"""autograd.Function over fusedkit's activations: forward saves x (and bias), backward calls the
matching ``*_backward``; the bias gradient is the fp32 sum of dx over the leading dims."""
from __future__ import annotations

import torch

from .. import activations as _fa


class _ActFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, kind):
        x = x.contiguous()
        bias = None if bias is None else bias.contiguous()
        ctx.save_for_backward(x, bias)
        ctx.kind = kind
        return _fa._forward(x, kind, bias)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx = _fa._backward(dy.contiguous(), x, ctx.kind, bias)
        db = None
        if bias is not None and ctx.needs_input_grad[1]:
            db = dx.reshape(-1, dx.shape[-1]).float().sum(0).to(bias.dtype)
        return (dx if ctx.needs_input_grad[0] else None, db, None)


def _kind(base, approximate):
    return _fa._kind_for(approximate, base)


def gelu(x, bias=None, approximate="tanh"):
    """GeLU of ``x + bias`` (``approximate="tanh"`` or ``"none"``), differentiable in x and bias."""
    return _ActFn.apply(x, bias, _kind("gelu", approximate))


def silu(x, bias=None):
    return _ActFn.apply(x, bias, "silu")


def relu(x, bias=None):
    return _ActFn.apply(x, bias, "relu")


def squared_relu(x, bias=None):
    return _ActFn.apply(x, bias, "squared_relu")


def swiglu(x, bias=None):
    """``silu(a) * g`` over the halves of x's last dim, differentiable."""
    return _ActFn.apply(x, bias, "swiglu")


def geglu(x, bias=None, approximate="tanh"):
    return _ActFn.apply(x, bias, _kind("geglu", approximate))


def reglu(x, bias=None):
    return _ActFn.apply(x, bias, "reglu")
