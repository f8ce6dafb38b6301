"""FP8 formats, scaling recipes and FP8Tensor (issue 4, in progress).

This package holds the numerics every FP8 kernel must reproduce bit for bit; the CPU reference
quantizers live in ``fusedkit.reference.fp8``. The CUDA kernels are not written yet.
"""
from .formats import E4M3, E5M2, FP8Format, Format, as_format
from .recipes import (BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, current_scale,
                      delayed_scale, update_amax_history)
from .tensor import FP8Tensor

__all__ = ["E4M3", "E5M2", "FP8Format", "Format", "as_format", "DelayedScaling", "CurrentScaling",
           "MXFP8Scaling", "BlockScaling", "delayed_scale", "current_scale", "update_amax_history",
           "FP8Tensor"]
