"""FP8 quantization on the CPU: the bit-exact reference for the FP8 kernels (fusedkit.fp8).

Casts: x (rounded to its storage dtype) -> fp32 -> times the scale in fp32 -> clip to +-fp8_max (NaN
passes through) -> ml_dtypes cast, round to nearest even. ml_dtypes alone does not saturate (an e4m3fn
overflow becomes NaN), hence the clip. amax ignores NaN (fmaxf semantics) and is 0 for empty input.
Data is returned as uint8 bytes in x's shape.
"""
from __future__ import annotations

import numpy as np

from ..fp8.formats import as_format
from ..fp8.recipes import current_scale, pow2_ceil_exponent, pow2_floor

F32 = np.float32


def cast_to_fp8(xf32, fmt):
    """fp32 values -> FP8 bytes (uint8), RNE with saturation."""
    f = as_format(fmt)
    x = np.asarray(xf32, F32)
    with np.errstate(invalid="ignore"):
        clipped = np.clip(x, -f.max, f.max)  # NaN stays NaN; +-inf -> +-max
    return clipped.astype(f.np_dtype).view(np.uint8)


def fp8_to_float(data, fmt):
    f = as_format(fmt)
    return np.asarray(data, np.uint8).view(f.np_dtype).astype(F32)


def amax(x):
    a = np.abs(np.asarray(x).astype(F32))
    if a.size == 0:
        return F32(0)
    with np.errstate(invalid="ignore"):
        m = np.nanmax(a) if not np.isnan(a).all() else F32(0)
    return F32(m)


def quantize_delayed(x, scale, fmt="e4m3"):
    """sat(x * scale) with a given (delayed) scale -> (data, scale_inv, amax of x)."""
    s = F32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        data = cast_to_fp8(np.asarray(x).astype(F32) * s, fmt)
    return data, F32(1.0) / s, amax(x)


def quantize_current(x, fmt="e4m3", amax_epsilon=0.0, power_of_2_scales=False):
    """Current scaling: scale from this tensor's amax -> (data, scale_inv, amax, scale)."""
    a = amax(x)
    s = current_scale(a, as_format(fmt).max, amax_epsilon, power_of_2_scales)
    data, scale_inv, _ = quantize_delayed(x, s, fmt)
    return data, scale_inv, a, s


def transpose_2d(data):
    """The transposed copy of FP8 bytes: ``data`` viewed as 2-D (M = product of the leading dims, N)
    -> (N, M), C-contiguous, as Transformer Engine's cast-transpose lays it out for the wgrad GEMM."""
    d = np.asarray(data)
    n = d.shape[-1] if d.ndim else 1
    return np.ascontiguousarray(d.reshape(-1, n).T)


def dequantize(data, scale_inv, fmt="e4m3", dtype=np.float32):
    return (fp8_to_float(data, fmt) * F32(scale_inv)).astype(dtype)


def _blocks_last(x, block):
    """x (..., K) -> (..., K/block, block), zero-padded at the end of the last dim."""
    K = x.shape[-1]
    pad = (-K) % block
    if pad:
        x = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), x.dtype)], axis=-1)
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, block)), K


def quantize_mxfp8(x, fmt="e4m3", block=32):
    """MXFP8 along the last dim: (data, E8M0 scale bytes of shape (..., ceil(K/32))).

    Block scale 2**e with e = ceil(log2(amax / fp8_max)) clamped to [-127, 127] (all-zero block: -127);
    data = sat(x / 2**e); the E8M0 byte is e + 127.
    """
    f = as_format(fmt)
    xf = np.asarray(x).astype(F32)
    b, K = _blocks_last(xf, block)
    with np.errstate(invalid="ignore"):
        am = np.nanmax(np.abs(b), axis=-1) if b.size else np.zeros(b.shape[:-1], F32)
    am = np.nan_to_num(am, nan=0.0, posinf=np.inf).astype(F32)  # NaN ignored; inf kept (-> e = 127)
    with np.errstate(divide="ignore", over="ignore"):
        e = np.where(am > 0, pow2_ceil_exponent(np.maximum(am / F32(f.max), np.finfo(F32).tiny)), -127)
    e = np.where(np.isinf(am), 127, e)
    e = np.clip(e, -127, 127).astype(np.int32)
    inv = np.ldexp(F32(1.0), -e).astype(F32)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        data = cast_to_fp8(b * inv, f).reshape(b.shape[:-2] + (-1,))[..., :K]
    return data, (e + 127).astype(np.uint8)


def quantize_mxfp8_columnwise(x, fmt="e4m3", block=32):
    """Column-wise MXFP8 (Transformer Engine's columnwise layout, the operand of the weight-gradient
    GEMM): x viewed as 2-D (M = product of the leading dims, N); blocks of 32 consecutive rows of each
    column, scaled as quantize_mxfp8 scales its blocks -> (data in x's shape, E8M0 scale bytes of shape
    (ceil(M / 32), N))."""
    x = np.asarray(x)
    n = x.shape[-1] if x.ndim else 1
    d_t, s_t = quantize_mxfp8(x.reshape(-1, n).T, fmt, block)  # blocks along the rows of each column
    return np.ascontiguousarray(d_t.T).reshape(x.shape), np.ascontiguousarray(s_t.T)


def mxfp8_dequantize_columnwise(data, scales, fmt="e4m3", block=32, dtype=np.float32):
    d = np.asarray(data)
    n = d.shape[-1] if d.ndim else 1
    vals = mxfp8_dequantize(d.reshape(-1, n).T, np.asarray(scales).T, fmt, block, dtype)
    return np.ascontiguousarray(vals.T).reshape(d.shape)


def mxfp8_dequantize(data, scales, fmt="e4m3", block=32, dtype=np.float32):
    vals = fp8_to_float(data, fmt)
    b, K = _blocks_last(vals, block)
    with np.errstate(over="ignore", invalid="ignore"):  # E8M0 byte 255 -> inf (0 x inf -> NaN), as intended
        s = np.ldexp(F32(1.0), scales.astype(np.int32) - 127).astype(F32)[..., None]
        return (b * s).reshape(b.shape[:-2] + (-1,))[..., :K].astype(dtype)


def quantize_blockwise(x, block=(1, 128), fmt="e4m3"):
    """DeepSeek-style block scaling of a 2-D x: (data, scale_inv of shape (ceil(M/bm), ceil(K/bk))).

    Per block: scale = 2**floor(log2(fp8_max / amax)) (1 for an all-zero block or one holding +-inf),
    data = sat(x * scale).
    """
    f = as_format(fmt)
    xf = np.asarray(x).astype(F32)
    if xf.ndim != 2:
        raise ValueError(f"fusedkit: block scaling takes a 2-D array, got shape {xf.shape}")
    bm, bk = block
    M, K = xf.shape
    pm, pk = (-M) % bm, (-K) % bk
    xp = np.pad(xf, ((0, pm), (0, pk)))
    t = xp.reshape(xp.shape[0] // bm, bm, xp.shape[1] // bk, bk)
    with np.errstate(invalid="ignore"):
        am = np.nan_to_num(np.nanmax(np.abs(t), axis=(1, 3)), nan=0.0, posinf=np.inf).astype(F32)
    ok = (am > 0) & np.isfinite(am)  # all-zero or inf block: scale 1 (Transformer Engine's rule)
    with np.errstate(divide="ignore", over="ignore"):
        q = np.where(ok, F32(f.max) / np.where(ok, am, F32(1)), F32(1)).astype(F32)
    q = np.where(np.isinf(q), np.finfo(F32).max, q)
    scale = pow2_floor(q)
    with np.errstate(over="ignore", invalid="ignore"):
        data = cast_to_fp8(t * scale[:, None, :, None], f).reshape(xp.shape)[:M, :K]
    return data, (F32(1.0) / scale).astype(F32)


def blockwise_dequantize(data, scale_inv, block=(1, 128), fmt="e4m3", dtype=np.float32):
    bm, bk = block
    vals = fp8_to_float(data, fmt)
    s = np.repeat(np.repeat(scale_inv, bm, axis=0), bk, axis=1)[: vals.shape[0], : vals.shape[1]]
    return (vals * s).astype(dtype)


# ----------------------------------------------------------------------------------------------------
# Fused cast-transposes of gradients (Transformer Engine's cast_transpose_dbias and dgelu-cast-transpose)

DACT_KINDS = {"gelu": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu_erf": "gelu_erf", "silu": "silu",
              "relu": "relu", "squared_relu": "squared_relu",
              # gated (x = [a | b], y = act(a) * b; dy has half x's last dim); "geglu" is the tanh form
              "swiglu": "swiglu", "geglu": "geglu_tanh", "geglu_tanh": "geglu_tanh", "geglu_erf": "geglu_erf",
              "reglu": "reglu"}


def dact_values(dy, x, activation="gelu"):
    """g = dy * act'(x) in fp32 (inputs rounded to their storage dtype first): the values
    ``dact_cast_transpose`` casts, act' from fusedkit.reference.activations.dact (GeLU-tanh and SiLU in
    float64 rounded once, the kernels' fast sigmoid within a few ulp of it; ReLU and squared ReLU
    exact, so their g is bit-exact). Gated kinds (x = [a | b] of 2H columns, dy of H): g =
    [(dy * b) * act'(a) | dy * act(a)], of x's shape."""
    from . import activations as _act
    try:
        kind = DACT_KINDS[activation]
    except KeyError:
        raise ValueError(f"fusedkit: activation must be one of {', '.join(DACT_KINDS)}, got {activation!r}") from None
    d, xf = np.asarray(dy).astype(F32), np.asarray(x).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        if kind in _act.GATED:
            inner, H = _act.GATED[kind], xf.shape[-1] // 2
            a, b = xf[..., :H], xf[..., H:]
            return np.concatenate([(d * b) * _act.dact(a, inner), d * _act.act(a, inner)], axis=-1).astype(F32)
        return (d * _act.dact(xf, kind)).astype(F32)


def column_sums(g, dtype):
    """dbias: the sums over the rows of g viewed as 2-D (M, N), in float64, rounded once to ``dtype``
    (the kernels add in fp32; compare with a tolerance)."""
    g = np.asarray(g, np.float64)
    n = g.shape[-1] if g.ndim else 1
    with np.errstate(over="ignore", invalid="ignore"):
        return g.reshape(-1, n).sum(axis=0).astype(dtype)


def _cast_both(v, fmt, scale, amax_epsilon, power_of_2_scales):
    if scale is None:
        data, sinv, a, _ = quantize_current(v, fmt, amax_epsilon, power_of_2_scales)
    else:
        data, sinv, a = quantize_delayed(v, scale, fmt)
    return data, transpose_2d(data), sinv, a


def cast_transpose_dbias(dy, fmt="e5m2", scale=None, amax_epsilon=0.0, power_of_2_scales=False):
    """FP8 bytes of dy (row-wise and transposed), scale_inv, amax and dbias (column sums of dy in dy's
    dtype) -> (data, data_t, scale_inv, amax, dbias). ``scale`` None: current scaling."""
    dy = np.asarray(dy)
    data, data_t, sinv, a = _cast_both(dy, fmt, scale, amax_epsilon, power_of_2_scales)
    return data, data_t, sinv, a, column_sums(dy.astype(F32), dy.dtype)


def dact_cast_transpose(dy, x, activation="gelu", fmt="e5m2", scale=None, amax_epsilon=0.0,
                        power_of_2_scales=False):
    """FP8 bytes of g = dy * act'(x) (row-wise and transposed), scale_inv, amax of g and dbias (column
    sums of g in dy's dtype) -> (data, data_t, scale_inv, amax, dbias). ``scale`` None: current scaling.
    Gated kinds: g of x's shape (dact_values)."""
    dy = np.asarray(dy)
    g = dact_values(dy, x, activation)
    data, data_t, sinv, a = _cast_both(g, fmt, scale, amax_epsilon, power_of_2_scales)
    return data, data_t, sinv, a, column_sums(g, dy.dtype)
