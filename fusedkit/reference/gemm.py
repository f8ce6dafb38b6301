"""FP8 GEMM on the CPU: the reference the GPU kernels (cuda/fp8_gemm_sm90.cu) are tested against.

``fp8_gemm(a, b, ...)`` has the public signature (fusedkit.fp8.gemm): ``a`` (M x K) and ``b`` (N x K)
FP8Tensors with NumPy data, ``C = a @ b.T``. Numerics: both operands dequantized exactly (FP8 value x
scale_inv, float64), a float64 matmul, then the epilogue in float64 in cuBLASLt's order

    v = act(a_deq @ b_deq.T + C + bias)        (C: accumulate_into, as stored; bias as stored)

and one rounding to the output dtype (bf16 / fp32), or, for FP8 outputs, v rounded to fp32, its amax
(NaN ignored) and the bytes sat_rn(v32 * out_scale) in fp32 (fusedkit.reference.fp8.cast_to_fp8).
``use_split_accumulator`` changes only how the GPU accumulates; the reference is exact either way.
"""
from __future__ import annotations

import math

import numpy as np

from ..fp8.formats import FP8Format, as_format
from ..fp8.tensor import FP8Tensor
from . import fp8 as _fp8

F32 = np.float32

# activation names of fp8_gemm -> the kernels' activation ids (cuda/common/act.cuh)
ACTIVATIONS = {"gelu": 0, "gelu_tanh": 0, "gelu_erf": 1, "silu": 2, "relu": 3, "squared_relu": 4}
OUT_DTYPES = ("bfloat16", "float32", "e4m3", "e5m2")


def out_kind(out_dtype) -> str:
    """'bfloat16' | 'float32' | 'e4m3' | 'e5m2' for an out_dtype spelling (FP8 formats by name, as
    ``fusedkit.fp8.E4M3``, or as 'float8_e4m3fn' / 'float8_e5m2')."""
    if isinstance(out_dtype, FP8Format):
        return out_dtype.name
    s = str(out_dtype).replace("torch.", "").replace("jnp.", "")
    aliases = {"bf16": "bfloat16", "bfloat16": "bfloat16", "float32": "float32", "fp32": "float32",
               "float": "float32"}
    if s in aliases:
        return aliases[s]
    try:
        return as_format(s).name
    except ValueError:
        pass
    try:
        n = np.dtype(out_dtype).name
        if n in aliases:
            return aliases[n]
        return as_format(n).name
    except (TypeError, ValueError):
        pass
    raise ValueError(f"fusedkit.fp8_gemm: out_dtype must be one of {', '.join(OUT_DTYPES)}, got {out_dtype!r}")


def dequantize_operand(t: FP8Tensor) -> np.ndarray:
    """The exact float64 values of a GEMM operand (per-tensor or block-scaled FP8Tensor, NumPy data)."""
    vals = _fp8.fp8_to_float(np.asarray(t.data), t.fmt).astype(np.float64)
    if t.mode == "tensor":
        return vals * np.float64(np.asarray(t.scale_inv, F32).reshape(()))
    if t.mode == "block":
        bm, bk = t.block
        s = np.asarray(t.scale_inv, F32).astype(np.float64)
        s = np.repeat(np.repeat(s, bm, axis=0), bk, axis=1)[: vals.shape[0], : vals.shape[1]]
        return vals * s
    raise ValueError(f"fusedkit.fp8_gemm: operands must be per-tensor or block-scaled, not {t.mode}")


def _sigmoid(z):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def act64(v, activation):
    """The activation in float64 (GeLU-tanh as x sigmoid(2u), equal to 0.5 x (1 + tanh u))."""
    if activation is None:
        return v
    kind = {"gelu": "gelu_tanh"}.get(activation, activation)
    if kind == "gelu_tanh":
        return v * _sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3))
    if kind == "gelu_erf":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    if kind == "silu":
        return v * _sigmoid(v)
    if kind == "relu":
        return np.maximum(v, 0.0)
    if kind == "squared_relu":
        return np.maximum(v, 0.0) ** 2
    raise ValueError(f"fusedkit.fp8_gemm: activation must be None or one of {', '.join(ACTIVATIONS)}, "
                     f"got {activation!r}")


def epilogue(acc, *, out_dtype="bfloat16", bias=None, activation=None, out_scale=None, accumulate_into=None):
    """The epilogue on a float64 product ``acc`` (M x N): -> an array of out_dtype, or an FP8Tensor."""
    v = np.asarray(acc, np.float64)
    if accumulate_into is not None:
        v = v + np.asarray(accumulate_into).astype(np.float64)
    if bias is not None:
        v = v + np.asarray(bias).astype(np.float64)[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        v = act64(v, activation)
    kind = out_kind(out_dtype)
    if kind in ("e4m3", "e5m2"):
        v32 = v.astype(F32)
        s = F32(np.asarray(out_scale, F32).reshape(()))
        with np.errstate(over="ignore", invalid="ignore"):
            data = _fp8.cast_to_fp8(v32 * s, kind)
        return FP8Tensor(data, F32(1.0) / s, kind, _fp8.amax(v32))
    from .._dtypes import numpy_dtype
    return v.astype(F32).astype(numpy_dtype(kind)) if kind == "bfloat16" else v.astype(F32)


def fp8_gemm(a: FP8Tensor, b: FP8Tensor, *, out_dtype="bfloat16", bias=None, activation=None, out_scale=None,
             accumulate_into=None, use_split_accumulator=True):
    """``a @ b.T`` of FP8Tensors with NumPy data (a: M x K, b: N x K), float64 math, the epilogue of
    fusedkit.fp8_gemm. With ``accumulate_into`` the result is written into it (in place) and returned."""
    del use_split_accumulator  # exact here
    prod = dequantize_operand(a) @ dequantize_operand(b).T
    out = epilogue(prod, out_dtype=out_dtype, bias=bias, activation=activation, out_scale=out_scale,
                   accumulate_into=accumulate_into)
    if accumulate_into is not None:
        accumulate_into[...] = out
        return accumulate_into
    return out
