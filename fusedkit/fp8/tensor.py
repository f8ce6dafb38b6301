"""FP8Tensor: FP8 bytes plus what is needed to read them back."""
from __future__ import annotations

import numpy as np

from .formats import FP8Format, as_format


class FP8Tensor:
    """uint8 ``data`` in the logical shape, ``scale_inv`` (per tensor, per MXFP8 block as E8M0 bytes, or
    per 2-D block as fp32), the format, the input's ``amax``, the scaling mode and an optional
    transposed copy (``data_t``: the bytes viewed as 2-D (M, N), transposed to (N, M)).
    MXFP8 ``block``: 32 for row-wise blocks (scales (..., ceil(N / 32))), ``(32, 1)`` for column-wise
    blocks of 32 rows (scales (ceil(M / 32), N), data still in the (M, N) layout, as Transformer
    Engine's columnwise MXFP8)."""

    __slots__ = ("data", "scale_inv", "fmt", "amax", "mode", "block", "data_t")

    def __init__(self, data, scale_inv, fmt, amax=None, mode="tensor", block=None, data_t=None):
        self.data = data
        self.scale_inv = scale_inv
        self.fmt: FP8Format = as_format(fmt)
        self.amax = amax
        self.mode = mode            # "tensor" | "mxfp8" | "block"
        self.block = block
        self.data_t = data_t

    @property
    def shape(self):
        return tuple(self.data.shape)

    def dequantize(self, dtype=np.float32):
        from ..reference import fp8 as ref
        data = np.asarray(self.data)  # host NumPy / torch / JAX bytes
        if self.mode == "tensor":
            return ref.dequantize(data, self.scale_inv, self.fmt, dtype)
        if self.mode == "mxfp8" and self.block == (32, 1):  # column-wise: 32 rows of a column
            return ref.mxfp8_dequantize_columnwise(data, np.asarray(self.scale_inv), self.fmt, 32, dtype)
        if self.mode == "mxfp8":
            return ref.mxfp8_dequantize(data, self.scale_inv, self.fmt, self.block or 32, dtype)
        return ref.blockwise_dequantize(data, self.scale_inv, self.block, self.fmt, dtype)

    def __repr__(self) -> str:
        extra = f", block={self.block}" if self.block else ""
        si = self.scale_inv if np.ndim(self.scale_inv) == 0 else f"<{np.shape(self.scale_inv)}>"
        return (f"FP8Tensor(shape={self.shape}, fmt={self.fmt.name}, mode={self.mode}{extra}, "
                f"scale_inv={si}, amax={self.amax}{', +transpose' if self.data_t is not None else ''})")


def host_scale(s, kind: str):
    """A scale (scale_inv, out_scale) of a host-framework call as NumPy: arrays of a host framework
    (CPU torch, CPU JAX, DLPack) converted, floats and NumPy values as they are."""
    from .. import _interop
    if hasattr(s, "shape") and not isinstance(s, (np.ndarray, np.generic)):
        return _interop.to_numpy(s, kind) if _interop.framework(s) in _interop.HOST_KINDS else s
    return s


def host_copy(t: FP8Tensor, kind: str) -> FP8Tensor:
    """``t`` with NumPy bytes and scales (its data of host framework ``kind``), for the CPU reference."""
    from .. import _interop
    return FP8Tensor(_interop.to_numpy(t.data, kind), np.asarray(host_scale(t.scale_inv, kind)), t.fmt,
                     mode=t.mode, block=t.block)
