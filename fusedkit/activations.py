"""Public activations: GeLU (tanh / erf), SiLU, ReLU, squared ReLU and the gated SwiGLU, GeGLU, ReGLU,
forward and backward, on every backend (CPU reference for host arrays, cuda/activations.cu on CuPy
and CUDA torch arrays, buffer callbacks for JAX GPU arrays; ``fusedkit.jax`` has differentiable
versions that also run under ``jax.jit``).

Gated forms take x of last dim 2H, split as ``a, g = x[..., :H], x[..., H:]`` (Transformer Engine's
layout), and return ``act(a) * g`` of last dim H. ``bias`` (optional, x's dtype, shape of x's last
dim) is added to the input first (TE's bias-GeLU fusion). Math in fp32, one rounding to the output.
"""
from __future__ import annotations

from . import _dtypes, _interop
from .reference import activations as _ref

_GELU = {"tanh": "gelu_tanh", "none": "gelu_erf", "erf": "gelu_erf"}


def _kind_for(approximate, base):
    try:
        return base + "_" + _GELU[approximate].split("_")[1]
    except KeyError:
        raise ValueError(f"fusedkit: approximate must be 'tanh' or 'none' (erf), got {approximate!r}") from None


def _validate(x, bias, kind):
    if len(x.shape) == 0:
        raise ValueError("fusedkit: activations need at least one dimension")
    x_dt = _dtypes.canonical(x.dtype)
    if x_dt not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"fusedkit: activations take float32, float16 or bfloat16, got {x_dt}")
    N = x.shape[-1]
    if kind in _ref.GATED and N % 2:
        raise ValueError(f"fusedkit: {kind} splits the last dim in two halves; it must be even, got {N}")
    if bias is not None and (tuple(bias.shape) != (N,) or _dtypes.canonical(bias.dtype) != x_dt):
        raise ValueError(f"fusedkit: `bias` must be {x_dt} of shape ({N},), got {tuple(bias.shape)} "
                         f"{_dtypes.canonical(bias.dtype)}")
    return x_dt, N


def _forward(x, kind, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    kind_call = _interop.framework(x)
    _interop.check_same_framework(kind_call, (("bias", bias),))
    x_dt, N = _validate(x, bias, kind)
    if fp8_fmt is not None or fp8_scale is not None or fp8_amax_out is not None:
        if fp8_fmt is None or fp8_scale is None or out_dtype is not None:
            raise ValueError("fusedkit: FP8 output needs both fp8_fmt and fp8_scale, and no out_dtype "
                             "(fp8_amax_out goes with them)")
        return _forward_fp8(x, kind, bias, fp8_fmt, _interop.plain_scalar(fp8_scale), kind_call, x_dt, N,
                            fp8_amax_out)
    o_dt = x_dt if out_dtype is None else _dtypes.canonical(out_dtype)
    if kind_call in _interop.HOST_KINDS:
        return _interop.run_on_host(lambda x_, b_: _ref.forward(x_, kind, b_, _dtypes.numpy_dtype(o_dt)),
                                    kind_call, (x, bias), {})
    if kind_call == _interop.JAX:
        from .jax import _prims
        return _prims.act_forward(x, bias, kind, o_dt)
    from .backends import cuda_activations

    X = _interop.view(x, kind_call, "x")
    B = _interop.view(bias, kind_call, "bias") if bias is not None else None
    _interop.same_device([X] + ([B] if B else []))
    H = N // 2 if kind in _ref.GATED else N
    M = X.size // N
    y, yp = _interop.empty(kind_call, X, tuple(X.shape[:-1]) + (H,), o_dt)
    if M and H:
        cuda_activations.forward(X.ptr, B.ptr if B else 0, yp, M, H, x_dt, o_dt, kind, X.device,
                                 _interop.stream(kind_call, X.device))
    return y


def _forward_fp8(x, kind, bias, fmt, scale, kind_call, x_dt, N, amax_out=None):
    """act(...) cast to FP8 with a delayed scale in the same pass -> FP8Tensor (amax of the fp32
    activation, merged into ``amax_out`` when given (fusedkit.fp8._amax); scale_inv = 1 / scale)."""
    import numpy as np

    from .fp8 import _amax
    from .fp8.formats import as_format
    from .fp8.tensor import FP8Tensor
    from .reference import fp8 as _ref_fp8
    f = as_format(fmt)
    if kind_call in _interop.HOST_KINDS:
        xa = _interop.to_numpy(x, kind_call)
        ba = _interop.to_numpy(bias, kind_call) if bias is not None else None
        y32 = _ref.forward(xa, kind, ba, np.float32)
        data, sinv, amax = _ref_fp8.quantize_delayed(y32, np.float32(np.asarray(scale).reshape(())), f)
        if amax_out is not None:
            amax = _amax.merge_host(amax_out, amax, kind_call, "fusedkit: fp8_amax_out")
        return FP8Tensor(_interop.from_numpy(data, kind_call), sinv, f, amax)
    if kind_call == _interop.JAX:  # an XLA buffer callback (fusedkit/jax/_fp8.py)
        from .jax import _fp8
        if amax_out is not None:
            _amax.check(amax_out, kind_call, "fusedkit: fp8_amax_out")  # raises: JAX arrays are immutable
        data, sinv, amax = _fp8.act_forward(x, bias, _fp8.scale_array(scale, "fusedkit", "fp8_scale"), kind, f.name)
        return FP8Tensor(data, sinv, f, amax)
    from .backends import cuda_activations

    X = _interop.view(x, kind_call, "x")
    B = _interop.view(bias, kind_call, "bias") if bias is not None else None
    _interop.same_device([X] + ([B] if B else []))
    H = N // 2 if kind in _ref.GATED else N
    M = X.size // N
    data, dp = _interop.empty(kind_call, X, tuple(X.shape[:-1]) + (H,), "uint8")
    sinv, sip = _interop.empty(kind_call, X, (1,), "float32")
    amax, ap = _amax.device_target(amax_out, kind_call, X, "fusedkit: fp8_amax_out")
    if hasattr(scale, "shape"):
        S = _interop.view(scale, kind_call, "fp8_scale")
        if S.size != 1 or S.dtype != "float32":
            raise ValueError("fusedkit: `fp8_scale` must be a float or a 1-element float32 array")
        keep, sp = scale, S.ptr
    else:
        keep, sp = _interop.full(kind_call, X, (1,), "float32", float(scale))
    cuda_activations.forward_fp8(X.ptr, B.ptr if B else 0, dp, sp, sip, ap, M, H, x_dt, f.name, kind,
                                 X.device, _interop.stream(kind_call, X.device))
    del keep  # the launch is queued on the stream; the allocator orders the reuse after it
    return FP8Tensor(data, sinv, f, amax)


def _backward(dy, x, kind, bias=None):
    kind_call = _interop.framework(x)
    _interop.check_same_framework(kind_call, (("dy", dy), ("bias", bias)))
    x_dt, N = _validate(x, bias, kind)
    H = N // 2 if kind in _ref.GATED else N
    want = tuple(x.shape[:-1]) + (H,)
    if tuple(dy.shape) != want or _dtypes.canonical(dy.dtype) != x_dt:
        raise ValueError(f"fusedkit: `dy` must be {x_dt} of shape {want} (the forward's output), got "
                         f"{tuple(dy.shape)} {_dtypes.canonical(dy.dtype)}")
    if kind_call in _interop.HOST_KINDS:
        return _interop.run_on_host(lambda d_, x_, b_: _ref.backward(d_, x_, kind, b_), kind_call,
                                    (dy, x, bias), {})
    if kind_call == _interop.JAX:
        from .jax import _prims
        return _prims.act_backward(dy, x, bias, kind)
    from .backends import cuda_activations

    X = _interop.view(x, kind_call, "x")
    DY = _interop.view(dy, kind_call, "dy")
    B = _interop.view(bias, kind_call, "bias") if bias is not None else None
    _interop.same_device([X, DY] + ([B] if B else []))
    M = X.size // N
    dx, dxp = _interop.empty(kind_call, X, X.shape, x_dt)
    if M and H:
        cuda_activations.backward(DY.ptr, X.ptr, B.ptr if B else 0, dxp, M, H, x_dt, kind, X.device,
                                  _interop.stream(kind_call, X.device))
    return dx


def gelu(x, *, approximate="tanh", bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """GeLU of ``x + bias``: ``approximate="tanh"`` (default, as in Transformer Engine) or ``"none"``
    (exact, with erf). With ``fp8_fmt`` ("e4m3"/"e5m2") and ``fp8_scale`` (delayed scale: a float or a
    1-element fp32 array) the result is an FP8Tensor cast in the same pass (amax fused), as every
    activation here accepts; ``fp8_amax_out`` (a 1-element fp32 array of x's framework, e.g. a slot of an
    amax history) takes the amax merged into it (``max``) instead of a new array."""
    return _forward(x, _kind_for(approximate, "gelu"), bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def gelu_backward(dy, x, *, approximate="tanh", bias=None):
    """Gradient of ``gelu`` with respect to x (and to the bias: sum it over the leading dims)."""
    return _backward(dy, x, _kind_for(approximate, "gelu"), bias)


def silu(x, *, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    return _forward(x, "silu", bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def silu_backward(dy, x, *, bias=None):
    return _backward(dy, x, "silu", bias)


def relu(x, *, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    return _forward(x, "relu", bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def relu_backward(dy, x, *, bias=None):
    return _backward(dy, x, "relu", bias)


def squared_relu(x, *, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """``max(x + bias, 0) ** 2``."""
    return _forward(x, "squared_relu", bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def squared_relu_backward(dy, x, *, bias=None):
    return _backward(dy, x, "squared_relu", bias)


def swiglu(x, *, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """``silu(a) * g`` with ``a, g`` the halves of x's last dim."""
    return _forward(x, "swiglu", bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def swiglu_backward(dy, x, *, bias=None):
    """Gradient of ``swiglu`` with respect to x (both halves, x's shape)."""
    return _backward(dy, x, "swiglu", bias)


def geglu(x, *, approximate="tanh", bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """``gelu(a) * g`` with ``a, g`` the halves of x's last dim."""
    return _forward(x, _kind_for(approximate, "geglu"), bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def geglu_backward(dy, x, *, approximate="tanh", bias=None):
    return _backward(dy, x, _kind_for(approximate, "geglu"), bias)


def reglu(x, *, bias=None, out_dtype=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """``relu(a) * g`` with ``a, g`` the halves of x's last dim."""
    return _forward(x, "reglu", bias, out_dtype, fp8_fmt, fp8_scale, fp8_amax_out)


def reglu_backward(dy, x, *, bias=None):
    return _backward(dy, x, "reglu", bias)
