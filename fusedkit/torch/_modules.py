"""nn.Module front ends: drop-in for torch.nn.LayerNorm / torch.nn.RMSNorm over the last dimension."""
from __future__ import annotations

import numbers

import torch
from torch import nn

from ._functions import layer_norm, rms_norm


def _hidden(hidden_size) -> int:
    if isinstance(hidden_size, numbers.Integral):
        return int(hidden_size)
    shape = tuple(hidden_size)
    if len(shape) != 1:
        raise ValueError(f"fusedkit.torch normalizes over the last dimension only: hidden_size must be an "
                         f"int or a 1-tuple, got {shape}")
    return int(shape[0])


class _Norm(nn.Module):
    def __init__(self, hidden_size, eps, zero_centered_gamma, params_dtype, device, bias):
        super().__init__()
        self.hidden_size = _hidden(hidden_size)
        self.normalized_shape = (self.hidden_size,)
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self.elementwise_affine = True
        self.weight = nn.Parameter(torch.empty(self.hidden_size, dtype=params_dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.hidden_size, dtype=params_dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """g = 1: weight = 1, or weight = 0 with zero_centered_gamma (g = weight + 1); bias = 0."""
        with torch.no_grad():
            if self.zero_centered_gamma:
                nn.init.zeros_(self.weight)
            else:
                nn.init.ones_(self.weight)
            if getattr(self, "bias", None) is not None:
                nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """LayerNorm over the last dimension (``hidden_size`` features) with learnable weight and bias."""

    def __init__(self, hidden_size, eps=1e-5, zero_centered_gamma=False, params_dtype=torch.float32,
                 device=None):
        super().__init__(hidden_size, eps, zero_centered_gamma, params_dtype, device, bias=True)

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps, self.zero_centered_gamma)


class RMSNorm(_Norm):
    """RMSNorm over the last dimension with a learnable weight.

    ``forward(x, residual=None)``: with a residual returns ``(y, h)``, ``h = x + residual``.
    """

    def __init__(self, hidden_size, eps=1e-6, zero_centered_gamma=False, params_dtype=torch.float32,
                 device=None):
        super().__init__(hidden_size, eps, zero_centered_gamma, params_dtype, device, bias=False)

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, self.zero_centered_gamma, residual)
