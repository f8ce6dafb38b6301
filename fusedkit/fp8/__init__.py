"""FP8 formats, scaling recipes and FP8Tensor (issue 4, in progress).

This package holds the numerics every FP8 kernel must reproduce bit for bit; the CPU reference
quantizers live in ``fusedkit.reference.fp8``, the kernels in ``cuda/fp8_*.cu`` (docs/fp8.rst has
their status). ``update_scales`` runs one delayed-scaling step for many tensors at once.
"""
from .formats import E4M3, E5M2, FP8Format, Format, as_format
from .recipes import (BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, current_scale,
                      delayed_scale, update_amax_history)
from .tensor import FP8Tensor


def fp8_gemm(a, b, **kwargs):
    """FP8 GEMM ``a @ b.T`` with a fused epilogue (see ``fusedkit.fp8.gemm.fp8_gemm``)."""
    from .gemm import fp8_gemm as _gemm  # imports the reference, which imports this package
    return _gemm(a, b, **kwargs)


def update_scales(history, scale, scale_inv=None, *, recipe=None, fmt="e4m3"):
    """One delayed-scaling step for n tensors, in place (see ``fusedkit.fp8.api.update_scales``)."""
    from .api import update_scales as _update  # the API module imports the reference, which imports us
    return _update(history, scale, scale_inv, recipe=recipe, fmt=fmt)

__all__ = ["E4M3", "E5M2", "FP8Format", "Format", "as_format", "DelayedScaling", "CurrentScaling",
           "MXFP8Scaling", "BlockScaling", "delayed_scale", "current_scale", "update_amax_history",
           "FP8Tensor", "update_scales", "fp8_gemm"]
