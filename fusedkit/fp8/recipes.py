"""FP8 scaling recipes and their scale arithmetic (exactly Transformer Engine's; shared/DESIGN.md).

* Delayed scaling: each tensor keeps an amax history; a quantize writes the tensor's amax into
  ``history[0]``; the update step takes amax = max(history) (or history[0] for "most_recent"), rolls the
  history by one (``history = roll(history, -1); history[0] = 0``) and sets
  ``scale = fp8_max / amax / 2**margin``, keeping the previous scale when amax is 0, inf or NaN, and
  using fp32 max when the quotient overflows.
* Current scaling: amax of the tensor itself, floored at ``amax_epsilon``; an amax of 0 (after the
  floor), inf or NaN gives scale 1; optionally the scale is rounded down to a power of two.
* MXFP8: 32-element blocks along the last dim, one E8M0 scale per block = 2**ceil(log2(amax / fp8_max)).
* Block scaling (DeepSeek): 1x128 blocks for activations and gradients, 128x128 for weights,
  power-of-two fp32 scales, scale = 2**floor(log2(fp8_max / amax)) (1 for an all-zero block).

All arithmetic is fp32, as on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import Format

F32 = np.float32
F32_MAX = np.finfo(np.float32).max


@dataclass(frozen=True)
class DelayedScaling:
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"          # "max" | "most_recent"
    fp8_format: Format = Format.HYBRID

    def __post_init__(self):
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}")
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclass(frozen=True)
class CurrentScaling:
    power_of_2_scales: bool = False
    amax_epsilon: float = 0.0
    fp8_format: Format = Format.HYBRID


@dataclass(frozen=True)
class MXFP8Scaling:
    block: int = 32
    fp8_format: Format = Format.E4M3


@dataclass(frozen=True)
class BlockScaling:
    activation_block: tuple = (1, 128)
    weight_block: tuple = (128, 128)
    fp8_format: Format = Format.E4M3


def delayed_scale(amax, prev_scale, fp8_max, margin=0):
    """New scale(s) from amax (array or scalar), elementwise; fp32."""
    amax = np.asarray(amax, F32)
    prev = np.asarray(prev_scale, F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        sf = (F32(fp8_max) / amax) / F32(2.0 ** margin)
    sf = np.where(amax > 0, sf, prev)
    sf = np.where(np.isfinite(amax), sf, prev)
    sf = np.where(np.isinf(sf), F32_MAX, sf)
    return sf.astype(F32)


def update_amax_history(history, algo="max"):
    """One update step on a (history_len, n_tensors) amax history: returns (new history, amax)."""
    h = np.asarray(history, F32)
    amax = h.max(axis=0) if algo == "max" else h[0].copy()
    new = np.roll(h, -1, axis=0) if h.shape[0] > 1 else h.copy()
    new[0] = 0
    return new, amax


def current_scale(amax, fp8_max, amax_epsilon=0.0, power_of_2=False):
    amax = F32(max(F32(amax), F32(amax_epsilon))) if np.isfinite(amax) else F32(amax)
    if not np.isfinite(amax) or amax == 0:
        return F32(1.0)
    s = F32(fp8_max) / amax
    if np.isinf(s):
        s = F32_MAX
    if power_of_2:
        s = pow2_floor(s)
    return F32(s)


def pow2_floor(s):
    """Largest power of two <= s (fp32, s > 0 finite): clear the mantissa bits."""
    b = np.asarray(s, F32).view(np.uint32) & np.uint32(0x7F800000)
    return b.view(F32)


def pow2_ceil_exponent(v):
    """Smallest e with 2**e >= v, for fp32 v > 0 (exact, from the bits)."""
    v = np.asarray(v, F32)
    bits = v.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127
    mant = bits & np.uint32(0x7FFFFF)
    return np.where(mant != 0, exp + 1, exp)
