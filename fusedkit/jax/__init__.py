"""JAX front end: LayerNorm / RMSNorm, softmax / log-softmax, cross-entropy and the activations with
gradients (``jax.custom_vjp``), under ``jax.jit`` too.

The forward and backward are ``fusedkit.layer_norm(..., return_stats=True)`` and
``fusedkit.layer_norm_backward`` (and the RMS twins): eager CPU arrays run the CPU reference, GPU
arrays and traced values go through the buffer callbacks of ``fusedkit.jax._prims`` (the CUDA kernels
on XLA's stream on a GPU, the reference on the CPU). Traced values mixed with concrete CPU arrays
(a constant closed over inside ``jit``) go to the buffer callbacks directly.

``fusedkit.quantize`` / ``fusedkit.dequantize`` on JAX GPU arrays (and inside ``jax.jit``) run through
the buffer callbacks too; importing this module registers ``FP8Tensor`` as a pytree, so jitted
functions may return one.

Importing ``fusedkit`` does not import JAX; only ``fusedkit.jax`` does.
"""
from __future__ import annotations

import functools

import jax

from .. import _dtypes, _interop
from .. import norms as _fk
from . import _prims

def _register_fp8_tensor():
    """FP8Tensor as a pytree (arrays: data, scale_inv, amax, data_t; static: format, mode, block), so a
    jitted function may take and return the result of ``fusedkit.quantize``."""
    from ..fp8.tensor import FP8Tensor

    def flatten(t):
        return (t.data, t.scale_inv, t.amax, t.data_t), (t.fmt.name, t.mode, t.block)

    def unflatten(aux, children):
        data, scale_inv, amax, data_t = children
        fmt, mode, block = aux
        return FP8Tensor(data, scale_inv, fmt, amax, mode=mode, block=block, data_t=data_t)

    jax.tree_util.register_pytree_node(FP8Tensor, flatten, unflatten)


_register_fp8_tensor()

__all__ = ["layer_norm", "rms_norm", "softmax", "log_softmax", "cross_entropy", "gelu", "silu", "relu",
           "squared_relu", "swiglu", "geglu", "reglu"]


def _cast(g, like):
    return g if like is None or g.dtype == like.dtype else g.astype(like.dtype)


def _mixed(arrays) -> bool:
    """Traced values next to concrete CPU arrays (a closed-over constant inside jit, say)."""
    kinds = {_interop.framework(a) for a in arrays if a is not None}
    return len(kinds) > 1 and kinds <= {_interop.JAX, "jax_cpu"}


def _forward(x, weight, bias, eps, zero_centered_gamma, return_stats, rms):
    if _mixed((x, weight, bias)):  # fusedkit.norms would take these for two frameworks
        _fk._validate(x, weight, bias, None, None)
        if eps < 0:
            raise ValueError(f"fusedkit: eps must be >= 0, got {eps}")
        return _prims.norm_forward(x, weight, bias, None, eps, zero_centered_gamma,
                                   _dtypes.canonical(x.dtype), return_stats, rms)
    return _fk._norm_forward(x, weight, bias, None, eps, zero_centered_gamma, None, return_stats, rms)


def _backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms):
    if _mixed((dy, x, weight, mean, rstd)):
        return _prims.norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms)
    return _fk._norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms)


# ----------------------------------------------------------------------------------------------------
# LayerNorm

@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, weight, bias, eps, zero_centered_gamma):
    return _forward(x, weight, bias, eps, zero_centered_gamma, False, False)


def _layer_norm_fwd(x, weight, bias, eps, zero_centered_gamma):
    y, mean, rstd = _forward(x, weight, bias, eps, zero_centered_gamma, True, False)
    return y, (x, weight, bias, mean, rstd)


def _layer_norm_bwd(eps, zero_centered_gamma, res, dy):
    x, weight, bias, mean, rstd = res
    dx, dw, db = _backward(dy, x, weight, mean, rstd, zero_centered_gamma, False)
    # db has weight's dtype (x's without a weight): a float32 bias next to no weight gets its own
    return dx, dw, None if bias is None else _cast(db, bias)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x, weight=None, bias=None, eps=1e-5, zero_centered_gamma=False):
    """LayerNorm over the last dimension, differentiable in x, weight and bias."""
    return _layer_norm(x, weight, bias, float(eps), bool(zero_centered_gamma))


# ----------------------------------------------------------------------------------------------------
# RMSNorm

@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, eps, zero_centered_gamma):
    return _forward(x, weight, None, eps, zero_centered_gamma, False, True)


def _rms_norm_fwd(x, weight, eps, zero_centered_gamma):
    y, rstd = _forward(x, weight, None, eps, zero_centered_gamma, True, True)
    return y, (x, weight, rstd)


def _rms_norm_bwd(eps, zero_centered_gamma, res, dy):
    x, weight, rstd = res
    dx, dw = _backward(dy, x, weight, None, rstd, zero_centered_gamma, True)
    return dx, dw


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rms_norm(x, weight=None, eps=1e-6, zero_centered_gamma=False):
    """RMSNorm over the last dimension, differentiable in x and weight."""
    return _rms_norm(x, weight, float(eps), bool(zero_centered_gamma))


# ----------------------------------------------------------------------------------------------------
# activations: one custom_vjp, the kind static (fusedkit.activations; reference on the CPU)

@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _act(x, bias, kind):
    return _prims.act_forward(x, bias, kind, _dtypes.canonical(x.dtype))


def _act_fwd(x, bias, kind):
    return _act(x, bias, kind), (x, bias)


def _act_bwd(kind, res, dy):
    x, bias = res
    dx = _prims.act_backward(dy.astype(x.dtype), x, bias, kind)
    if bias is None:
        return dx, None
    return dx, dx.reshape(-1, dx.shape[-1]).astype(jax.numpy.float32).sum(0).astype(bias.dtype)


_act.defvjp(_act_fwd, _act_bwd)


def _activation(x, bias, kind):
    from .. import activations as _fa
    _fa._validate(x, bias, kind)
    return _act(x, bias, kind)


def gelu(x, bias=None, approximate="tanh"):
    """GeLU of ``x + bias`` (tanh approximation, or ``approximate="none"`` for erf), differentiable."""
    from ..activations import _kind_for
    return _activation(x, bias, _kind_for(approximate, "gelu"))


def silu(x, bias=None):
    return _activation(x, bias, "silu")


def relu(x, bias=None):
    return _activation(x, bias, "relu")


def squared_relu(x, bias=None):
    return _activation(x, bias, "squared_relu")


def swiglu(x, bias=None):
    """``silu(a) * g`` with ``a, g`` the halves of x's last dim, differentiable."""
    return _activation(x, bias, "swiglu")


def geglu(x, bias=None, approximate="tanh"):
    from ..activations import _kind_for
    return _activation(x, bias, _kind_for(approximate, "geglu"))


def reglu(x, bias=None):
    return _activation(x, bias, "reglu")


# ----------------------------------------------------------------------------------------------------
# softmax / log-softmax: differentiable in x (the mask is a constant: its cotangent is None)

@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _softmax(x, mask, axis, scale, causal, log):
    from ..softmax import _forward
    return _forward(x, axis, scale, mask, causal, None, log)


def _softmax_fwd(x, mask, axis, scale, causal, log):
    y = _softmax(x, mask, axis, scale, causal, log)
    return y, y


def _softmax_bwd(axis, scale, causal, log, y, dy):
    from ..softmax import _backward
    return _backward(dy.astype(y.dtype), y, scale, log), None


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


def softmax(x, axis=-1, scale=1.0, mask=None, causal=False):
    """``jax.nn.softmax(x * scale, axis)`` with fusedkit's boolean ``mask`` (True = masked out,
    broadcastable to x) and ``causal`` (as in :func:`fusedkit.softmax`; the last axis only),
    differentiable in x."""
    return _softmax(x, mask, int(axis), float(scale), bool(causal), False)


def log_softmax(x, axis=-1, scale=1.0):
    """``jax.nn.log_softmax(x * scale, axis)`` (the last axis only), differentiable in x."""
    return _softmax(x, None, int(axis), float(scale), False, True)


# ----------------------------------------------------------------------------------------------------
# cross-entropy: differentiable in the logits; the forward keeps lse, the backward reads the logits once
# (fusedkit.cross_entropy_backward) instead of keeping a (tokens x vocab) gradient from the forward

@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _cross_entropy(logits, target, ignore_index, label_smoothing, reduction, z_loss):
    from ..cross_entropy import cross_entropy as ce
    return ce(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction,
              z_loss=z_loss)


def _cross_entropy_fwd(logits, target, ignore_index, label_smoothing, reduction, z_loss):
    from ..cross_entropy import cross_entropy as ce
    loss, lse = ce(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                   reduction=reduction, z_loss=z_loss, return_lse=True)
    return loss, (logits, target, lse)


def _cross_entropy_bwd(ignore_index, label_smoothing, reduction, z_loss, res, g):
    from ..cross_entropy import cross_entropy_backward
    logits, target, lse = res
    dx = cross_entropy_backward(g.astype(jax.numpy.float32), logits, target, lse, ignore_index=ignore_index,
                                label_smoothing=label_smoothing, reduction=reduction, z_loss=z_loss)
    return dx, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0):
    """:func:`fusedkit.cross_entropy` (logits ``(..., V)``, integer ``target`` of ``logits.shape[:-1]``),
    differentiable in the logits."""
    return _cross_entropy(logits, target, int(ignore_index), float(label_smoothing), str(reduction),
                          float(z_loss))
