"""``fusedkit.quantize`` / ``fusedkit.cast_transpose`` / ``fusedkit.dequantize`` (per-tensor scaling).

quantize(x, fmt="e4m3", scale=None, recipe=None, transpose=False) -> FP8Tensor
  * ``scale`` given (a float, or a 1-element fp32 array of x's framework, e.g. from an amax history):
    the delayed-scaling cast ``sat(x * scale)``.
  * otherwise current scaling (``recipe`` a CurrentScaling for epsilon / power-of-2 scales).
  ``.data`` holds the FP8 bytes (uint8, x's shape), ``.scale_inv`` and ``.amax`` are fp32 (1-element
  arrays on the device, fp32 scalars on the host). With ``transpose=True`` (or ``cast_transpose``),
  ``.data_t`` also holds the transposed bytes: x viewed as 2-D (M = product of the leading dims, N)
  gives ``data_t`` of shape (N, M), written in the same pass (Transformer Engine's layout for the
  weight-gradient GEMM).
NumPy (and CPU torch/JAX) inputs use the CPU reference; CuPy and CUDA torch inputs the kernels of
cuda/fp8_cast.cu (quantize: byte-exact on the H200; cast-transpose: GPU tests pending).
"""
from __future__ import annotations

import numpy as np

from .. import _dtypes, _interop
from ..reference import fp8 as _ref
from .formats import as_format
from .recipes import BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, delayed_scale, update_amax_history
from .tensor import FP8Tensor

_HOST = _interop.HOST_KINDS


def cast_transpose(x, *, fmt="e4m3", scale=None, recipe=None) -> FP8Tensor:
    """``quantize(x, ..., transpose=True)``: row-wise and transposed FP8 bytes in one pass."""
    return quantize(x, fmt=fmt, scale=scale, recipe=recipe, transpose=True)


def quantize(x, *, fmt="e4m3", scale=None, recipe=None, transpose=False, weight=False) -> FP8Tensor:
    """FP8-quantize ``x`` with a per-tensor scale: delayed (``scale`` given) or current scaling;
    ``transpose=True`` also writes the transposed bytes (``.data_t``, (N, M)). With ``recipe`` an
    ``MXFP8Scaling`` or a ``BlockScaling``, block-scaled bytes and per-block scales; ``weight=True``
    takes a BlockScaling's weight blocks (128 x 128) instead of its activation blocks (1 x 128)."""
    f = as_format(fmt)
    if isinstance(recipe, (MXFP8Scaling, BlockScaling)):
        if scale is not None or transpose:
            raise ValueError("fusedkit.quantize: block-scaled recipes take no `scale` and no `transpose`")
        return _quantize_blocks(x, f, recipe, weight)
    if recipe is not None and not isinstance(recipe, CurrentScaling):
        raise TypeError("fusedkit.quantize: recipe must be CurrentScaling, MXFP8Scaling or BlockScaling; "
                        "for delayed scaling pass the scale from your amax history as `scale=`")
    rec = recipe or CurrentScaling()
    kind = _interop.framework(x)
    x_dt = _dtypes.canonical(x.dtype)
    if kind in _HOST:
        xa = _interop.to_numpy(x, kind)
        if scale is not None:
            data, sinv, amax = _ref.quantize_delayed(xa, np.float32(np.asarray(scale).reshape(())), f)
        else:
            data, sinv, amax, _ = _ref.quantize_current(xa, f, rec.amax_epsilon, rec.power_of_2_scales)
        data_t = _interop.from_numpy(_ref.transpose_2d(data), kind) if transpose else None
        return FP8Tensor(_interop.from_numpy(data, kind), sinv, f, amax, data_t=data_t)  # x's framework
    if kind == _interop.JAX:
        raise NotImplementedError("fusedkit.quantize on JAX arrays is not implemented yet (issue 4)")
    from ..backends import cuda_fp8

    X = _interop.view(x, kind, "x")
    data, dp = _interop.empty(kind, X, X.shape, "uint8")
    sinv, sp = _interop.empty(kind, X, (1,), "float32")
    amax, ap = _interop.full(kind, X, (1,), "float32", 0.0)  # kernels merge into it (atomicMax)
    current = scale is None
    if current:       # the amax pass fills `amax`, the cast derives the scale from it
        _, scp = _interop.empty(kind, X, (1,), "float32")
        ptrs = dict(scale=0, amax_in=ap, scale_out=scp, amax_out=0)
    elif hasattr(scale, "shape"):
        if _interop.framework(scale) != kind:
            raise TypeError(f"fusedkit.quantize: `scale` must be a {kind} array like x, or a float")
        S = _interop.view(scale, kind, "scale")
        if S.size != 1 or S.dtype != "float32":
            raise ValueError("fusedkit.quantize: `scale` must be a float or a 1-element float32 array")
        ptrs = dict(scale=S.ptr, amax_in=0, scale_out=0, amax_out=ap)
    else:
        _, scp = _interop.full(kind, X, (1,), "float32", float(scale))
        ptrs = dict(scale=scp, amax_in=0, scale_out=0, amax_out=ap)
    # launched for empty tensors too: block 0 writes scale_inv (and the current-scaling scale)
    args = (ptrs["scale"], ptrs["amax_in"], ptrs["scale_out"], sp, ptrs["amax_out"])
    opts = (x_dt, f.name, current, rec.amax_epsilon, int(rec.power_of_2_scales), X.device,
            _interop.stream(kind, X.device))
    if not transpose:
        cuda_fp8.quantize(X.ptr, dp, *args, X.size, *opts)
        return FP8Tensor(data, sinv, f, amax)
    N = X.shape[-1] if X.shape else 1
    M = X.size // N if N else 0
    data_t, dtp = _interop.empty(kind, X, (N, M), "uint8")
    cuda_fp8.cast_transpose(X.ptr, dp, dtp, *args, M, N, *opts)
    return FP8Tensor(data, sinv, f, amax, data_t=data_t)


def _quantize_blocks(x, f, recipe, weight=False) -> FP8Tensor:
    """Block scaling: MXFP8 (32-element blocks along the last dim, E8M0 scale bytes), 1 x 128 blocks
    (activations and gradients) or 128 x 128 blocks (weights, ``weight=True``), fp32 power-of-two
    scale_inv per block."""
    mx = isinstance(recipe, MXFP8Scaling)
    block = recipe.block if mx else (recipe.weight_block if weight else recipe.activation_block)
    if mx and block != 32:
        raise ValueError(f"fusedkit.quantize: MXFP8 blocks are 32 elements, got {block}")
    kind = _interop.framework(x)
    if kind in _HOST:
        xa = _interop.to_numpy(x, kind)
        if mx:
            data, sc = _ref.quantize_mxfp8(xa, f, 32)
        else:
            data, sc = _ref.quantize_blockwise(xa, tuple(block), f)
        return FP8Tensor(_interop.from_numpy(data, kind), _interop.from_numpy(sc, kind), f,
                         mode="mxfp8" if mx else "block", block=32 if mx else tuple(block))
    if kind == _interop.JAX:
        raise NotImplementedError("fusedkit.quantize on JAX arrays is not implemented yet (issue 4)")
    if not mx and tuple(block) not in ((1, 128), (128, 128)):
        raise ValueError(f"fusedkit.quantize: block scaling supports 1 x 128 and 128 x 128 blocks on the GPU, "
                         f"got {tuple(block)}")
    from ..backends import cuda_fp8

    X = _interop.view(x, kind, "x")
    if not mx and len(X.shape) != 2:
        raise ValueError(f"fusedkit: block scaling takes a 2-D array, got shape {X.shape}")
    K = X.shape[-1] if X.shape else 1
    M = X.size // K if K else 0
    bpr = -(-K // (32 if mx else 128))
    data, dp = _interop.empty(kind, X, X.shape, "uint8")
    if not mx and tuple(block) == (128, 128):
        sc, sp = _interop.empty(kind, X, (-(-M // 128), bpr), "float32")
        if M and K:
            cuda_fp8.quantize_blocks_2d(X.ptr, dp, sp, M, K, X.dtype, f.name, X.device,
                                        _interop.stream(kind, X.device))
        return FP8Tensor(data, sc, f, mode="block", block=(128, 128))
    sc, sp = _interop.empty(kind, X, tuple(X.shape[:-1]) + (bpr,), "uint8" if mx else "float32")
    if M and K:
        cuda_fp8.quantize_blocks(X.ptr, dp, sp, M, K, X.dtype, f.name, mx, X.device,
                                 _interop.stream(kind, X.device))
    return FP8Tensor(data, sc, f, mode="mxfp8" if mx else "block", block=32 if mx else (1, 128))


def update_scales(history, scale, scale_inv=None, *, recipe=None, fmt="e4m3"):
    """One delayed-scaling step for n tensors at once, in place: ``history`` (L x n fp32, row 0 the
    latest amax of each tensor), ``scale`` and optional ``scale_inv`` (n fp32). Takes amax as the
    history's max (or row 0 with ``amax_compute_algo="most_recent"``), rolls the history (row 0 is
    zeroed for the next step) and sets ``scale = fp8_max / amax / 2**margin`` (the previous scale kept
    for an amax of 0, inf or NaN), ``scale_inv = 1 / scale``. One kernel launch on device arrays."""
    rec = recipe or DelayedScaling()
    if not isinstance(rec, DelayedScaling):
        raise TypeError("fusedkit.fp8.update_scales: recipe must be a DelayedScaling")
    f = as_format(fmt)
    if len(history.shape) != 2:
        raise ValueError(f"fusedkit: history must be 2-D (history_len, n_tensors), got {tuple(history.shape)}")
    L, n = (int(d) for d in history.shape)
    arrays = (("history", history, (L, n)), ("scale", scale, (n,))) + \
        ((("scale_inv", scale_inv, (n,)),) if scale_inv is not None else ())
    for name, a, shape in arrays:
        if tuple(a.shape) != shape or _dtypes.canonical(a.dtype) != "float32":
            raise ValueError(f"fusedkit: `{name}` must be float32 of shape {shape}, got "
                             f"{tuple(a.shape)} {_dtypes.canonical(a.dtype)}")
    kind = _interop.framework(history)
    if kind == "host":
        new, amax = update_amax_history(history, rec.amax_compute_algo)
        history[...] = new
        scale[...] = delayed_scale(amax, scale, f.max, rec.margin)
        if scale_inv is not None:
            scale_inv[...] = np.float32(1.0) / scale
        return history, scale, scale_inv
    if kind not in (_interop.CUPY, _interop.TORCH):
        raise TypeError(f"fusedkit.fp8.update_scales takes NumPy, CuPy or CUDA torch arrays, got {kind}")
    from ..backends import cuda_fp8

    H = _interop.view(history, kind, "history")
    S = _interop.view(scale, kind, "scale")
    SI = _interop.view(scale_inv, kind, "scale_inv") if scale_inv is not None else None
    _interop.same_device([H, S] + ([SI] if SI else []))
    if n:
        cuda_fp8.update_scales(H.ptr, S.ptr, SI.ptr if SI else 0, L, n, f.max, rec.margin,
                               rec.amax_compute_algo == "most_recent", H.device, _interop.stream(kind, H.device))
    return history, scale, scale_inv


def dequantize(t: FP8Tensor, dtype="float32"):
    """FP8Tensor -> values in ``dtype`` (host tensors and CUDA torch tensors)."""
    if isinstance(t.data, np.ndarray):
        return t.dequantize(_dtypes.numpy_dtype(_dtypes.canonical(dtype)))
    if type(t.data).__module__.split(".")[0] == "torch" and not t.data.is_cuda:
        return _interop.from_numpy(t.dequantize(_dtypes.numpy_dtype(_dtypes.canonical(dtype))), "torch_cpu")
    if type(t.data).__module__.split(".")[0] == "torch":
        import torch
        fp8 = torch.float8_e4m3fn if t.fmt.name == "e4m3" else torch.float8_e5m2
        return (t.data.view(fp8).float() * t.scale_inv).to(getattr(torch, _dtypes.canonical(dtype)))
    raise NotImplementedError("fusedkit.dequantize on CuPy arrays is not implemented yet (issue 4)")
