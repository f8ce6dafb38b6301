"""PyTorch autograd functions and drop-in modules over fusedkit's LayerNorm / RMSNorm.

``fusedkit.torch.layer_norm`` / ``rms_norm`` are ``torch.autograd.Function``s around the public API
(``fusedkit.layer_norm(..., return_stats=True)`` and ``fusedkit.layer_norm_backward``), so they run
the CUDA kernels on CUDA tensors (on torch's current stream) and the CPU reference on CPU tensors.
``LayerNorm`` and ``RMSNorm`` are ``nn.Module``s normalizing over the last dimension, with the
parameter names of ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` (``weight``, ``bias``).

``gelu``, ``silu``, ``relu``, ``squared_relu``, ``swiglu``, ``geglu`` and ``reglu`` are differentiable
activations (x and bias) over ``fusedkit.activations``.

Importing ``fusedkit`` does not import torch; only ``fusedkit.torch`` does.
"""
from __future__ import annotations

from ._activations import geglu, gelu, reglu, relu, silu, squared_relu, swiglu
from ._functions import layer_norm, rms_norm
from ._modules import LayerNorm, RMSNorm
from ._cross_entropy import cross_entropy
from ._softmax import log_softmax, softmax

__all__ = ["layer_norm", "rms_norm", "LayerNorm", "RMSNorm", "gelu", "silu", "relu", "squared_relu",
           "swiglu", "geglu", "reglu"]
__all__ += ["cross_entropy"]
__all__ += ["softmax", "log_softmax"]
