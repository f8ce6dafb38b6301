"""Dtype names shared by every layer: canonical strings, their C++ kernel types, NumPy/torch/JAX twins."""
from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    _BF16_NP = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a hard dependency, kept soft for import
    ml_dtypes = None
    _BF16_NP = None

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
CXX = {"float32": "float", "float16": "fk::f16", "bfloat16": "fk::bf16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        if _BF16_NP is None:
            raise ImportError("bfloat16 on the CPU needs ml_dtypes: pip install ml_dtypes")
        return _BF16_NP
    return np.dtype(name)


_canonical_cache: dict = {}


def canonical(dtype) -> str:
    """'float32' | 'float16' | 'bfloat16' for any spelling (str, NumPy, ml_dtypes, torch, JAX)."""
    try:
        return _canonical_cache[dtype]
    except (KeyError, TypeError):
        pass
    name = _canonical(dtype)
    try:
        _canonical_cache[dtype] = name
    except TypeError:
        pass
    return name


def _canonical(dtype) -> str:
    if dtype is None:
        raise TypeError("dtype must not be None")
    s = str(dtype)
    s = s.replace("torch.", "").replace("jnp.", "")
    aliases = {"float": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
               "fp32": "float32", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
    if s in aliases:
        return aliases[s]
    try:
        s2 = np.dtype(dtype).name
        if s2 in aliases:
            return aliases[s2]
    except TypeError:
        pass
    raise TypeError(f"fusedkit supports float32, float16 and bfloat16 here, not {dtype!r}")


def canonical_or_name(dtype) -> str:
    """canonical(dtype) for float dtypes, else the dtype's own name (validation reports it)."""
    try:
        return canonical(dtype)
    except TypeError:
        return str(dtype)
