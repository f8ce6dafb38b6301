"""FP8 formats: E4M3 (forward tensors) and E5M2 (gradients), as in Transformer Engine.

E4M3 here is the "fn" variant: max 448, no infinities, one NaN encoding per sign. E5M2 is IEEE-like:
max 57344, with inf and NaN. Casts round to nearest even and saturate to the max finite value
(``cvt.rn.satfinite`` on the GPU, clip-then-cast on the CPU), so +-inf becomes +-max and NaN stays NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class FP8Format:
    name: str
    max: float
    np_dtype: np.dtype

    def __repr__(self) -> str:
        return f"fusedkit.fp8.{self.name.upper()}"


E4M3 = FP8Format("e4m3", 448.0, np.dtype(ml_dtypes.float8_e4m3fn))
E5M2 = FP8Format("e5m2", 57344.0, np.dtype(ml_dtypes.float8_e5m2))
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


class Format(Enum):
    """Recipe-level choice, as in TE: HYBRID = E4M3 forward, E5M2 backward (gradients)."""
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"

    def forward(self) -> FP8Format:
        return E5M2 if self is Format.E5M2 else E4M3

    def backward(self) -> FP8Format:
        return E4M3 if self is Format.E4M3 else E5M2


def as_format(fmt) -> FP8Format:
    if isinstance(fmt, FP8Format):
        return fmt
    f = FORMATS.get(str(fmt).lower().replace("float8_", "").replace("fn", ""))
    if f is None:
        raise ValueError(f"fusedkit: unknown FP8 format {fmt!r}; use 'e4m3' or 'e5m2'")
    return f
