"""Public LayerNorm / RMSNorm: validation, then the CPU reference or the CUDA kernels.

Shapes: x is (..., N); weight and bias are (N,); statistics (mean, rstd) are fp32 of shape x.shape[:-1].
Results come back in the caller's array type (see _interop.py for the rules).
"""
from __future__ import annotations

from . import _callcache, _dtypes, _interop
from . import reference as _ref
from ._interop import CUPY, JAX, TORCH, framework

_HOST_KINDS = _interop.HOST_KINDS
_check_same_framework = _interop.check_same_framework
_host = _interop.run_on_host


_kind_of_call = _interop.call_kind


def _dt(a) -> str:
    return _dtypes.canonical(a.dtype)


def _validate(x, weight, bias, residual, out_dtype):
    """Checks shared by both backends; returns (x dtype, weight dtype, out dtype, N)."""
    if len(x.shape) == 0:
        raise ValueError("fusedkit: x must have at least one dimension (the normalized one)")
    N = x.shape[-1]
    if N < 1:
        raise ValueError(f"fusedkit: the last dimension of x must be at least 1, got shape {tuple(x.shape)}")
    x_dt = _dt(x)
    w_dt = x_dt
    for name, a in (("weight", weight), ("bias", bias)):
        if a is None:
            continue
        if tuple(a.shape) != (N,):
            raise ValueError(f"fusedkit: `{name}` must have shape ({N},) to match x's last dimension, "
                             f"got {tuple(a.shape)}")
        a_dt = _dt(a)
        if a_dt not in (x_dt, "float32"):
            raise TypeError(f"fusedkit: `{name}` must be float32 or x's dtype {x_dt}, got {a_dt}")
        w_dt = a_dt
    if weight is not None and bias is not None and _dt(weight) != _dt(bias):
        raise TypeError(f"fusedkit: weight ({_dt(weight)}) and bias ({_dt(bias)}) must share a dtype")
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape) or _dt(residual) != x_dt:
            raise ValueError(f"fusedkit: `residual` must match x's shape {tuple(x.shape)} and dtype "
                             f"{x_dt}, got {tuple(residual.shape)} {_dt(residual)}")
    o_dt = x_dt if out_dtype is None else _dtypes.canonical(out_dtype)
    return x_dt, w_dt, o_dt, N


def _fp8_request(fp8_fmt, fp8_scale, out_dtype):
    """The FP8 format of an FP8-output call (None for a plain call), after checking the FP8 arguments."""
    if fp8_fmt is None and fp8_scale is None:
        return None
    if fp8_fmt is None or fp8_scale is None:
        given, missing = ("fp8_fmt", "fp8_scale") if fp8_scale is None else ("fp8_scale", "fp8_fmt")
        raise ValueError(f"fusedkit: FP8 output needs both fp8_fmt ('e4m3' or 'e5m2') and fp8_scale (the "
                         f"delayed scale: a float or a 1-element float32 array); got {given} without {missing}")
    if out_dtype is not None:
        raise ValueError("fusedkit: out_dtype and fp8_fmt exclude each other (with fp8_fmt the output is an "
                         "FP8Tensor of FP8 bytes); drop out_dtype")
    from .fp8.formats import as_format
    f = as_format(fp8_fmt)  # ValueError naming the formats
    if hasattr(fp8_scale, "shape"):
        n = 1
        for d in fp8_scale.shape:
            n *= d
        s_dt = _dtypes.canonical_or_name(fp8_scale.dtype)
        if n != 1 or s_dt != "float32":
            raise ValueError(f"fusedkit: `fp8_scale` must be a float or a 1-element float32 array, got shape "
                             f"{tuple(fp8_scale.shape)} {s_dt}")
        fw = framework(fp8_scale)
        if fw not in _HOST_KINDS:
            return f  # a device value: read by the kernel, never synchronised on
        value = _interop.to_numpy(fp8_scale, fw).reshape(())
    else:
        value = fp8_scale
    import numpy as np
    try:
        with np.errstate(over="ignore"):  # beyond fp32: inf, rejected below
            s = np.float32(value)
    except (TypeError, ValueError):
        raise TypeError(f"fusedkit: `fp8_scale` must be a float or a 1-element float32 array, got "
                        f"{type(fp8_scale).__name__}") from None
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"fusedkit: `fp8_scale` must be a positive finite float32 value (a delayed scale), "
                         f"got {value!r}")
    return f


def _norm_forward(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, return_stats, rms,
                  fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    # (layer_norm / rms_norm try the host fast path of _callcache.py first, before calling this)
    kind = _kind_of_call(x, (weight, bias, residual))
    _check_same_framework(kind, (("weight", weight), ("bias", bias), ("residual", residual)))
    fp8_scale = _interop.plain_scalar(fp8_scale)
    fmt = _fp8_request(fp8_fmt, fp8_scale, out_dtype)
    if fp8_amax_out is not None and fmt is None:
        raise ValueError("fusedkit: fp8_amax_out is the FP8 output's amax: pass it with fp8_fmt and fp8_scale")
    x_dt, w_dt, o_dt, N = _validate(x, weight, bias, residual, out_dtype)
    if eps < 0:
        raise ValueError(f"fusedkit: eps must be >= 0, got {eps}")
    if fmt is not None and kind in _HOST_KINDS:
        return _host_fp8(x, weight, bias, residual, eps, zero_centered_gamma, return_stats, rms, fmt,
                         fp8_scale, kind, fp8_amax_out)
    if fmt is not None and kind == JAX:
        return _jax_fp8(x, weight, bias, residual, eps, zero_centered_gamma, return_stats, rms, fmt, fp8_scale,
                        fp8_amax_out)
    if kind in _HOST_KINDS:
        if rms:
            return _host(_ref.rms_norm, kind, (x, weight),
                         dict(eps=eps, zero_centered_gamma=zero_centered_gamma, out_dtype=_np_dt(out_dtype),
                              return_stats=return_stats, residual=_maybe_np(residual, kind)))
        return _host(_ref.layer_norm, kind, (x, weight, bias),
                     dict(eps=eps, zero_centered_gamma=zero_centered_gamma, out_dtype=_np_dt(out_dtype),
                          return_stats=return_stats, residual=_maybe_np(residual, kind)))
    if kind == JAX:
        from .jax import _prims
        return _prims.norm_forward(x, weight, bias, residual, eps, zero_centered_gamma, o_dt,
                                   return_stats, rms)
    from .backends import cuda_norms

    X = _interop.view(x, kind, "x")
    views = [X]
    W = B = R = None
    if weight is not None:
        W = _interop.view(weight, kind, "weight")
        views.append(W)
    if bias is not None and not rms:
        B = _interop.view(bias, kind, "bias")
        views.append(B)
    if residual is not None:
        R = _interop.view(residual, kind, "residual")
        views.append(R)
    _interop.same_device(views)
    shape = X.shape
    M = X.size // N
    y, yp = _interop.empty(kind, X, shape, o_dt if fmt is None else "uint8")
    h = hp = mean = mp = rstd = rp = None
    if R is not None:
        h, hp = _interop.empty(kind, X, shape, x_dt)
    if return_stats:
        if not rms:
            mean, mp = _interop.empty(kind, X, shape[:-1], "float32")
        rstd, rp = _interop.empty(kind, X, shape[:-1], "float32")
    ptrs = (X.ptr, R.ptr if R else 0, W.ptr if W else 0, B.ptr if B else 0, yp, hp or 0, mp or 0, rp or 0)
    if fmt is not None:
        y = _device_fp8(cuda_norms, kind, X, ptrs, M, N, x_dt, w_dt, fmt, fp8_scale, eps, zero_centered_gamma,
                        rms, y, fp8_amax_out)
    elif M > 0:
        cuda_norms.forward(*ptrs, M, N, x_dt, w_dt, o_dt, float(eps), int(zero_centered_gamma),
                           rms, X.device, _interop.stream(kind, X.device))
        if R is None and kind in (CUPY, TORCH):
            _callcache.remember_norm_forward(x, weight, None if B is None else bias, eps, zero_centered_gamma,
                                             out_dtype, return_stats, rms, kind, X.device, M, N, x_dt, w_dt,
                                             o_dt)
    out = (y,) + ((h,) if h is not None else ())
    if return_stats:
        out += (rstd,) if rms else (mean, rstd)
    return out[0] if len(out) == 1 else out


def _device_fp8(cuda_norms, kind, X, ptrs, M, N, x_dt, w_dt, fmt, scale, eps, zero_centered_gamma, rms, data,
                amax_out=None):
    """The FP8-output forward on the device: y bytes into ``data`` -> FP8Tensor (scale_inv, amax: 1-element
    fp32 arrays of x's framework; the amax ``amax_out`` when given). Launched for M = 0 too (it writes
    scale_inv)."""
    from .fp8 import _amax
    from .fp8.tensor import FP8Tensor
    sinv, sip = _interop.empty(kind, X, (1,), "float32")
    amax, ap = _amax.device_target(amax_out, kind, X, "fusedkit: fp8_amax_out")  # the kernel merges into it
    if hasattr(scale, "shape"):
        if framework(scale) != kind:
            raise TypeError(f"fusedkit: `fp8_scale` is a {framework(scale)} array but x is {kind}; pass a "
                            f"float or a 1-element float32 {kind} array on x's device")
        S = _interop.view(scale, kind, "fp8_scale")
        _interop.same_device([X, S])
        keep, sp = scale, S.ptr
    else:
        import numpy as np
        keep, sp = _interop.full(kind, X, (1,), "float32", float(np.float32(scale)))
    cuda_norms.forward_fp8(*ptrs, sp, sip, ap, M, N, x_dt, w_dt, fmt.name, float(eps), int(zero_centered_gamma),
                           rms, X.device, _interop.stream(kind, X.device))
    del keep  # the launch is queued on the stream; the allocator orders any reuse after it
    return FP8Tensor(data, sinv, fmt, amax)


def _jax_fp8(x, weight, bias, residual, eps, zero_centered_gamma, return_stats, rms, fmt, scale, amax_out):
    """The FP8-output forward on JAX GPU arrays and tracers (an XLA buffer callback, fusedkit/jax/_fp8.py):
    an FP8Tensor of JAX arrays (a pytree once fusedkit.jax is imported, as it is here), then h, then the
    stats."""
    from .fp8 import _amax
    from .fp8.tensor import FP8Tensor
    from .jax import _fp8
    if amax_out is not None:
        _amax.check(amax_out, JAX, "fusedkit: fp8_amax_out")  # raises: JAX arrays are immutable
    if hasattr(scale, "shape") and framework(scale) in _HOST_KINDS:  # checked by _fp8_request: a host value
        scale = _interop.to_numpy(scale, framework(scale))
    s = _fp8.scale_array(scale, "fusedkit", "fp8_scale")
    y, sinv, amax, h, mean, rstd = _fp8.norm_forward(x, weight, bias, residual, s, eps, zero_centered_gamma,
                                                           fmt.name, return_stats, rms)
    out = (FP8Tensor(y, sinv, fmt, amax),) + ((h,) if h is not None else ())
    if return_stats:
        out += (rstd,) if rms else (mean, rstd)
    return out[0] if len(out) == 1 else out


def _host_fp8(x, weight, bias, residual, eps, zero_centered_gamma, return_stats, rms, fmt, scale, kind,
              amax_out=None):
    """The FP8-output forward on the CPU backend (fusedkit.reference.norms.*_fp8), results in x's framework
    (FP8Tensor.data too; scale_inv and amax are fp32 scalars)."""
    from .fp8.tensor import FP8Tensor
    if hasattr(scale, "shape"):
        fw = framework(scale)
        if fw not in _HOST_KINDS:
            raise TypeError(f"fusedkit: `fp8_scale` is a {fw} array but x is a host array; pass a float or a "
                            f"1-element float32 host array")
        scale = _interop.to_numpy(scale, fw)
    conv = [None if a is None else _interop.to_numpy(a, kind) for a in (x, weight, bias, residual)]
    kw = dict(eps=eps, zero_centered_gamma=zero_centered_gamma, fp8_fmt=fmt, fp8_scale=scale,
              return_stats=return_stats, residual=conv[3])
    from .reference import norms as ref_norms
    if rms:
        out = ref_norms.rms_norm_fp8(conv[0], conv[1], **kw)
    else:
        out = ref_norms.layer_norm_fp8(conv[0], conv[1], conv[2], **kw)
    t, rest = (out, ()) if isinstance(out, FP8Tensor) else (out[0], out[1:])
    amax = t.amax
    if amax_out is not None:
        from .fp8 import _amax
        amax = _amax.merge_host(amax_out, amax, kind, "fusedkit: fp8_amax_out")
    t = FP8Tensor(_interop.from_numpy(t.data, kind), t.scale_inv, t.fmt, amax)
    rest = tuple(_interop.from_numpy(a, kind) for a in rest)
    return (t,) + rest if rest else t


def _np_dt(out_dtype):
    return None if out_dtype is None else _dtypes.numpy_dtype(_dtypes.canonical(out_dtype))


def _maybe_np(a, kind):
    return None if a is None else _interop.to_numpy(a, kind)


def _norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms):
    kind = _kind_of_call(x, (dy, weight, mean, rstd))
    _check_same_framework(kind, (("dy", dy), ("weight", weight), ("mean", mean), ("rstd", rstd)))
    x_dt, w_dt, _, N = _validate(x, weight, None, None, None)
    if tuple(dy.shape) != tuple(x.shape) or _dt(dy) != x_dt:
        raise ValueError(f"fusedkit: `dy` must match x's shape {tuple(x.shape)} and dtype {x_dt}, "
                         f"got {tuple(dy.shape)} {_dt(dy)}")
    stat_shape = tuple(x.shape[:-1])
    for name, s in (("mean", mean), ("rstd", rstd)):
        if s is None:
            if name == "mean" and rms:
                continue
            raise ValueError(f"fusedkit: `{name}` is required (from the forward with return_stats=True)")
        if tuple(s.shape) != stat_shape or _dt(s) != "float32":
            raise ValueError(f"fusedkit: `{name}` must be float32 of shape {stat_shape}, got "
                             f"{tuple(s.shape)} {_dt(s)}; pass the statistics the forward returned")
    if kind in _HOST_KINDS:
        if rms:
            return _host(_ref.rms_norm_backward, kind, (dy, x, weight, rstd),
                         dict(zero_centered_gamma=zero_centered_gamma))
        return _host(_ref.layer_norm_backward, kind, (dy, x, weight, mean, rstd),
                     dict(zero_centered_gamma=zero_centered_gamma))
    if kind == JAX:
        from .jax import _prims
        return _prims.norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms)
    from .backends import cuda_norms

    X = _interop.view(x, kind, "x")
    DY = _interop.view(dy, kind, "dy")
    S = _interop.view(rstd, kind, "rstd")
    views = [X, DY, S]
    MU = W = None
    if not rms:
        MU = _interop.view(mean, kind, "mean")
        views.append(MU)
    if weight is not None:
        W = _interop.view(weight, kind, "weight")
        views.append(W)
    _interop.same_device(views)
    M = X.size // N
    dx, dxp = _interop.empty(kind, X, X.shape, x_dt)
    dw = dwp = db = dbp = None
    if W is not None:
        dw, dwp = _interop.empty(kind, X, (N,), w_dt)
    if not rms:
        db, dbp = _interop.empty(kind, X, (N,), w_dt)

    def alloc_f32(n):
        return _interop.empty(kind, X, (n,), "float32")

    cuda_norms.backward(DY.ptr, X.ptr, W.ptr if W else 0, MU.ptr if MU else 0, S.ptr, dxp, dwp or 0,
                        dbp or 0, M, N, x_dt, w_dt, int(zero_centered_gamma), rms, X.device,
                        _interop.stream(kind, X.device), alloc_f32)
    if M > 0 and kind in (CUPY, TORCH):
        _callcache.remember_norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms, kind, X.device,
                                          M, N, x_dt, w_dt)
    return (dx, dw) if rms else (dx, dw, db)


# ----------------------------------------------------------------------------------------------------
# public API

def layer_norm(x, weight=None, bias=None, *, eps=1e-5, zero_centered_gamma=False, out_dtype=None,
               return_stats=False, residual=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * g + bias``.

    ``g = weight`` (or ``weight + 1`` with ``zero_centered_gamma``). With ``residual`` the input is
    ``h = x + residual`` (rounded to x's dtype) and ``h`` is returned too, for the next block.
    Returns ``y``, then ``h`` if a residual was given, then ``(mean, rstd)`` (fp32, shape
    ``x.shape[:-1]``) if ``return_stats``.

    FP8 output (the input cast of the next FP8 GEMM, fused: no extra pass over memory): with
    ``fp8_fmt`` (``"e4m3"`` or ``"e5m2"``) and ``fp8_scale`` (the delayed scale: a float or a
    1-element float32 array of x's framework) ``y`` is returned as an :class:`fusedkit.fp8.FP8Tensor`:
    ``.data`` the bytes ``sat(y * scale)`` (round to nearest even) in x's shape, ``.scale_inv`` =
    ``1 / scale``, ``.amax`` the amax of the fp32 ``y`` before scaling, ``.fmt``. Not combinable with
    ``out_dtype``. NumPy, CPU torch/JAX, CuPy and CUDA torch arrays; not JAX GPU arrays or ``jax.jit``.
    ``fp8_amax_out``: a 1-element float32 array of x's framework (e.g. ``history[0, i:i+1]`` of an amax
    history that :func:`fusedkit.fp8.update_scales` zeroes each step) that the amax is merged into
    (``max``), returned as ``.amax``: no new array and no zeroing per call.
    """
    if residual is None and fp8_fmt is None and fp8_scale is None and fp8_amax_out is None:  # _callcache.py
        out = _callcache.norm_forward(x, weight, bias, eps, zero_centered_gamma, out_dtype, return_stats, False)
        if out is not None:
            return out
    return _norm_forward(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, return_stats,
                         rms=False, fp8_fmt=fp8_fmt, fp8_scale=fp8_scale, fp8_amax_out=fp8_amax_out)


def rms_norm(x, weight=None, *, eps=1e-6, zero_centered_gamma=False, out_dtype=None, return_stats=False,
             residual=None, fp8_fmt=None, fp8_scale=None, fp8_amax_out=None):
    """RMSNorm over the last dimension: ``x / sqrt(mean(x^2) + eps) * g``.

    Returns ``y``, then ``h = x + residual`` if a residual was given, then ``rstd`` if ``return_stats``.
    ``fp8_fmt`` / ``fp8_scale`` / ``fp8_amax_out``: ``y`` as an FP8Tensor, as in :func:`layer_norm`.
    """
    if residual is None and fp8_fmt is None and fp8_scale is None and fp8_amax_out is None:  # _callcache.py
        out = _callcache.norm_forward(x, weight, None, eps, zero_centered_gamma, out_dtype, return_stats, True)
        if out is not None:
            return out
    return _norm_forward(x, weight, None, residual, eps, zero_centered_gamma, out_dtype, return_stats,
                         rms=True, fp8_fmt=fp8_fmt, fp8_scale=fp8_scale, fp8_amax_out=fp8_amax_out)


def layer_norm_backward(dy, x, weight, mean, rstd, *, zero_centered_gamma=False):
    """Gradients of layer_norm: ``(dx, dweight, dbias)``; ``dweight`` is None when weight is None.

    ``x`` is the forward's input (``h`` when a residual was added); ``mean``/``rstd`` are the
    statistics the forward returned with ``return_stats=True``.
    """
    out = _callcache.norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, False)  # host fast path
    if out is not None:
        return out
    return _norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms=False)


def rms_norm_backward(dy, x, weight, rstd, *, zero_centered_gamma=False):
    """Gradients of rms_norm: ``(dx, dweight)``; ``dweight`` is None when weight is None."""
    out = _callcache.norm_backward(dy, x, weight, None, rstd, zero_centered_gamma, True)  # host fast path
    if out is not None:
        return out
    return _norm_backward(dy, x, weight, None, rstd, zero_centered_gamma, rms=True)
