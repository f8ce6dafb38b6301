"""Repeat calls without re-validation: the host-time fast path of the GPU ops.

Validating a call and planning its launch depend only on its signature: the arrays' types, shapes
and dtypes and the options. The first call of a signature takes the full path (framework detection,
validation with its clear errors, launch planning) and leaves a ``CallPlan`` here; a later call with
the same signature checks only what can differ between calls of equal signature (contiguity, the
device, 16-byte pointer alignment, the current device) and launches. Anything else (a miss, a
strided or misaligned view, another device, zero rows, residuals) returns None and the caller takes
the full path, so errors and rare cases keep one implementation.

Measured on the H200 host (tools/profile_norms.py --host): the full path of a 4 x 1024 layer_norm on
CuPy arrays cost 16.2 us per call, of which the launch is 5.0 us and ``cupy.empty`` 2.3 us; the
rest was Python validation and planning, which this cache skips.
"""
from __future__ import annotations

from . import _jit
from ._launch import Launcher

_plans: dict = _jit.plan_cache()
_cupy_ndarray = None  # set once CuPy is imported by a call that planned a CuPy launch
_cupy = None          # the cupy module then (a global lookup instead of an import statement per call)
_torch_tensor = None


class CallPlan:
    """What a norm forward launch needs beyond the per-call pointers."""

    __slots__ = ("fn", "grid", "block", "device", "y_shape", "y_dtype", "stat_shape", "M", "N", "eps",
                 "zero_centered")

    def __init__(self, fn: Launcher, grid, block, device, y_shape, y_dtype, stat_shape, M, N, eps,
                 zero_centered):
        self.fn, self.grid, self.block, self.device = fn, grid, block, device
        self.y_shape, self.y_dtype, self.stat_shape = y_shape, y_dtype, stat_shape
        self.M, self.N, self.eps, self.zero_centered = M, N, eps, zero_centered


def _key(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms):
    return (rms, type(x), x.shape, x.dtype,
            None if weight is None else (type(weight), weight.shape, weight.dtype),
            None if bias is None else (type(bias), bias.shape, bias.dtype),
            eps, zero_centered, out_dtype, return_stats)


def remember_norm_forward(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms, kind,
                          device, M, N, x_dt, w_dt, o_dt):
    """Called by the full path after a successful CuPy / torch norm forward without residual."""
    global _cupy_ndarray, _torch_tensor, _cupy
    if M == 0 or len(_plans) > 4096:
        return
    key = _key(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms)
    if key in _plans:  # a call the fast path declined (a misaligned view, another device): nothing new
        return
    from .backends import cuda_norms
    plain_w = cuda_norms.plain_weights(weight is not None, bias is not None, rms, zero_centered)
    fn, block, rpb = cuda_norms._fwd_plan(N, x_dt, w_dt, o_dt, rms, device, None, 16, plain_w)
    stat_shape = tuple(x.shape[:-1]) if return_stats else None
    if kind == "cupy":
        import cupy
        _cupy, _cupy_ndarray = cupy, cupy.ndarray
        y_dtype = o_dt
    else:
        import torch
        _torch_tensor = torch.Tensor
        y_dtype = getattr(torch, o_dt)
    _plans[key] = CallPlan(
        fn, -(-M // rpb), block, device, tuple(x.shape), y_dtype, stat_shape, M, N, float(eps),
        int(zero_centered))


def norm_forward(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms):
    """The result of a norm forward through a cached plan, or None (take the full path)."""
    t = type(x)
    if t is _cupy_ndarray:
        return _norm_forward_cupy(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms)
    if t is _torch_tensor and x.is_cuda:
        return _norm_forward_torch(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms)
    return None


def _c_contiguous(a) -> bool:
    """CuPy's C-contiguity flag: the ndarray's own field (0.24 us less than ``a.flags``), or ``flags``
    where a CuPy version lacks it."""
    try:
        return a._c_contiguous
    except AttributeError:
        return a.flags.c_contiguous


def _norm_forward_cupy(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms):
    try:
        plan = _plans.get(_key(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms))
    except TypeError:  # an unhashable option: the full path decides
        return None
    if plan is None:
        return None
    cupy = _cupy
    dev = plan.device
    xp = x.data.ptr
    wp = bp = 0
    ok = _c_contiguous(x) and x.data.device_id == dev
    if weight is not None:
        wp = weight.data.ptr
        ok = ok and _c_contiguous(weight) and weight.data.device_id == dev
    if bias is not None:
        bp = bias.data.ptr
        ok = ok and _c_contiguous(bias) and bias.data.device_id == dev
    if not ok or (xp | wp | bp) & 15 or cupy.cuda.runtime.getDevice() != dev:
        return None
    y = cupy.empty(plan.y_shape, plan.y_dtype)
    mean = rstd = None
    mp = rp = 0
    if plan.stat_shape is not None:
        rstd = cupy.empty(plan.stat_shape, "float32")
        rp = rstd.data.ptr
        if not rms:
            mean = cupy.empty(plan.stat_shape, "float32")
            mp = mean.data.ptr
    plan.fn.launch_current(plan.grid, plan.block, 0, cupy.cuda.get_current_stream(dev).ptr, xp, 0, wp, bp,
                           y.data.ptr, 0, mp, rp, plan.M, plan.N, plan.eps, plan.zero_centered)
    if plan.stat_shape is None:
        return y
    return (y, rstd) if rms else (y, mean, rstd)


_raw_stream = None


def _norm_forward_torch(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms):
    global _raw_stream
    try:
        plan = _plans.get(_key(x, weight, bias, eps, zero_centered, out_dtype, return_stats, rms))
    except TypeError:
        return None
    if plan is None:
        return None
    import torch
    dev = plan.device
    xp = x.data_ptr()
    wp = bp = 0
    ok = x.is_contiguous() and x.get_device() == dev
    if weight is not None:
        wp = weight.data_ptr()
        ok = ok and weight.is_contiguous() and weight.get_device() == dev
    if bias is not None:
        bp = bias.data_ptr()
        ok = ok and bias.is_contiguous() and bias.get_device() == dev
    if not ok or (xp | wp | bp) & 15 or torch.cuda.current_device() != dev:
        return None
    if _raw_stream is None:
        from ._interop import _torch_raw_stream
        _raw_stream = _torch_raw_stream()
    y = torch.empty(plan.y_shape, dtype=plan.y_dtype, device=x.device)
    mean = rstd = None
    mp = rp = 0
    if plan.stat_shape is not None:
        rstd = torch.empty(plan.stat_shape, dtype=torch.float32, device=x.device)
        rp = rstd.data_ptr()
        if not rms:
            mean = torch.empty(plan.stat_shape, dtype=torch.float32, device=x.device)
            mp = mean.data_ptr()
    plan.fn.launch_current(plan.grid, plan.block, 0, _raw_stream(dev), xp, 0, wp, bp, y.data_ptr(), 0, mp, rp,
                           plan.M, plan.N, plan.eps, plan.zero_centered)
    if plan.stat_shape is None:
        return y
    return (y, rstd) if rms else (y, mean, rstd)


# ----------------------------------------------------------------------------------------------------
# Norm backward: the kernel over the rows (dx and fp32 partial rows of dweight / dbias), then one
# column_sum launch for both weight gradients. Without this path a 4096 x 1024 LayerNorm forward +
# backward was host-bound (0.77-0.87x torch eager in the 2026-12-03 runs; its kernels take ~10 us).

class BwdPlan:
    """What a norm backward needs beyond the per-call pointers (16-byte aligned inputs)."""

    __slots__ = ("fn", "nblocks", "block", "smem", "extra", "colsum", "P", "device", "shape", "x_dtype",
                 "w_dtype", "M", "N", "zero_centered", "has_w", "rms")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def _meta(a):
    return None if a is None else (type(a), a.shape, a.dtype)


def _bkey(dy, x, weight, mean, rstd, zero_centered, rms):
    return ("bwd", rms, type(x), x.shape, x.dtype, _meta(dy), _meta(weight), _meta(mean), _meta(rstd),
            zero_centered)


def remember_norm_backward(dy, x, weight, mean, rstd, zero_centered, rms, kind, device, M, N, x_dt, w_dt):
    """Called by the full path after a successful CuPy / torch norm backward."""
    global _cupy_ndarray, _torch_tensor, _cupy
    if M == 0 or len(_plans) > 4096:
        return
    try:
        key = _bkey(dy, x, weight, mean, rstd, zero_centered, rms)
    except TypeError:
        return
    if key in _plans:
        return
    from .backends import cuda_norms
    plain_w = cuda_norms.bwd_plain_weights(weight is not None, zero_centered)
    launch = cuda_norms._bwd_plan(N, x_dt, w_dt, rms, device, None, 16, plain_w)
    nblocks, P = launch.grid(M)
    if kind == "cupy":
        import cupy
        _cupy, _cupy_ndarray = cupy, cupy.ndarray
        x_dtype, w_dtype = x_dt, w_dt
    else:
        import torch
        _torch_tensor = torch.Tensor
        x_dtype, w_dtype = getattr(torch, x_dt), getattr(torch, w_dt)
    n_parts = int(weight is not None) + int(not rms)
    _plans[key] = BwdPlan(fn=launch.fn, nblocks=nblocks, block=launch.block, smem=launch.smem,
                          extra=launch.extra,
                          colsum=launch.colsum.launch_plan(N, n_parts) if n_parts else None,
                          P=P, device=device, shape=tuple(x.shape), x_dtype=x_dtype,
                          w_dtype=w_dtype, M=M, N=N, zero_centered=int(zero_centered),
                          has_w=weight is not None, rms=rms)


def norm_backward(dy, x, weight, mean, rstd, zero_centered, rms):
    """(dx, dweight[, dbias]) of a norm backward through a cached plan, or None (take the full path)."""
    global _raw_stream
    t = type(x)
    if t is _cupy_ndarray:
        is_cupy = True
    elif t is _torch_tensor and x.is_cuda:
        is_cupy = False
    else:
        return None
    try:
        plan = _plans.get(_bkey(dy, x, weight, mean, rstd, zero_centered, rms))
    except TypeError:  # an unhashable option: the full path decides
        return None
    if plan is None:
        return None
    dev = plan.device
    ptrs = _device_ptrs((dy, x, weight, mean, rstd), is_cupy, dev)
    if ptrs is None or (ptrs[0] | ptrs[1] | ptrs[2]) & 15:
        return None
    if is_cupy:
        cupy = _cupy
        if cupy.cuda.runtime.getDevice() != dev:
            return None

        def empty(shape, dtype):
            return cupy.empty(shape, dtype)
        f32 = "float32"
        sp = cupy.cuda.get_current_stream(dev).ptr
    else:
        import torch
        if torch.cuda.current_device() != dev:
            return None
        if _raw_stream is None:
            from ._interop import _torch_raw_stream
            _raw_stream = _torch_raw_stream()
        device = x.device

        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device)
        f32 = torch.float32
        sp = _raw_stream(dev)
    dyp, xp, wp, mp, rp = ptrs
    N, P = plan.N, plan.P
    dx = empty(plan.shape, plan.x_dtype)
    dw = db = None
    n_parts = int(plan.has_w) + int(not plan.rms)
    part = empty((n_parts * P * N,), f32) if n_parts else None
    pp = _ptr(part) if part is not None else 0
    dw_part = db_part = 0
    if plan.has_w:
        dw = empty((N,), plan.w_dtype)
        dw_part = pp
    if not plan.rms:
        db = empty((N,), plan.w_dtype)
        db_part = pp + (4 * P * N if plan.has_w else 0)
    dxp = _ptr(dx)
    plan.fn.launch_current(plan.nblocks, plan.block, plan.smem, sp, dyp, xp, wp, mp, rp, dxp, dw_part, db_part,
                           plan.M, N, plan.zero_centered, *plan.extra)
    if n_parts:  # one launch sums dweight's and dbias's partial rows (blockIdx.y picks which)
        o0 = _ptr(dw if dw is not None else db)
        o1 = _ptr(db) if db is not None else o0
        fn, grid, block = plan.colsum
        fn.launch_current(grid, block, 0, sp, pp, P, N, o0, o1, dependent=True)  # plans have M > 0
    return (dx, dw) if plan.rms else (dx, dw, db)


def _device_ptrs(arrays, is_cupy, dev):
    """The arrays' device pointers (0 for None), or None when one is not contiguous or not on ``dev``."""
    ptrs = []
    for a in arrays:
        if a is None:
            ptrs.append(0)
            continue
        if is_cupy:
            ok, p = _c_contiguous(a) and a.data.device_id == dev, a.data.ptr
        else:
            ok, p = a.is_contiguous() and a.get_device() == dev, a.data_ptr()
        if not ok:
            return None
        ptrs.append(p)
    return ptrs


def _ptr(a) -> int:
    return a.data.ptr if type(a) is _cupy_ndarray else a.data_ptr()


def _is_cupy(a):
    """True for a CuPy array, False for a CUDA torch tensor, None for anything else (no cached path)."""
    t = type(a)
    if t is _cupy_ndarray:
        return True
    if t is _torch_tensor and a.is_cuda:
        return False
    return None


def _stream_on(is_cupy, dev):
    """The framework's current stream on ``dev`` (a raw pointer), or None when ``dev`` is not the current
    device (the full path then switches devices as it must)."""
    global _raw_stream
    if is_cupy:
        cupy = _cupy
        return cupy.cuda.get_current_stream(dev).ptr if cupy.cuda.runtime.getDevice() == dev else None
    import torch
    if torch.cuda.current_device() != dev:
        return None
    if _raw_stream is None:
        from ._interop import _torch_raw_stream
        _raw_stream = _torch_raw_stream()
    return _raw_stream(dev)


def clear() -> None:
    """Forget every plan (tests; after changing FUSEDKIT_* launch settings at run time)."""
    _plans.clear()


# ----------------------------------------------------------------------------------------------------
# FP8 GEMM: the launch (cuda_gemm.GemmLaunch: kernel, grid, the parameters that are not pointers) and
# the output's type per call signature. The full path costs 45 us per call (plain) and 93 us (bias +
# GeLU + E4M3 output) on the H100 host of 2026-12-05 against cuBLASLt's 16 us through torch._scaled_mm
# (fp8_gemm_host_overhead at 256^3). On a CPU with the launch stubbed (tools/profile_gemm_host.py) the
# full path's Python takes 37.7 / 53 us and this path 12.1 / 18.5 us: it skips validation, views and
# planning, and reuses the launch's parameter blocks.
# Calls this path declines (host scales given as floats, a float out_scale, forced tiles, a strided
# or misaligned operand, another device) take the full path.

class GemmPlan:
    """What a cached FP8 GEMM call needs beyond its pointers."""

    __slots__ = ("launch", "device", "out_shape", "out_dtype", "out_fmt", "acc_align")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


_cuda_gemm = None  # fusedkit.backends.cuda_gemm once a GEMM plan exists (no import statement per call)
_FP8Tensor = None


def _gkey(a, b, out_dtype, bias, activation, out_scale, accumulate_into, split):
    """The signature of an fp8_gemm call; AttributeError for an operand that is not an FP8Tensor of
    arrays or a float out_scale (the full path serves those)."""
    return ("gemm", type(a.data), a.data.shape, a.data.dtype, b.data.shape, b.data.dtype, a.fmt.name,
            b.fmt.name, a.mode, b.mode, a.block, b.block, _meta(a.scale_inv), _meta(b.scale_inv), out_dtype,
            _meta(bias), activation, _meta(out_scale), _meta(accumulate_into), split)


def remember_gemm(a, b, out_dtype, bias, activation, out_scale, accumulate_into, split, launch, device,
                  M, N, out_kind):
    """Called by fusedkit.fp8_gemm's full path after a kernel launch on CuPy / torch arrays."""
    global _cupy_ndarray, _torch_tensor, _cupy, _cuda_gemm, _FP8Tensor
    from .backends import cuda_gemm
    from .fp8.tensor import FP8Tensor
    t = type(a.data)
    if len(_plans) > 4096 or cuda_gemm._forced is not None:
        return
    if any(x is not None and type(x) is not t for x in (a.scale_inv, b.scale_inv, out_scale)):
        return  # scales given as host floats: the full path makes their device copies
    try:
        key = _gkey(a, b, out_dtype, bias, activation, out_scale, accumulate_into, split)
    except (TypeError, AttributeError):
        return
    if key in _plans:
        return
    from .fp8.formats import as_format
    fp8_out = out_kind in ("e4m3", "e5m2")
    odt = "uint8" if fp8_out else out_kind
    import cupy
    _cupy, _cuda_gemm, _FP8Tensor = cupy, cuda_gemm, FP8Tensor
    if t is cupy.ndarray:
        _cupy_ndarray = t
    else:
        import torch
        _torch_tensor = torch.Tensor
        odt = getattr(torch, odt)
    _plans[key] = GemmPlan(launch=launch, device=device, out_shape=(M, N), out_dtype=odt,
                           out_fmt=as_format(out_kind) if fp8_out else None,
                           acc_align=8 if out_kind == "float32" else 4)


def fp8_gemm(a, b, out_dtype, bias, activation, out_scale, accumulate_into, split):
    """The result of fusedkit.fp8_gemm through a cached plan, or None (take the full path)."""
    if _cuda_gemm is None:
        return None
    try:
        is_cupy = _is_cupy(a.data)
        if is_cupy is None:
            return None
        if _cuda_gemm._forced is not None:  # forced tiles (tests, tools): planned per call
            return None
        plan = _plans.get(_gkey(a, b, out_dtype, bias, activation, out_scale, accumulate_into, split))
    except (TypeError, AttributeError):
        return None
    if plan is None:
        return None
    dev = plan.device
    ptrs = _device_ptrs((a.data, b.data, a.scale_inv, b.scale_inv, bias, out_scale, accumulate_into), is_cupy, dev)
    if ptrs is None:
        return None
    pa, pb, psa, psb, pbias, pos, pacc = ptrs
    if (pa | pb) & 15 or pacc % plan.acc_align:
        return None
    sp = _stream_on(is_cupy, dev)
    if sp is None:
        return None
    cupy = _cupy
    if is_cupy:
        def empty(shape, dtype):
            return cupy.empty(shape, dtype)
        f32 = "float32"
    else:
        import torch
        device = a.data.device

        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device)
        f32 = torch.float32
    amax = None
    pamax = 0
    if accumulate_into is not None:
        out, pout = accumulate_into, pacc
    else:
        out = empty(plan.out_shape, plan.out_dtype)
        pout = _ptr(out)
    if plan.out_fmt is not None:
        amax = empty((1,), f32)
        pamax = _ptr(amax)
        cupy.cuda.runtime.memsetAsync(pamax, 0, 4, sp)
    _cuda_gemm.launch(plan.launch, pa, pb, pout, pbias, psa, psb, pos, pamax, sp)
    if plan.out_fmt is None:
        return out
    recip = 1.0 / out_scale.reshape(1) if is_cupy else out_scale.reshape(1).reciprocal()   # as fp8.gemm._recip
    return _FP8Tensor(out, recip, plan.out_fmt, amax)


# ----------------------------------------------------------------------------------------------------
# FP8 per-tensor quantize (fusedkit.quantize without transpose, amax_out or a block recipe): delayed
# scaling with the scale as a device array of x's framework, or current scaling. The full path costs
# 28 us per 4 x 1024 call on torch tensors on the H200 host; on a CPU with the launches stubbed
# (docs/perf_notes.rst) its Python is 16.3 us and this path's 9.4 us: it skips validation, views and
# planning, and the outputs' fp32 scalars share one zeroed allocation (amax, scale_inv, current
# scaling's scale): two allocations per call instead of four. Calls with a float scale take the full path.

class QuantPlan:
    """What a cached quantize call needs beyond its pointers."""

    __slots__ = ("amax_fn", "cast_fn", "grid", "block", "device", "n", "eps", "pow2", "current", "fmt", "u8")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def _qkey(x, fmt, scale, recipe):
    return ("quantize", type(x), x.shape, x.dtype, fmt, _meta(scale), recipe)


def remember_quantize(x, fmt_arg, fmt, scale, recipe, kind, device, n, x_dt, current, x_ptr):
    """Called by fusedkit.quantize's full path after a per-tensor cast of CuPy / torch arrays (no transpose,
    no amax_out); ``fmt_arg`` the call's ``fmt`` argument, ``fmt`` its FP8Format, ``recipe`` the
    CurrentScaling used (its epsilon and power-of-2 rule)."""
    global _cupy_ndarray, _torch_tensor, _cupy, _FP8Tensor
    if len(_plans) > 4096 or x_ptr & 15 or (scale is not None and type(scale) is not type(x)):
        return  # a misaligned x plans a narrower vector; a float scale needs its device copy per call
    try:
        key = _qkey(x, fmt_arg, scale, recipe if current else None)
    except (TypeError, AttributeError):
        return
    if key in _plans:
        return
    import cupy

    from .backends import cuda_fp8
    from .fp8.tensor import FP8Tensor
    _cupy, _FP8Tensor = cupy, FP8Tensor
    if kind == "cupy":
        _cupy_ndarray, u8 = cupy.ndarray, "uint8"
    else:
        import torch
        _torch_tensor, u8 = torch.Tensor, torch.uint8
    amax_fn, cast_fn, grid = cuda_fp8.quantize_plan(n, x_dt, fmt.name, current, device)
    _plans[key] = QuantPlan(amax_fn=amax_fn, cast_fn=cast_fn, grid=grid, block=(cuda_fp8.THREADS, 1),
                            device=device, n=n, eps=float(recipe.amax_epsilon),
                            pow2=int(recipe.power_of_2_scales), current=current, fmt=fmt, u8=u8)


def quantize(x, fmt, scale, recipe):
    """An FP8Tensor of x through a cached plan, or None (take the full path). ``recipe``: the
    CurrentScaling of the call (ignored with a scale)."""
    is_cupy = _is_cupy(x)
    if is_cupy is None:
        return None
    current = scale is None
    try:
        plan = _plans.get(_qkey(x, fmt, scale, recipe if current else None))
    except (TypeError, AttributeError):
        return None
    if plan is None:
        return None
    dev = plan.device
    ptrs = _device_ptrs((x, scale), is_cupy, dev)
    if ptrs is None:
        return None
    xp, sp_ = ptrs
    stream = None if xp & 15 else _stream_on(is_cupy, dev)
    if stream is None:
        return None
    if is_cupy:
        data = _cupy.empty(x.shape, "uint8")
        buf = _cupy.zeros(3, "float32")
    else:
        import torch
        data = torch.empty(x.shape, dtype=plan.u8, device=x.device)
        buf = torch.zeros(3, dtype=torch.float32, device=x.device)
    pbuf = _ptr(buf)
    amax_p, sinv_p = pbuf, pbuf + 4
    block = plan.block
    if current:  # the amax pass fills amax, the cast derives its scale from it into buf[2]
        plan.amax_fn.launch_current(plan.grid, block, 0, stream, xp, amax_p, plan.n)
        args = (0, amax_p, pbuf + 8, sinv_p, 0)
    else:        # the cast merges the amax of x into buf[0]
        args = (sp_, 0, 0, sinv_p, amax_p)
    plan.cast_fn.launch_current(plan.grid, block, 0, stream, xp, _ptr(data), *args, plan.n, plan.eps, plan.pow2,
                                dependent=current)
    return _FP8Tensor(data, buf[1:2], plan.fmt, buf[0:1])
