"""LayerNorm / RMSNorm, the activations and softmax as XLA buffer callbacks
(``jax.experimental.buffer_callback``).

``norm_forward`` / ``norm_backward`` have the argument and return conventions of
``fusedkit.norms._norm_forward`` / ``_norm_backward`` (which call them for JAX GPU arrays and for
tracers, after validating the arguments), so they also work inside ``jax.jit``:

* On a GPU the callback reads XLA's device buffers in place (``__cuda_array_interface__``) and
  launches the CUDA kernels of ``fusedkit.backends.cuda_norms`` on XLA's stream (``ctx.stream``),
  without leaving the XLA program and without synchronising.
* On the CPU the callback runs ``fusedkit.reference`` on the host buffers.

The platform is decided when the computation is staged: an eager (concrete) array's device picks
it directly; under tracing both branches are staged with ``lax.platform_dependent`` and XLA keeps
the one of the platform it lowers for.

The CUDA backward reduces dweight / dbias through fp32 partial rows: these are extra outputs of the
backward callback (so XLA allocates them, from its own pool) and are dropped afterwards.
"""
from __future__ import annotations

import functools
import math

import jax
import numpy as np
from jax import lax
from jax.experimental.buffer_callback import buffer_callback

from .. import _dtypes
from .. import reference as _ref

_GPU_PLATFORMS = ("gpu", "cuda")
_VMAP = "sequential"  # per-example weights would not fit one launch; vmap loops over the batch


def _sds(shape, dt: str):
    return jax.ShapeDtypeStruct(tuple(shape), _dtypes.numpy_dtype(dt))


def _np(buf):
    return None if buf is None else np.asarray(buf)


def _ptr(buf) -> int:
    return 0 if buf is None else buf.__cuda_array_interface__["data"][0]


# ----------------------------------------------------------------------------------------------------
# platform

@functools.lru_cache(maxsize=None)
def _jax_gpus() -> tuple:
    """Local JAX GPU devices (empty without a GPU backend)."""
    try:
        return tuple(jax.local_devices(backend="gpu"))
    except Exception:  # no GPU backend (RuntimeError), or a plugin that failed to initialise
        return ()


def _ordinal(dev) -> int:
    hw = getattr(dev, "local_hardware_id", None)
    return dev.id if hw is None else hw


def _concrete_device(args):
    """The device the call runs on, for eager (concrete) arrays; None when any is traced (decided at lowering).

    Committed arrays (placed with ``device_put`` or computed there) decide over uncommitted ones: a scalar
    made with ``jnp.asarray`` sits on the default device but follows the logits to the CPU, as JAX does.
    """
    committed, loose = [], []
    for a in args:
        if a is None:
            continue
        if isinstance(a, jax.core.Tracer):
            return None
        try:
            devs = a.devices()
        except Exception:
            return None
        if len(devs) != 1:
            return None
        (committed if getattr(a, "committed", True) else loose).append(next(iter(devs)))
    devs = committed or loose
    if not devs or any(d != devs[0] for d in devs):
        return None  # none, or committed to different devices: JAX itself reports that at the call
    return devs[0]


def _dispatch(cpu_fn, gpu_fn, args):
    """``cpu_fn(*args)`` or ``gpu_fn(ordinal)(*args)``; traced args stage both branches."""
    dev = _concrete_device(args)
    if dev is not None:
        if dev.platform in _GPU_PLATFORMS:
            return gpu_fn(_ordinal(dev))(*args)
        if dev.platform == "cpu":
            return cpu_fn(*args)
        raise NotImplementedError(f"fusedkit: no kernels for JAX platform {dev.platform!r}")
    if not _jax_gpus():
        return cpu_fn(*args)
    return lax.platform_dependent(*args, cpu=cpu_fn, cuda=gpu_fn(None))


# ----------------------------------------------------------------------------------------------------
# forward

def _w_dtype(x_dt, weight, bias):
    for a in (weight, bias):
        if a is not None:
            return _dtypes.canonical(a.dtype)
    return x_dt


def norm_forward(x, weight, bias, residual, eps, zero_centered_gamma, out_dtype, return_stats, rms):
    """y, then h (with a residual), then (mean, rstd) / rstd (with return_stats); a lone y unpacked."""
    if rms:
        bias = None
    x_dt = _dtypes.canonical(x.dtype)
    key = (tuple(x.shape), x_dt, _w_dtype(x_dt, weight, bias), _dtypes.canonical(out_dtype),
           weight is not None, bias is not None, residual is not None, float(eps),
           bool(zero_centered_gamma), bool(return_stats), bool(rms))
    outs = _dispatch(_fwd_callable("cpu", key), lambda device: _fwd_callable("gpu", key),
                     (x, residual, weight, bias))
    out = tuple(o for o in outs if o is not None)
    return out[0] if len(out) == 1 else out


def _fwd_results(key):
    shape, x_dt, w_dt, o_dt, has_w, has_b, has_r, eps, zc, stats, rms = key
    return (_sds(shape, o_dt),
            _sds(shape, x_dt) if has_r else None,
            _sds(shape[:-1], "float32") if stats and not rms else None,
            _sds(shape[:-1], "float32") if stats else None)


def write_norm_extras(rest, h_o, mean_o, rstd_o) -> None:
    """The reference forward's outputs after y (h with a residual, then mean and rstd, as computed with
    return_stats=True) into the callback's buffers that exist."""
    rest = list(rest)
    if h_o is not None:
        np.asarray(h_o)[...] = rest.pop(0)
    if mean_o is not None:
        np.asarray(mean_o)[...] = rest[0]
    if rstd_o is not None:
        np.asarray(rstd_o)[...] = rest[-1]


@functools.lru_cache(maxsize=None)
def _fwd_callable(platform: str, key):
    """One buffer_callback per (platform, static config): eager calls hit JAX's compile cache."""
    shape, x_dt, w_dt, o_dt, has_w, has_b, has_r, eps, zc, stats, rms = key
    N = shape[-1]
    M = math.prod(shape[:-1])

    def cpu_cb(ctx, out, x, res, w, b):
        y_o, h_o, mean_o, rstd_o = out
        fn = _ref.rms_norm if rms else _ref.layer_norm
        kw = {} if rms else {"bias": _np(b)}
        r = fn(_np(x), _np(w), eps=eps, zero_centered_gamma=zc, out_dtype=_dtypes.numpy_dtype(o_dt),
               return_stats=True, residual=_np(res), **kw)
        np.asarray(y_o)[...] = r[0]
        write_norm_extras(r[1:], h_o, mean_o, rstd_o)

    def gpu_cb(ctx, out, x, res, w, b):
        if M == 0:
            return
        import cupy

        from ..backends import cuda_norms
        y_o, h_o, mean_o, rstd_o = out
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_norms.forward(_ptr(x), _ptr(res), _ptr(w), _ptr(b), _ptr(y_o), _ptr(h_o), _ptr(mean_o),
                               _ptr(rstd_o), M, N, x_dt, w_dt, o_dt, eps, int(zc), rms, dev,
                               ctx.stream)

    return buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, _fwd_results(key), vmap_method=_VMAP)


# ----------------------------------------------------------------------------------------------------
# backward

def norm_backward(dy, x, weight, mean, rstd, zero_centered_gamma, rms):
    """(dx, dweight) for RMSNorm, (dx, dweight, dbias) for LayerNorm; dweight is None without weight."""
    x_dt = _dtypes.canonical(x.dtype)
    key = (tuple(x.shape), x_dt, _w_dtype(x_dt, weight, None), weight is not None,
           bool(zero_centered_gamma), bool(rms))
    dx, dw, db = _dispatch(_bwd_callable("cpu", key, 0), lambda device: _gpu_bwd(key, device),
                           (dy, x, weight, None if rms else mean, rstd))
    return (dx, dw) if rms else (dx, dw, db)


def _gpu_bwd(key, device):
    """The GPU backward for ``device`` (an ordinal), or for any local GPU when tracing (None)."""
    shape, x_dt, w_dt, has_w, zc, rms = key
    if not has_w and rms:  # nothing to reduce over rows: no scratch
        return _bwd_callable("gpu", key, 0)
    if device is not None:
        return _bwd_callable("gpu", key, _partial_rows(key, (device,)))
    try:  # staged for whichever GPU runs it: size the scratch for the largest need of the local kinds
        ordinals, seen = [], set()
        for d in _jax_gpus():
            if d.device_kind not in seen:
                seen.add(d.device_kind)
                ordinals.append(_ordinal(d))
        return _bwd_callable("gpu", key, _partial_rows(key, tuple(ordinals)))
    except Exception as e:  # e.g. no CuPy: stage a GPU branch that fails only if it is ever run
        return _bwd_callable("gpu", key, 1, repr(e))


def _partial_rows(key, ordinals) -> int:
    from ..backends import cuda_norms
    shape, x_dt, w_dt, has_w, zc, rms = key
    M = math.prod(shape[:-1])
    return max(cuda_norms.bwd_partial_rows(M, shape[-1], x_dt, w_dt, rms, d) for d in ordinals)


@functools.lru_cache(maxsize=None)
def _bwd_callable(platform: str, key, P: int, error: str | None = None):
    shape, x_dt, w_dt, has_w, zc, rms = key
    N = shape[-1]
    M = math.prod(shape[:-1])
    scratch = platform == "gpu" and P > 0
    n_parts = int(has_w) + int(not rms)  # partial rows of dweight, then of dbias, in one scratch buffer
    results = (_sds(shape, x_dt),
               _sds((N,), w_dt) if has_w else None,
               None if rms else _sds((N,), w_dt),
               _sds((n_parts * P * N,), "float32") if scratch and n_parts else None)

    def cpu_cb(ctx, out, dy, x, w, mean, rstd):
        dx_o, dw_o, db_o = out[:3]
        if rms:
            dx, dw = _ref.rms_norm_backward(_np(dy), _np(x), _np(w), _np(rstd), zero_centered_gamma=zc)
        else:
            dx, dw, db = _ref.layer_norm_backward(_np(dy), _np(x), _np(w), _np(mean), _np(rstd),
                                                  zero_centered_gamma=zc)
            np.asarray(db_o)[...] = db
        np.asarray(dx_o)[...] = dx
        if dw_o is not None:
            np.asarray(dw_o)[...] = dw

    def gpu_cb(ctx, out, dy, x, w, mean, rstd):
        if error is not None:
            raise RuntimeError(f"fusedkit: the CUDA backward could not be set up: {error}")
        import cupy

        from ..backends import cuda_norms
        dx_o, dw_o, db_o, part = out

        def alloc_f32(n):
            if n > n_parts * P * N:
                raise RuntimeError(f"fusedkit: backward scratch of {n_parts * P * N} floats staged, {n} "
                                   f"needed on this device")
            return part, _ptr(part)

        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_norms.backward(_ptr(dy), _ptr(x), _ptr(w), _ptr(mean), _ptr(rstd), _ptr(dx_o), _ptr(dw_o),
                                _ptr(db_o), M, N, x_dt, w_dt, int(zc), rms, dev, ctx.stream,
                                alloc_f32)

    call = buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, results, vmap_method=_VMAP)

    def run(dy, x, w, mean, rstd):
        return call(dy, x, w, mean, rstd)[:3]  # the scratch outputs end here

    return run


# ----------------------------------------------------------------------------------------------------
# activations (fusedkit.activations; same platform dispatch as the norms)

def act_forward(x, bias, kind, out_dtype):
    """act(x + bias) (or the gated act(a) * g) as a buffer callback; out_dtype a canonical name."""
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), _dtypes.canonical(out_dtype), kind, bias is not None)
    return _dispatch(_act_fwd_callable("cpu", key), lambda device: _act_fwd_callable("gpu", key), (x, bias))


def act_backward(dy, x, bias, kind):
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), _dtypes.canonical(x.dtype), kind, bias is not None)
    return _dispatch(_act_bwd_callable("cpu", key), lambda device: _act_bwd_callable("gpu", key), (dy, x, bias))


def _act_dims(key):
    shape, x_dt, o_dt, kind, has_b = key
    N = shape[-1]
    H = N // 2 if kind in _ref.activations.GATED else N
    return N, H, math.prod(shape[:-1])


@functools.lru_cache(maxsize=None)
def _act_fwd_callable(platform: str, key):
    shape, x_dt, o_dt, kind, has_b = key
    N, H, M = _act_dims(key)

    def cpu_cb(ctx, out, x, b):
        np.asarray(out)[...] = _ref.activations.forward(_np(x), kind, _np(b), _dtypes.numpy_dtype(o_dt))

    def gpu_cb(ctx, out, x, b):
        if M == 0 or H == 0:
            return
        import cupy

        from ..backends import cuda_activations
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_activations.forward(_ptr(x), _ptr(b), _ptr(out), M, H, x_dt, o_dt, kind, dev,
                                     ctx.stream)

    return buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, _sds(shape[:-1] + (H,), o_dt),
                           vmap_method=_VMAP)


@functools.lru_cache(maxsize=None)
def _act_bwd_callable(platform: str, key):
    shape, x_dt, o_dt, kind, has_b = key
    N, H, M = _act_dims(key)

    def cpu_cb(ctx, out, dy, x, b):
        np.asarray(out)[...] = _ref.activations.backward(_np(dy), _np(x), kind, _np(b))

    def gpu_cb(ctx, out, dy, x, b):
        if M == 0 or H == 0:
            return
        import cupy

        from ..backends import cuda_activations
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_activations.backward(_ptr(dy), _ptr(x), _ptr(b), _ptr(out), M, H, x_dt, kind, dev,
                                      ctx.stream)

    return buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, _sds(shape, x_dt), vmap_method=_VMAP)


# ----------------------------------------------------------------------------------------------------
# softmax / log-softmax (fusedkit.softmax; same platform dispatch as the norms)

def softmax_forward(x, mask, scale, causal, out_dtype, log):
    """Softmax (or log-softmax) of ``x * scale`` over the last axis; out_dtype a canonical name. The
    boolean mask (broadcastable to x, read in place by strides) and ``causal`` as in fusedkit.softmax."""
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), out_dtype,
           None if mask is None else tuple(mask.shape), float(scale), bool(causal), bool(log))
    return _dispatch(_softmax_fwd_callable("cpu", key), lambda device: _softmax_fwd_callable("gpu", key),
                     (x, mask))


def softmax_backward(dy, y, scale, log):
    key = (tuple(y.shape), _dtypes.canonical(y.dtype), float(scale), bool(log))
    return _dispatch(_softmax_bwd_callable("cpu", key), lambda device: _softmax_bwd_callable("gpu", key),
                     (dy, y))


def _rows(shape):
    N = shape[-1]
    return N, (math.prod(shape[:-1]) if N else 0)


@functools.lru_cache(maxsize=None)
def _softmax_fwd_callable(platform: str, key):
    shape, o_dt = key[0], key[2]
    return buffer_callback(_softmax_fwd_callbacks(key)[platform], _sds(shape, o_dt), vmap_method=_VMAP)


def _softmax_fwd_callbacks(key):
    """{"cpu": callback, "gpu": callback} of the forward (tests run the GPU one on fake buffers)."""
    shape, x_dt, o_dt, m_shape, scale, causal, log = key
    N, M = _rows(shape)

    def cpu_cb(ctx, out, x, mask):
        o = _dtypes.numpy_dtype(o_dt)
        if log:
            y = _ref.log_softmax(_np(x), -1, scale=scale, out_dtype=o)
        else:
            y = _ref.softmax(_np(x), -1, scale=scale, mask=_np(mask), causal=causal, out_dtype=o)
        np.asarray(out)[...] = y

    def gpu_cb(ctx, out, x, mask):
        if M == 0:
            return
        import cupy

        from ..backends import cuda_softmax
        from ..softmax import mask_launch_args
        mptr, masking, args = mask_launch_args(shape, m_shape, causal, _ptr(mask))
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_softmax.forward(_ptr(x), mptr, _ptr(out), M, N, x_dt, o_dt, scale, log, masking, args, dev,
                                 ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


@functools.lru_cache(maxsize=None)
def _softmax_bwd_callable(platform: str, key):
    shape, y_dt = key[0], key[1]
    return buffer_callback(_softmax_bwd_callbacks(key)[platform], _sds(shape, y_dt), vmap_method=_VMAP)


def _softmax_bwd_callbacks(key):
    shape, y_dt, scale, log = key
    N, M = _rows(shape)

    def cpu_cb(ctx, out, dy, y):
        fn = _ref.log_softmax_backward if log else _ref.softmax_backward
        np.asarray(out)[...] = fn(_np(dy), _np(y), scale=scale)

    def gpu_cb(ctx, out, dy, y):
        if M == 0:
            return
        import cupy

        from ..backends import cuda_softmax
        dev = y.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_softmax.backward(_ptr(dy), _ptr(y), _ptr(out), M, N, y_dt, scale, log, dev, ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# cross-entropy (fusedkit.cross_entropy; same platform dispatch). The GPU callbacks' scratch (the
# per-token losses of a reduced loss, the count of a mean, the reduction's block partials) is extra
# outputs, sized by fusedkit.cross_entropy.scratch_sizes and dropped afterwards.

class _Bump:
    """alloc(n, dtype) of fusedkit.cross_entropy.gpu_forward / gpu_backward over two scratch buffers."""

    def __init__(self, f32, i32):
        self.bufs = {"float32": [f32, 0], "int32": [i32, 0]}

    def __call__(self, n, dtype):
        entry = self.bufs[dtype]
        buf, used = entry
        size = 0 if buf is None else math.prod(buf.shape)  # XLA's Buffer has shape, dtype, no size
        if used + n > size:
            raise RuntimeError(f"fusedkit: cross-entropy scratch of {size} {dtype} staged, {used + n} needed")
        entry[1] = used + n
        return buf, _ptr(buf) + 4 * used


def cross_entropy(logits, target, ignore_index, label_smoothing, reduction, z_loss, return_lse, return_grad):
    """loss, then lse / grad as requested (the conventions of fusedkit.cross_entropy)."""
    key = (tuple(logits.shape), _dtypes.canonical(logits.dtype), str(target.dtype), ignore_index,
           label_smoothing, reduction, z_loss, return_lse, return_grad)
    outs = _dispatch(_ce_fwd_callable("cpu", key), lambda device: _ce_fwd_callable("gpu", key),
                     (logits, target))
    out = (outs[0],) + ((outs[1],) if return_lse else ()) + ((outs[2],) if return_grad else ())
    return out[0] if len(out) == 1 else out


def cross_entropy_backward(grad_loss, per_token, logits, target, lse, ignore_index, label_smoothing, reduction,
                           z_loss):
    """The gradient from a saved lse; grad_loss a float32 array (one element, or per token with
    ``per_token``) or a Python number."""
    scale = grad_loss if isinstance(grad_loss, float) else None
    key = (tuple(logits.shape), _dtypes.canonical(logits.dtype), str(target.dtype), ignore_index,
           label_smoothing, reduction, z_loss, scale, bool(per_token),
           None if scale is not None else tuple(grad_loss.shape))
    gl = None if scale is not None else grad_loss
    return _dispatch(_ce_bwd_callable("cpu", key), lambda device: _ce_bwd_callable("gpu", key),
                     (gl, logits, target, lse))


@functools.lru_cache(maxsize=None)
def _ce_fwd_callable(platform: str, key):
    results, callbacks = _ce_fwd_callbacks(key, platform == "gpu")
    call = buffer_callback(callbacks[platform], results, vmap_method=_VMAP)

    def run(x, t):
        return call(x, t)[:3]  # the scratch outputs end here

    return run


def _ce_fwd_callbacks(key, gpu: bool):
    """(results, {"cpu": callback, "gpu": callback}) of the forward; with ``gpu`` the results include
    the scratch."""
    from ..cross_entropy import gpu_forward, scratch_sizes
    shape, x_dt, t_dt, ignore_index, eps, reduction, z, want_lse, want_grad = key
    N, M = _rows(shape)
    tshape = shape[:-1]
    f32, i32 = scratch_sizes(M, reduction)
    results = (_sds(tshape if reduction == "none" else (), "float32"),
               _sds(tshape, "float32") if want_lse else None,
               _sds(shape, x_dt) if want_grad else None,
               _sds((f32,), "float32") if gpu else None,
               _sds((i32,), "int32") if gpu else None)

    def cpu_cb(ctx, out, x, t):
        r = _ref.cross_entropy.cross_entropy(_np(x), _np(t), ignore_index=ignore_index, label_smoothing=eps,
                                             reduction=reduction, z_loss=z, return_lse=True,
                                             return_grad=want_grad)
        np.asarray(out[0])[...] = r[0]
        if out[1] is not None:
            np.asarray(out[1])[...] = r[1]
        if out[2] is not None:
            np.asarray(out[2])[...] = r[2]

    def gpu_cb(ctx, out, x, t):
        import cupy
        loss_o, lse_o, grad_o, f32_o, i32_o = out
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            gpu_forward(_ptr(x), _ptr(t), t_dt == "int32", M, N, x_dt, ignore_index, eps, z, reduction,
                        _ptr(loss_o), _ptr(lse_o), _ptr(grad_o), dev, ctx.stream, _Bump(f32_o, i32_o))

    return results, {"cpu": cpu_cb, "gpu": gpu_cb}


@functools.lru_cache(maxsize=None)
def _ce_bwd_callable(platform: str, key):
    results, callbacks = _ce_bwd_callbacks(key, platform == "gpu")
    call = buffer_callback(callbacks[platform], results, vmap_method=_VMAP)

    def run(gl, x, t, lse):
        return call(gl, x, t, lse)[0]

    return run


def _ce_bwd_callbacks(key, gpu: bool):
    from ..cross_entropy import gpu_backward, scratch_sizes
    shape, x_dt, t_dt, ignore_index, eps, reduction, z, scale, per_token, gl_shape = key
    N, M = _rows(shape)
    f32, i32 = scratch_sizes(M, reduction, backward=True)
    results = (_sds(shape, x_dt),
               _sds((f32,), "float32") if gpu else None,
               _sds((i32,), "int32") if gpu else None)

    def cpu_cb(ctx, out, gl, x, t, lse):
        g = scale if gl is None else _np(gl)
        np.asarray(out[0])[...] = _ref.cross_entropy.cross_entropy_backward(
            g, _np(x), _np(t), _np(lse), ignore_index=ignore_index, label_smoothing=eps, reduction=reduction,
            z_loss=z)

    def gpu_cb(ctx, out, gl, x, t, lse):
        import cupy
        grad_o, f32_o, i32_o = out
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            gpu_backward(_ptr(gl), per_token, 1.0 if scale is None else scale, _ptr(x), _ptr(t),
                         t_dt == "int32", _ptr(lse), _ptr(grad_o), M, N, x_dt, ignore_index, eps, z,
                         reduction, dev, ctx.stream, _Bump(f32_o, i32_o))

    return results, {"cpu": cpu_cb, "gpu": gpu_cb}
