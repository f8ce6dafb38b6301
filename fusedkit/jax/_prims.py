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
    """The device of eager (concrete) arrays; None when any is traced (decided at lowering)."""
    dev = None
    for a in args:
        if a is None:
            continue
        if isinstance(a, jax.core.Tracer):
            return None
        if dev is None:
            try:
                devs = a.devices()
            except Exception:
                return None
            if len(devs) != 1:
                return None
            dev = next(iter(devs))
    return dev


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
        r = list(r)
        np.asarray(y_o)[...] = r.pop(0)
        if h_o is not None:
            np.asarray(h_o)[...] = r.pop(0)
        if mean_o is not None:
            np.asarray(mean_o)[...] = r[0]
        if rstd_o is not None:
            np.asarray(rstd_o)[...] = r[-1]

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

    return buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, _sds(shape, o_dt), vmap_method=_VMAP)


@functools.lru_cache(maxsize=None)
def _softmax_bwd_callable(platform: str, key):
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

    return buffer_callback(cpu_cb if platform == "cpu" else gpu_cb, _sds(shape, y_dt), vmap_method=_VMAP)
