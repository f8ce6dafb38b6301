"""``fusedkit.fp8_gemm``: C = A @ B.T of FP8 operands (TN layout), fp32 accumulation, fused epilogue.

Layout and scaling rules (docs/fp8_gemm.rst):
  * ``a``: FP8Tensor of shape (M, K), ``b``: FP8Tensor of shape (N, K), both row-major ("K-major", the
    layout of a ``torch.nn.Linear`` weight): ``C[m, n] = sum_k A[m, k] B[n, k]``, cuBLASLt's FP8 "TN".
  * M, N and K must be multiples of 16 (else a ValueError says how to pad).
  * Scaling: both per-tensor (``scale_inv`` one fp32 each), or block scaling (DeepSeek): ``a`` quantized
    with 1 x 128 blocks (scale_inv (M, ceil(K/128))), ``b`` with 128 x 128 blocks (scale_inv
    (ceil(N/128), ceil(K/128))): ``quantize(x, recipe=BlockScaling())`` and
    ``quantize(w, recipe=BlockScaling(), weight=True)``.
  * Epilogue (cuBLASLt's order): ``out = act(A_deq @ B_deq.T + accumulate_into + bias)``, then cast to
    ``out_dtype``: "bfloat16", "float32", or an FP8 format ("e4m3" / "e5m2"), for which ``out_scale``
    is required and an FP8Tensor comes back (``scale_inv = 1 / out_scale``, ``amax`` = max |out| before
    the scale, for the next delayed-scaling step).
Backends: NumPy (and CPU torch / JAX) inputs run the float64 reference (fusedkit.reference.gemm); CUDA
inputs (CuPy, torch) run cuda/fp8_gemm_sm90.cu on compute capability 9.0, and elsewhere a fallback with
the same numerics (dequantize, fp32 matmul through CuPy/cuBLAS, the epilogue in fp32). JAX GPU arrays
and traced values inside ``jax.jit`` run the sm_90 kernel through an XLA buffer callback on XLA's
stream (the reference under jit on the CPU); there ``accumulate_into`` is read, not updated (JAX arrays
are immutable): the sum comes back as a new array.
"""
from __future__ import annotations

import numpy as np

from .. import _callcache, _dtypes, _interop
from .._launch import cupy_stream
from ..reference import gemm as _ref
from .formats import as_format
from .tensor import FP8Tensor, host_copy, host_scale

_HOST = _interop.HOST_KINDS
WHO = "fusedkit.fp8_gemm"


def _mode(a: FP8Tensor, b: FP8Tensor) -> str:
    if a.mode == "tensor" and b.mode == "tensor":
        return "tensor"
    if a.mode == "block" and b.mode == "block" and tuple(a.block) == (1, 128) and tuple(b.block) == (128, 128):
        return "block"
    raise ValueError(f"{WHO}: supported scalings are per-tensor x per-tensor and block scaling with `a` in "
                     f"1 x 128 blocks and `b` in 128 x 128 blocks (quantize(x, recipe=BlockScaling()), "
                     f"quantize(w, recipe=BlockScaling(), weight=True)); got a: {a.mode} {a.block}, "
                     f"b: {b.mode} {b.block}")


def _shapes(a, b):
    if not isinstance(a, FP8Tensor) or not isinstance(b, FP8Tensor):
        raise TypeError(f"{WHO}: `a` and `b` must be FP8Tensors (fusedkit.quantize(...)), got "
                        f"{type(a).__name__} and {type(b).__name__}")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"{WHO}: `a` must be 2-D (M, K) and `b` 2-D (N, K); got {a.shape} and {b.shape} "
                         f"(reshape a batch to 2-D first)")
    for name, t in (("a", a), ("b", b)):
        dt = str(t.data.dtype).replace("torch.", "")
        if dt != "uint8":
            raise TypeError(f"{WHO}: `{name}.data` must hold FP8 bytes (uint8), got {dt}")
    (M, K), (N, Kb) = a.shape, b.shape
    if K != Kb:
        raise ValueError(f"{WHO}: computes a @ b.T with a (M, K) and b (N, K), both K-major (TN layout); "
                         f"the K dims differ: a {a.shape}, b {b.shape}. For a weight stored (K, N), "
                         f"pass its transpose (quantize with transpose=True and use .data_t)")
    bad = [f"{n}={v}" for n, v in (("M", M), ("N", N), ("K", K)) if v % 16]
    if bad:
        raise ValueError(f"{WHO}: M, N and K must be multiples of 16, got {', '.join(bad)} (a {a.shape}, "
                         f"b {b.shape}). Pad with zeros to the next multiple of 16 before quantizing (zero "
                         f"rows of a / b and zero columns along K change nothing; FP8 zero is byte 0), "
                         f"e.g. torch.nn.functional.pad(x, (0, -K % 16, 0, -M % 16)), and slice the "
                         f"result [:M, :N]")
    return M, N, K


def _act_id(activation):
    if activation is None:
        return -1
    try:
        return _ref.ACTIVATIONS[activation]
    except (KeyError, TypeError):
        raise ValueError(f"{WHO}: activation must be None or one of {', '.join(_ref.ACTIVATIONS)}, "
                         f"got {activation!r}") from None


def _dtype_name(x) -> str:
    try:
        return _dtypes.canonical(x.dtype)
    except TypeError:
        return str(x.dtype).replace("torch.", "")


def _check_options(M, N, out_kind, bias, out_scale, accumulate_into):
    fp8_out = out_kind in ("e4m3", "e5m2")
    if fp8_out and out_scale is None:
        raise ValueError(f"{WHO}: an FP8 output ({out_kind}) needs `out_scale` (a float, or a 1-element "
                         f"float32 array, e.g. the layer's delayed-scaling scale)")
    if not fp8_out and out_scale is not None:
        raise ValueError(f"{WHO}: `out_scale` applies only to FP8 outputs (out_dtype='e4m3' / 'e5m2'), "
                         f"not {out_kind}")
    if bias is not None:
        if tuple(bias.shape) != (N,):
            raise ValueError(f"{WHO}: `bias` must have shape (N,) = ({N},), got {tuple(bias.shape)}")
        bd = _dtype_name(bias)
        if bd not in ("float32", "bfloat16"):
            raise TypeError(f"{WHO}: `bias` must be float32 or bfloat16, got {bd}")
    if accumulate_into is not None:
        if fp8_out:
            raise ValueError(f"{WHO}: accumulate_into needs a bfloat16 or float32 output, not {out_kind}")
        if tuple(accumulate_into.shape) != (M, N):
            raise ValueError(f"{WHO}: `accumulate_into` must have shape (M, N) = ({M}, {N}), got "
                             f"{tuple(accumulate_into.shape)}")
        cd = _dtype_name(accumulate_into)
        if cd != out_kind:
            raise TypeError(f"{WHO}: `accumulate_into` is {cd} but out_dtype is {out_kind}; they must match")
    return fp8_out


def fp8_gemm(a: FP8Tensor, b: FP8Tensor, *, out_dtype="bfloat16", bias=None, activation=None, out_scale=None,
             accumulate_into=None, use_split_accumulator=True):
    """``act(a @ b.T + accumulate_into + bias)`` of FP8 operands ``a`` (M, K) and ``b`` (N, K), fp32
    accumulation (module docstring for layout and scaling rules).

    ``out_dtype``: "bfloat16" (default), "float32", "e4m3" or "e5m2" (FP8: give ``out_scale``; the
    result is an FP8Tensor with ``amax`` of the output). ``bias``: (N,) float32 or bfloat16.
    ``activation``: None, "gelu" (tanh form), "gelu_tanh", "gelu_erf", "relu", "silu", "squared_relu".
    ``accumulate_into``: an (M, N) array of out_dtype, updated in place and returned (C += A B^T).
    ``use_split_accumulator`` (per-tensor scaling): True promotes the tensor-core partial sums into an
    fp32 accumulator every 128 K (more accurate, TE's default for forward GEMMs); False keeps one
    accumulator over K (faster, "fast accumulation"). Block scaling always promotes every 128 K."""
    out = _callcache.fp8_gemm(a, b, out_dtype, bias, activation, out_scale, accumulate_into, use_split_accumulator)
    if out is not None:  # a repeat call of a signature that launched before (fusedkit/_callcache.py)
        return out
    M, N, K = _shapes(a, b)
    mode = _mode(a, b)
    out_kind = _ref.out_kind(out_dtype)
    act = _act_id(activation)
    _check_options(M, N, out_kind, bias, out_scale, accumulate_into)
    kind = _interop.framework(a.data)
    _interop.check_same_framework(kind, (("b.data", b.data), ("bias", bias), ("accumulate_into", accumulate_into)))
    kw = dict(out_dtype=out_kind, activation=activation, use_split_accumulator=use_split_accumulator)
    if kind in _HOST:
        return _host(a, b, kind, bias, out_scale, accumulate_into, kw)
    if kind == _interop.JAX:
        return _jax(a, b, M, N, K, mode, out_kind, act, bias, out_scale, accumulate_into, use_split_accumulator,
                    activation)
    res, launch = _device(a, b, kind, M, N, K, mode, out_kind, act, bias, out_scale, accumulate_into,
                          use_split_accumulator, activation)
    if launch is not None:
        _callcache.remember_gemm(a, b, out_dtype, bias, activation, out_scale, accumulate_into,
                                 use_split_accumulator, launch, launch.device, M, N, out_kind)
    return res


def _host(a, b, kind, bias, out_scale, accumulate_into, kw):
    acc = _interop.to_numpy(accumulate_into, kind) if accumulate_into is not None else None
    res = _ref.fp8_gemm(host_copy(a, kind), host_copy(b, kind),
                        bias=_interop.to_numpy(bias, kind) if bias is not None else None,
                        out_scale=None if out_scale is None else np.asarray(host_scale(out_scale, kind)),
                        accumulate_into=acc, **kw)
    if accumulate_into is not None:
        return accumulate_into  # written in place through the shared-memory view
    if isinstance(res, FP8Tensor):
        return FP8Tensor(_interop.from_numpy(res.data, kind), res.scale_inv, res.fmt, res.amax)
    return _interop.from_numpy(res, kind)


# ----------------------------------------------------------------------------------------------------
# JAX GPU arrays and tracers: an XLA buffer callback around the same kernel (fusedkit/jax/_fp8.py)

def _jax(a, b, M, N, K, mode, out_kind, act, bias, out_scale, accumulate_into, split, activation):
    import jax.numpy as jnp

    from ..backends import cuda_gemm
    from ..jax import _fp8
    pair = (a.fmt.name, b.fmt.name)
    if pair not in cuda_gemm.PAIRS:
        raise NotImplementedError(f"{WHO} on JAX arrays: the kernel takes the format pairs "
                                  f"{', '.join(f'{x} x {y}' for x, y in cuda_gemm.PAIRS)}, got {pair[0]} x {pair[1]}")
    if K == 0:
        raise ValueError(f"{WHO} on JAX arrays needs K > 0 (the product of an empty K is the epilogue alone)")

    def blocks(t, shape, what):
        s = t.scale_inv
        if not hasattr(s, "shape") or _interop.framework(s) not in _interop.JAX_KINDS:
            raise TypeError(f"{WHO}: the block scales of `{what}` must be a JAX array like its data")
        if tuple(s.shape) != shape or _dtype_name(s) != "float32":
            raise ValueError(f"{WHO}: `{what}.scale_inv` must be float32 of shape {shape}, got "
                             f"{tuple(s.shape)} {_dtype_name(s)}")
        return s

    if mode == "tensor":
        sa, sb = _fp8.scale_array(a.scale_inv, WHO, "a.scale_inv"), _fp8.scale_array(b.scale_inv, WHO, "b.scale_inv")
    else:
        kb = -(-K // 128)
        sa, sb = blocks(a, (M, kb), "a"), blocks(b, (-(-N // 128), kb), "b")
    fp8_out = out_kind in ("e4m3", "e5m2")
    os_ = _fp8.scale_array(out_scale, WHO, "out_scale") if fp8_out else None
    key = (M, N, K, pair[0], pair[1], mode, out_kind, None if bias is None else _dtype_name(bias), activation, act,
           accumulate_into is not None, bool(split))
    out, amax = _fp8.gemm(a.data, b.data, sa, sb, bias, os_, accumulate_into, key)
    if fp8_out:
        return FP8Tensor(out, (1.0 / os_).astype(jnp.float32), out_kind, amax)
    return out


# ----------------------------------------------------------------------------------------------------
# CUDA inputs

def _scale_ptr(kind, like, s, what):
    """Device pointer of a per-tensor fp32 scale given as a float / NumPy scalar or a 1-element fp32 device
    array of the caller's framework -> (keep-alive object, pointer)."""
    if hasattr(s, "shape") and not isinstance(s, (np.ndarray, np.generic)):
        if _interop.framework(s) != kind:
            raise TypeError(f"{WHO}: `{what}` must be a {kind} array like the operands, or a float")
        S = _interop.view(s, kind, what)
        if S.size != 1 or S.dtype != "float32":
            raise ValueError(f"{WHO}: `{what}` must be a float or a 1-element float32 array")
        return s, S.ptr
    return _interop.full(kind, like, (1,), "float32", float(np.float32(np.asarray(s).reshape(()))))


def _block_scale_ptr(kind, t, shape, what):
    s = t.scale_inv
    if not hasattr(s, "shape") or _interop.framework(s) != kind:
        raise TypeError(f"{WHO}: the block scales of `{what}` must be a {kind} array like its data")
    S = _interop.view(s, kind, f"{what}.scale_inv")
    if tuple(S.shape) != shape or S.dtype != "float32":
        raise ValueError(f"{WHO}: `{what}.scale_inv` must be float32 of shape {shape}, got {S.shape} {S.dtype}")
    return S.ptr


def _device(a, b, kind, M, N, K, mode, out_kind, act, bias, out_scale, accumulate_into, split, activation):
    """(the result, the kernel's cuda_gemm.GemmLaunch or None where no kernel ran)."""
    A = _interop.view(a.data, kind, "a.data")
    B = _interop.view(b.data, kind, "b.data")
    for name, X in (("a", A), ("b", B)):
        if X.dtype != "uint8":
            raise TypeError(f"{WHO}: `{name}.data` must hold FP8 bytes (uint8), got {X.dtype}")
    Bi = _interop.view(bias, kind, "bias") if bias is not None else None
    C = _interop.view(accumulate_into, kind, "accumulate_into") if accumulate_into is not None else None
    _interop.same_device([A, B] + [x for x in (Bi, C) if x is not None])
    dev = A.device
    fp8_out = out_kind in ("e4m3", "e5m2")
    from ..backends import cuda_gemm
    if M == 0 or N == 0:
        return _empty_result(kind, A, M, N, out_kind, out_scale, accumulate_into), None
    pair = (a.fmt.name, b.fmt.name)
    kernel_ok = (K > 0 and pair in cuda_gemm.PAIRS and A.ptr % 16 == 0 and B.ptr % 16 == 0
                 and cuda_gemm.supported(dev))
    if not kernel_ok:
        return _fallback(a, b, kind, mode, out_kind, activation, bias, out_scale, accumulate_into), None
    keep = []
    if mode == "tensor":
        o, sa = _scale_ptr(kind, A, a.scale_inv, "a.scale_inv")
        o2, sb = _scale_ptr(kind, A, b.scale_inv, "b.scale_inv")
        keep += [o, o2]
        gmode = "split" if split else "fast"
    else:
        kb = -(-K // 128)
        sa = _block_scale_ptr(kind, a, (M, kb), "a")
        sb = _block_scale_ptr(kind, b, (-(-N // 128), kb), "b")
        gmode = "block"
    stream = _interop.stream(kind, dev)
    amax = amax_p = 0
    osp = 0
    if fp8_out:
        out, out_p = _interop.empty(kind, A, (M, N), "uint8")
        amax, amax_p = _interop.full(kind, A, (1,), "float32", 0.0)
        o, osp = _scale_ptr(kind, A, out_scale, "out_scale")
        keep.append(o)
    elif C is not None:
        out, out_p = accumulate_into, C.ptr
        if out_p % (8 if out_kind == "float32" else 4):
            raise ValueError(f"{WHO}: `accumulate_into` must be {8 if out_kind == 'float32' else 4}-byte aligned")
    else:
        out, out_p = _interop.empty(kind, A, (M, N), out_kind)
    import cupy
    with cupy.cuda.Device(dev):
        launch = cuda_gemm.plan(M, N, K, pair[0], pair[1], gmode, out_kind, Bi.dtype if Bi else None, act,
                                C is not None, dev)
        cuda_gemm.launch(launch, A.ptr, B.ptr, out_p, Bi.ptr if Bi else 0, sa, sb, osp, amax_p, stream)
    if fp8_out:
        return FP8Tensor(out, _recip(kind, A, out_scale), out_kind, amax), launch
    return out, launch


def _recip(kind, like, s):
    """scale_inv = 1 / out_scale, on the device (no sync)."""
    if hasattr(s, "shape") and not isinstance(s, (np.ndarray, np.generic)):
        # torch: reciprocal() is what 1.0 / s runs (Tensor.__rdiv__), without the Python wrapper
        return (1.0 / s.reshape(1)) if kind == _interop.CUPY else s.reshape(1).float().reciprocal()
    return _interop.full(kind, like, (1,), "float32", float(np.float32(1.0) / np.float32(s)))[0]


def _empty_result(kind, like, M, N, out_kind, out_scale, accumulate_into):
    if accumulate_into is not None:
        return accumulate_into
    if out_kind in ("e4m3", "e5m2"):
        data, _ = _interop.empty(kind, like, (M, N), "uint8")
        amax, _ = _interop.full(kind, like, (1,), "float32", 0.0)
        return FP8Tensor(data, _recip(kind, like, out_scale), out_kind, amax)
    return _interop.empty(kind, like, (M, N), out_kind)[0]


# ----------------------------------------------------------------------------------------------------
# fallback (CUDA, not sm_90): dequantize, fp32 matmul (cuBLAS through CuPy), epilogue in fp32

_LUT: dict = {}


def _lut(fmt, device):
    import cupy
    key = (fmt.name, device)
    t = _LUT.get(key)
    if t is None:
        from ..reference import fp8 as _rf
        t = _LUT[key] = cupy.asarray(_rf.fp8_to_float(np.arange(256, dtype=np.uint8), fmt))
    return t


def _to_cupy_f32(x, kind):
    import cupy
    if kind == _interop.TORCH:
        x = x.float() if x.is_floating_point() else x
        return cupy.from_dlpack(x.contiguous())
    return x.astype(cupy.float32, copy=False) if x.dtype.kind == "f" else x


def _dequant_cupy(t, kind, device):
    import cupy
    data = cupy.from_dlpack(t.data) if kind == _interop.TORCH else t.data
    v = _lut(t.fmt, device)[data]
    s = t.scale_inv
    if t.mode == "tensor":
        if hasattr(s, "shape") and not isinstance(s, (np.ndarray, np.generic)):
            return v * _to_cupy_f32(s, kind).reshape(())
        return v * np.float32(np.asarray(s).reshape(()))
    bm, bk = t.block
    sc = _to_cupy_f32(s, kind)
    sc = cupy.repeat(cupy.repeat(sc, bm, axis=0), bk, axis=1)[: v.shape[0], : v.shape[1]]
    return v * sc


def _act_cupy(v, activation):
    import cupy
    if activation is None:
        return v
    k = {"gelu": "gelu_tanh"}.get(activation, activation)
    if k == "gelu_tanh":
        u = np.float32(np.sqrt(2.0 / np.pi)) * (v + np.float32(0.044715) * v * v * v)
        return v / (1 + cupy.exp(-2 * u))
    if k == "gelu_erf":
        from cupyx.scipy.special import erf
        return np.float32(0.5) * v * (1 + erf(v * np.float32(1 / np.sqrt(2.0))))
    if k == "silu":
        return v / (1 + cupy.exp(-v))
    if k == "relu":
        return cupy.maximum(v, 0)
    return cupy.maximum(v, 0) ** 2


def _fallback(a, b, kind, mode, out_kind, activation, bias, out_scale, accumulate_into):
    import contextlib

    import cupy
    dev = _interop.view(a.data, kind, "a.data").device
    stream = _interop.stream(kind, dev)
    ctx = cupy_stream(stream) if kind == _interop.TORCH else contextlib.nullcontext()
    with cupy.cuda.Device(dev), ctx:
        v = _dequant_cupy(a, kind, dev) @ _dequant_cupy(b, kind, dev).T
        if accumulate_into is not None:
            v += _to_cupy_f32(accumulate_into, kind)
        if bias is not None:
            v += _to_cupy_f32(bias, kind)[None, :]
        v = _act_cupy(v, activation).astype(cupy.float32, copy=False)
        if kind == _interop.TORCH:
            import torch
            res = torch.from_dlpack(v)
        else:
            res = v
        if out_kind in ("e4m3", "e5m2"):
            from .api import quantize
            return quantize(res, fmt=out_kind, scale=out_scale)
        if kind == _interop.TORCH and out_kind == "bfloat16":
            import torch
            res = res.to(torch.bfloat16)
        elif kind == _interop.CUPY and out_kind == "bfloat16":
            raise TypeError("CuPy has no bfloat16 dtype: pass torch arrays for bf16 output, or choose "
                            "out_dtype='float32'")
        if accumulate_into is not None:
            accumulate_into[...] = res
            return accumulate_into
        return res


def dequantized_operands(a, b):
    """(a_deq, b_deq) as float64 NumPy arrays (for tests and tools; host or device FP8Tensors)."""
    def host(t):
        d = t.data
        if not isinstance(d, np.ndarray):
            d = d.get() if hasattr(d, "get") else d.cpu().numpy()
        s = t.scale_inv
        if hasattr(s, "get"):
            s = s.get()
        elif hasattr(s, "cpu"):
            s = s.cpu().numpy()
        return _ref.dequantize_operand(FP8Tensor(d, np.asarray(s), as_format(t.fmt), mode=t.mode, block=t.block))
    return host(a), host(b)
