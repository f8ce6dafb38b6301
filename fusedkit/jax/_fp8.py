"""FP8 ops on JAX GPU arrays and traced values as XLA buffer callbacks (the platform dispatch and
helpers of ``fusedkit.jax._prims``): quantize (per tensor, block-scaled), dequantize, LayerNorm / RMSNorm
and the activations with FP8 output, cast_transpose_dbias / dact_cast_transpose and the FP8 GEMM.

Each op's GPU callback launches the kernels the CuPy / torch path launches, on XLA's stream (``ctx.stream``),
with XLA's buffers; outputs the kernels merge into (amax: atomicMax) are zeroed on that stream first, and
scratch is extra outputs that XLA allocates and that are dropped afterwards. The CPU callbacks run the
reference (``fusedkit.reference``). The callbacks are built per static configuration (``{"cpu": ...,
"gpu": ...}``, so tests can run the GPU one on fake buffers without a GPU).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from .. import _dtypes
from .. import reference as _ref
from ._prims import _VMAP, _dispatch, _np, _ptr, _rows, _sds, _w_dtype, write_norm_extras


def scale_array(s, who: str, what: str):
    """A per-tensor scale of a JAX call (``what``: the argument's name, for errors) as a (1,) float32 JAX
    array: a float / NumPy value, or a 1-element float32 JAX array (traced or not)."""
    import jax.numpy as jnp

    from .. import _interop
    on_device = hasattr(s, "shape") and not isinstance(s, (np.ndarray, np.generic))
    if on_device and _interop.framework(s) not in _interop.JAX_KINDS:
        raise TypeError(f"{who}: `{what}` must be a JAX array like the input, or a float")
    if np.size(s) != 1 or (on_device and _dtypes.canonical_or_name(s.dtype) != "float32"):
        raise ValueError(f"{who}: `{what}` must be a float or a 1-element float32 array")
    return jnp.reshape(s, (1,)) if on_device else jnp.full((1,), np.float32(np.asarray(s).reshape(())), jnp.float32)


# ----------------------------------------------------------------------------------------------------
# FP8 per-tensor quantize (delayed / current scaling, optionally with the transposed bytes) and
# dequantize (every scaling mode): fusedkit.quantize / fusedkit.dequantize on JAX GPU arrays and tracers.
# The amax output is zeroed on XLA's stream before the cast kernels merge into it (atomicMax); current
# scaling's scale is an extra fp32 output (scratch), dropped afterwards.

def update_scales(history, scale, scale_inv, fp8_max, margin, algo):
    """fusedkit.fp8.update_scales on JAX arrays (eager or traced): the new (history, scale, scale_inv)
    come back as new arrays (JAX arrays are immutable; scale_inv None when not given), bit for bit the
    reference's step. On a GPU the CuPy path's kernel (fp8_update_scales) runs on copies of the inputs:
    XLA's GPU fp32 division is not correctly rounded (the jax.numpy step below read scales 1 ulp off in
    a quarter of the tensors on an H100, 2026-12-07). On the CPU the jax.numpy step runs; XLA flushes
    fp32 subnormals to zero there, which leaves two differences from the reference, both at the ends
    of fp32's range: a scale_inv whose value is subnormal (a scale of 2^126 or more, from an amax below
    about 5e-36) and a scale that would be subnormal (an amax near fp32's max with a margin) come back
    0, where the reference keeps the subnormal."""
    key = (int(history.shape[0]), int(history.shape[1]), float(fp8_max), int(margin), algo)
    new_h, new_s, new_si = _dispatch(functools.partial(_update_jnp, fp8_max=fp8_max, margin=margin, algo=algo),
                                     lambda device: _update_callable(key), (history, scale))
    return new_h, new_s, None if scale_inv is None else new_si


def _update_jnp(history, scale, *, fp8_max, margin, algo):
    """The delayed-scaling step in jax.numpy, fp32 throughout (the CPU path of update_scales)."""
    import jax
    import jax.numpy as jnp
    f32, f32_max = jnp.float32, np.finfo(np.float32).max
    # a subnormal amax would read as 0 (flushed) and keep the previous scale; the reference divides by
    # it (fp8_max / amax overflows: fp32 max). `tiny`: the amax is a positive subnormal, found on the bits
    bits = jax.lax.bitcast_convert_type(history.astype(f32), jnp.int32)
    subnormal = (bits > 0) & (bits < 0x00800000)
    if algo == "max":
        amax = jnp.max(history, axis=0)  # NaN wins, as in NumPy
        tiny = jnp.any(subnormal, axis=0) & (amax == 0)
    else:
        amax, tiny = history[0], subnormal[0]
    new = jnp.roll(history, -1, axis=0) if history.shape[0] > 1 else history
    new = new.at[0].set(0)
    sf = (f32(fp8_max) / amax) / f32(2.0 ** margin)
    sf = jnp.where(amax > 0, sf, scale)                  # amax 0: the previous scale
    sf = jnp.where(jnp.isfinite(amax), sf, scale)        # inf / NaN: the previous scale
    sf = jnp.where(jnp.isinf(sf) | tiny, f32(f32_max), sf).astype(f32)
    return new, sf, (f32(1) / sf).astype(f32)


@functools.lru_cache(maxsize=None)
def _update_callable(key):
    """The GPU path of update_scales: (history, scale) -> new (history, scale, scale_inv) buffers."""
    L, n, fp8_max, margin, algo = key

    def gpu_cb(ctx, out, history, scale):
        import cupy

        from ..backends import cuda_fp8
        h_o, s_o, si_o = out
        dev = history.__dlpack_device__()[1]
        stream = int(ctx.stream)
        with cupy.cuda.Device(dev):
            if n:  # the kernel updates in place: it runs on the outputs, copies of the inputs
                d2d = cupy.cuda.runtime.memcpyDeviceToDevice
                cupy.cuda.runtime.memcpyAsync(_ptr(h_o), _ptr(history), 4 * L * n, d2d, stream)
                cupy.cuda.runtime.memcpyAsync(_ptr(s_o), _ptr(scale), 4 * n, d2d, stream)
                cuda_fp8.update_scales(_ptr(h_o), _ptr(s_o), _ptr(si_o), L, n, fp8_max, margin,
                                       algo == "most_recent", dev, stream)

    results = (_sds((L, n), "float32"), _sds((n,), "float32"), _sds((n,), "float32"))
    return buffer_callback(gpu_cb, results, vmap_method=_VMAP)


def quantize(x, scale, fmt, eps, pow2, transpose):
    """(data, data_t or None, scale_inv (1,), amax (1,)): delayed scaling with ``scale`` (a 1-element
    float32 array), current scaling with ``scale`` None (``eps`` / ``pow2``: the recipe's amax epsilon
    and power-of-2 rule)."""
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), fmt, scale is None, float(eps), bool(pow2), bool(transpose))
    return _dispatch(_quantize_callable("cpu", key), lambda device: _quantize_callable("gpu", key),
                     (x, scale))


def _quantize_results(key):
    shape, x_dt, fmt, current, eps, pow2, transpose = key
    N, M = _rows(shape) if shape else (1, 1)
    return (_sds(shape, "uint8"), _sds((N, M), "uint8") if transpose else None, _sds((1,), "float32"),
            _sds((1,), "float32"), _sds((1,), "float32") if current else None)


@functools.lru_cache(maxsize=None)
def _quantize_callable(platform: str, key):
    call = buffer_callback(_quantize_callbacks(key)[platform], _quantize_results(key), vmap_method=_VMAP)

    def run(x, scale):
        return call(x, scale)[:4]  # current scaling's scale (scratch) ends here

    return run


def _quantize_callbacks(key):
    """{"cpu": callback, "gpu": callback} of the per-tensor cast (tests run the GPU one on fake buffers)."""
    shape, x_dt, fmt, current, eps, pow2, transpose = key
    N, M = _rows(shape) if shape else (1, 1)

    def cpu_cb(ctx, out, x, scale):
        data_o, data_t_o, sinv_o, amax_o, _ = out
        xa = _np(x)
        if current:
            data, sinv, amax, _s = _ref.fp8.quantize_current(xa, fmt, eps, pow2)
        else:
            data, sinv, amax = _ref.fp8.quantize_delayed(xa, np.float32(_np(scale).reshape(())), fmt)
        np.asarray(data_o)[...] = data
        if data_t_o is not None:
            np.asarray(data_t_o)[...] = _ref.fp8.transpose_2d(data)
        np.asarray(sinv_o)[...] = sinv
        np.asarray(amax_o)[...] = amax

    def gpu_cb(ctx, out, x, scale):
        import cupy

        from ..backends import cuda_fp8
        data_o, data_t_o, sinv_o, amax_o, scale_o = out
        dev = x.__dlpack_device__()[1]
        ap = _ptr(amax_o)
        if current:  # the amax pass fills amax_o, the cast derives its scale from it into scale_o
            ptrs = (0, ap, _ptr(scale_o), _ptr(sinv_o), 0)
        else:        # the cast merges the amax of x into amax_o
            ptrs = (_ptr(scale), 0, 0, _ptr(sinv_o), ap)
        opts = (x_dt, fmt, current, eps, int(pow2), dev, ctx.stream)
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.memsetAsync(ap, 0, 4, int(ctx.stream))
            # launched for empty tensors too: block 0 writes scale_inv
            if transpose:
                cuda_fp8.cast_transpose(_ptr(x), _ptr(data_o), _ptr(data_t_o), *ptrs, M, N, *opts)
            else:
                cuda_fp8.quantize(_ptr(x), _ptr(data_o), *ptrs, M * N, *opts)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


def dequantize(data, scale, fmt, kernel_mode, mode, block, srows, scols, out_dtype):
    """FP8 bytes ``data`` -> values of ``out_dtype``; ``kernel_mode``: a cuda_fp8.DEQUANT_MODES key (of the
    FP8Tensor's ``mode`` and ``block``), ``scale`` its scales (srows x scols; a 1-element float32 array
    per tensor)."""
    block = tuple(block) if isinstance(block, (tuple, list)) else block
    key = (tuple(data.shape), fmt, kernel_mode, mode, block, srows, scols, out_dtype)
    return _dispatch(_dequantize_callable("cpu", key), lambda device: _dequantize_callable("gpu", key),
                     (data, scale))


@functools.lru_cache(maxsize=None)
def _dequantize_callable(platform: str, key):
    shape, out_dt = key[0], key[-1]
    return buffer_callback(_dequantize_callbacks(key)[platform], _sds(shape, out_dt), vmap_method=_VMAP)


def _dequantize_callbacks(key):
    shape, fmt, kernel_mode, mode, block, srows, scols, out_dt = key
    cols, rows = _rows(shape) if shape else (1, 1)

    def cpu_cb(ctx, out, data, scale):
        from ..fp8.tensor import FP8Tensor
        s = _np(scale)
        t = FP8Tensor(_np(data), s.reshape(()) if mode == "tensor" else s.reshape(srows, scols), fmt,
                      mode=mode, block=block)
        np.asarray(out)[...] = t.dequantize(_dtypes.numpy_dtype(out_dt))

    def gpu_cb(ctx, out, data, scale):
        if rows * cols == 0:
            return
        import cupy

        from ..backends import cuda_fp8
        dev = data.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cuda_fp8.dequantize(_ptr(data), _ptr(scale), _ptr(out), rows, cols, scols, fmt, out_dt, kernel_mode,
                                dev, ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# LayerNorm / RMSNorm with FP8 output (fusedkit.layer_norm(..., fp8_fmt=, fp8_scale=))

def norm_forward(x, weight, bias, residual, scale, eps, zero_centered_gamma, fmt, return_stats, rms):
    """(bytes, scale_inv (1,), amax (1,) of the fp32 y, h or None, mean or None, rstd or None);
    ``scale`` a 1-element float32 array (the delayed scale)."""
    if rms:
        bias = None
    x_dt = _dtypes.canonical(x.dtype)
    key = (tuple(x.shape), x_dt, _w_dtype(x_dt, weight, bias), weight is not None, bias is not None,
           residual is not None, float(eps), bool(zero_centered_gamma), bool(return_stats), bool(rms), fmt)
    return _dispatch(_norm_callable("cpu", key), lambda device: _norm_callable("gpu", key),
                     (x, residual, weight, bias, scale))


def _norm_results(key):
    shape, x_dt, w_dt, has_w, has_b, has_r, eps, zc, stats, rms, fmt = key
    return (_sds(shape, "uint8"), _sds((1,), "float32"), _sds((1,), "float32"),
            _sds(shape, x_dt) if has_r else None,
            _sds(shape[:-1], "float32") if stats and not rms else None,
            _sds(shape[:-1], "float32") if stats else None)


@functools.lru_cache(maxsize=None)
def _norm_callable(platform: str, key):
    return buffer_callback(_norm_callbacks(key)[platform], _norm_results(key), vmap_method=_VMAP)


def _norm_callbacks(key):
    """{"cpu": callback, "gpu": callback} of the FP8-output forward (tests run the GPU one on fake buffers)."""
    shape, x_dt, w_dt, has_w, has_b, has_r, eps, zc, stats, rms, fmt = key
    N = shape[-1]
    M = math.prod(shape[:-1])

    def cpu_cb(ctx, out, x, res, w, b, scale):
        y_o, sinv_o, amax_o, h_o, mean_o, rstd_o = out
        r = _ref.norms._forward_fp8(_np(x), _np(w), None if rms else _np(b), _np(res), eps, zc, fmt,
                                    _np(scale).reshape(()), True, rms)
        t = r[0]
        np.asarray(y_o)[...] = t.data
        np.asarray(sinv_o)[...] = t.scale_inv
        np.asarray(amax_o)[...] = t.amax
        write_norm_extras(r[1:], h_o, mean_o, rstd_o)

    def gpu_cb(ctx, out, x, res, w, b, scale):
        import cupy

        from ..backends import cuda_norms
        y_o, sinv_o, amax_o, h_o, mean_o, rstd_o = out
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.memsetAsync(_ptr(amax_o), 0, 4, int(ctx.stream))  # the kernel merges into it
            # launched for M = 0 too: one block writes scale_inv
            cuda_norms.forward_fp8(_ptr(x), _ptr(res), _ptr(w), _ptr(b), _ptr(y_o), _ptr(h_o), _ptr(mean_o),
                                   _ptr(rstd_o), _ptr(scale), _ptr(sinv_o), _ptr(amax_o), M, N, x_dt, w_dt, fmt,
                                   eps, int(zc), rms, dev, ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# FP8 GEMM (fusedkit.fp8_gemm): the sm_90 kernel of cuda/fp8_gemm_sm90.cu on XLA's stream, planned once
# per (problem, device) as fusedkit/_callcache.py does for CuPy and torch. ``accumulate_into`` is an input
# here (JAX arrays are immutable): it is copied into the output on the stream, and the kernel adds into
# that. A stream-K tail's workspace is the persistent one cuda_gemm keeps per (device, stream).

def gemm(a_data, b_data, scale_a, scale_b, bias, out_scale, acc, key):
    """(out, amax or None): key = (M, N, K, fa, fb, mode, out_kind, bias_dtype, activation, act_id,
    accumulate, split); scale_a / scale_b 1-element float32 arrays (per tensor) or the block scales."""
    return _dispatch(_gemm_callable("cpu", key), lambda device: _gemm_callable("gpu", key),
                     (a_data, b_data, scale_a, scale_b, bias, out_scale, acc))


def _gemm_results(key):
    M, N, K, fa, fb, mode, out_kind, bias_dt, activation, act_id, accumulate, split = key
    fp8_out = out_kind in ("e4m3", "e5m2")
    return (_sds((M, N), "uint8" if fp8_out else out_kind), _sds((1,), "float32") if fp8_out else None)


@functools.lru_cache(maxsize=None)
def _gemm_callable(platform: str, key):
    return buffer_callback(_gemm_callbacks(key)[platform], _gemm_results(key), vmap_method=_VMAP)


_gemm_plans: dict = {}


def _gemm_callbacks(key):
    """{"cpu": callback, "gpu": callback} of the FP8 GEMM (tests run the GPU one on fake buffers)."""
    M, N, K, fa, fb, mode, out_kind, bias_dt, activation, act_id, accumulate, split = key
    fp8_out = out_kind in ("e4m3", "e5m2")

    def cpu_cb(ctx, out, a, b, sa, sb, bias, out_scale, acc):
        from ..fp8.tensor import FP8Tensor
        from ..reference import gemm as ref_gemm
        out_o, amax_o = out
        if mode == "tensor":
            ta = FP8Tensor(_np(a), _np(sa).reshape(()), fa)
            tb = FP8Tensor(_np(b), _np(sb).reshape(()), fb)
        else:
            ta = FP8Tensor(_np(a), _np(sa), fa, mode="block", block=(1, 128))
            tb = FP8Tensor(_np(b), _np(sb), fb, mode="block", block=(128, 128))
        r = ref_gemm.fp8_gemm(ta, tb, out_dtype=out_kind, bias=_np(bias), activation=activation,
                              out_scale=None if out_scale is None else _np(out_scale).reshape(()),
                              accumulate_into=None if acc is None else np.array(_np(acc)))
        if fp8_out:
            np.asarray(out_o)[...] = r.data
            np.asarray(amax_o)[...] = r.amax
        else:
            np.asarray(out_o)[...] = r

    def gpu_cb(ctx, out, a, b, sa, sb, bias, out_scale, acc):
        import cupy

        from ..backends import cuda_gemm
        out_o, amax_o = out
        dev = a.__dlpack_device__()[1]
        stream = int(ctx.stream)
        with cupy.cuda.Device(dev):
            if not cuda_gemm.supported(dev):
                raise RuntimeError("fusedkit.fp8_gemm on JAX arrays runs the sm_90 kernel only (compute "
                                   "capability 9.0); on other GPUs pass CuPy or torch views of the operands")
            pl = _gemm_plans.get((key, dev))
            if pl is None:
                gmode = "block" if mode == "block" else ("split" if split else "fast")
                pl = _gemm_plans[(key, dev)] = cuda_gemm.plan(M, N, K, fa, fb, gmode, out_kind, bias_dt, act_id,
                                                              accumulate, dev)
            if fp8_out:
                cupy.cuda.runtime.memsetAsync(_ptr(amax_o), 0, 4, stream)  # the kernel merges into it
            if accumulate:  # C += A B^T on a copy of accumulate_into
                nbytes = M * N * (4 if out_kind == "float32" else 2)
                cupy.cuda.runtime.memcpyAsync(_ptr(out_o), _ptr(acc), nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToDevice, stream)
            cuda_gemm.launch(pl, _ptr(a), _ptr(b), _ptr(out_o), _ptr(bias), _ptr(sa), _ptr(sb), _ptr(out_scale),
                             _ptr(amax_o), stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# cast_transpose_dbias / dact_cast_transpose (fusedkit.fp8.api._cast_transpose_fused): fp8_ct_tile on
# XLA's stream. Its scratch is extra outputs, dropped afterwards: one zeroed fp32 buffer of the amax and
# the dbias ticket counters, the dbias partial rows, current scaling's scale, and (dact on rows of
# N % 8 != 0, which the 16-byte loads can't take) an fp32 g that the fp32 kernel then casts.

def cast_transpose_fused(dy, x, scale, key):
    """(data, data_t, scale_inv, amax, dbias or None); key = (shape, dy dtype, fmt, activation or None,
    act_id, current, eps, pow2, want_dbias)."""
    return _dispatch(_ct_fused_callable("cpu", key), lambda device: _ct_fused_callable("gpu", key), (dy, x, scale))


def _ct_fused_dims(key):
    from ..backends import cuda_fp8
    shape, d_dt, fmt, activation, act_id, current, eps, pow2, want_dbias = key  # shape: x's (the output's)
    N = shape[-1]
    M = math.prod(shape[:-1]) if N else 0
    gated = activation is not None and cuda_fp8.is_gated(act_id)
    g_scratch = activation is not None and (N // 2 if gated else N) % 8 != 0
    return M, N, g_scratch


def _ct_fused_results(key):
    from ..backends import cuda_fp8
    shape, d_dt, fmt, activation, act_id, current, eps, pow2, want_dbias = key
    M, N, g_scratch = _ct_fused_dims(key)
    gx, gy = cuda_fp8.ct_grid(M, N, want_dbias)
    return (_sds(shape, "uint8"), _sds((N, M), "uint8"), _sds((1,), "float32"),
            _sds((1 + (gx if want_dbias else 0),), "float32"),
            _sds((N,), "float32" if g_scratch else d_dt) if want_dbias else None,
            _sds((gy, N), "float32") if want_dbias else None,
            _sds((1,), "float32") if current else None,
            _sds((M, N), "float32") if g_scratch else None)


@functools.lru_cache(maxsize=None)
def _ct_fused_callable(platform: str, key):
    call = buffer_callback(_ct_fused_callbacks(key)[platform], _ct_fused_results(key), vmap_method=_VMAP)
    d_dt = key[1]

    def run(dy, x, scale):
        data, data_t, sinv, buf, db = call(dy, x, scale)[:5]
        if db is not None and str(db.dtype) != str(_dtypes.numpy_dtype(d_dt)):
            db = db.astype(_dtypes.numpy_dtype(d_dt))  # the fp32 kernel's dbias, rounded to dy's dtype
        return data, data_t, sinv, buf[:1], db

    return run


def _ct_fused_callbacks(key):
    """{"cpu": callback, "gpu": callback} (tests run the GPU one on fake buffers)."""
    shape, d_dt, fmt, activation, act_id, current, eps, pow2, want_dbias = key
    M, N, g_scratch = _ct_fused_dims(key)

    def cpu_cb(ctx, out, dy, x, scale):
        data_o, data_t_o, sinv_o, buf_o, db_o = out[:5]
        s = None if current else np.float32(_np(scale).reshape(()))
        if x is None:
            data, data_t, sinv, amax, db = _ref.fp8.cast_transpose_dbias(_np(dy), fmt, s, eps, pow2)
        else:
            data, data_t, sinv, amax, db = _ref.fp8.dact_cast_transpose(_np(dy), _np(x), activation, fmt, s, eps,
                                                                        pow2)
        np.asarray(data_o)[...] = data
        np.asarray(data_t_o)[...] = data_t
        np.asarray(sinv_o)[...] = sinv
        np.asarray(buf_o)[:1] = amax
        if db_o is not None:
            np.asarray(db_o)[...] = db

    def gpu_cb(ctx, out, dy, x, scale):
        import cupy

        from ..backends import cuda_fp8
        data_o, data_t_o, sinv_o, buf_o, db_o, part_o, scale_o, g_o = out
        dev = dy.__dlpack_device__()[1]
        stream = int(ctx.stream)
        bp = _ptr(buf_o)
        if current:  # the amax pass fills buf[0], the cast derives its scale from it into scale_o
            sptr, amax_in, scale_out, amax_out = 0, bp, _ptr(scale_o), 0
        else:
            sptr, amax_in, scale_out, amax_out = _ptr(scale), 0, 0, bp
        if (x is not None and not g_scratch
                and cuda_fp8.ct_fast_vec(N, (_ptr(x), _ptr(dy)), (_ptr(data_o), _ptr(data_t_o)),
                                         cuda_fp8.is_gated(act_id)) == 1):
            raise RuntimeError("fusedkit: dact_cast_transpose on JAX: XLA handed buffers the 16-byte loads "
                               "cannot take and no fp32 scratch was staged (internal error)")
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.memsetAsync(bp, 0, 4 * buf_o.shape[0], stream)  # amax, dbias tickets
            # launched for empty tensors too: block (0, 0) writes scale_inv; dbias of M = 0 rows is zeros
            cuda_fp8.cast_transpose_fused(_ptr(dy) if x is None else _ptr(x), 0 if x is None else _ptr(dy),
                                          _ptr(data_o), _ptr(data_t_o), sptr, amax_in, scale_out, _ptr(sinv_o),
                                          amax_out, _ptr(part_o), bp + 4 if want_dbias else 0, _ptr(db_o), M, N,
                                          d_dt, fmt, -1 if x is None else act_id, current, eps, int(pow2), dev,
                                          ctx.stream, g=_ptr(g_o))

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# block-scaled quantize (fusedkit.quantize with MXFP8Scaling / BlockScaling): bytes and per-block scales

def quantize_blocks(x, fmt, variant):
    """(data, scales); variant "mxfp8" (32 along rows, E8M0), "mxfp8_cols" (32 rows of each column,
    E8M0), "1x128" or "128x128" (fp32 power-of-two scale_inv)."""
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), fmt, variant)
    return _dispatch(_blocks_callable("cpu", key), lambda device: _blocks_callable("gpu", key), (x,))


def _blocks_dims(shape, variant):
    """(M, K, the scale array's shape, its dtype) of x viewed as (M, K)."""
    K = shape[-1] if shape else 1
    M = math.prod(shape[:-1]) if K else 0
    if variant == "mxfp8":
        return M, K, tuple(shape[:-1]) + (-(-K // 32),), "uint8"
    if variant == "mxfp8_cols":
        return M, K, (-(-M // 32), K), "uint8"
    if variant == "1x128":
        return M, K, tuple(shape[:-1]) + (-(-K // 128),), "float32"
    return M, K, (-(-M // 128), -(-K // 128)), "float32"


@functools.lru_cache(maxsize=None)
def _blocks_callable(platform: str, key):
    shape, x_dt, fmt, variant = key
    _, _, s_shape, s_dt = _blocks_dims(shape, variant)
    return buffer_callback(_blocks_callbacks(key)[platform], (_sds(shape, "uint8"), _sds(s_shape, s_dt)),
                           vmap_method=_VMAP)


def _blocks_callbacks(key):
    """{"cpu": callback, "gpu": callback} (tests run the GPU one on fake buffers)."""
    shape, x_dt, fmt, variant = key
    M, K, _, _ = _blocks_dims(shape, variant)

    def cpu_cb(ctx, out, x):
        data_o, sc_o = out
        xa = _np(x)
        if variant == "mxfp8":
            data, sc = _ref.fp8.quantize_mxfp8(xa, fmt, 32)
        elif variant == "mxfp8_cols":
            data, sc = _ref.fp8.quantize_mxfp8_columnwise(xa, fmt, 32)
        else:
            data, sc = _ref.fp8.quantize_blockwise(xa, (1, 128) if variant == "1x128" else (128, 128), fmt)
        np.asarray(data_o)[...] = data
        np.asarray(sc_o)[...] = np.asarray(sc).reshape(np.asarray(sc_o).shape)

    def gpu_cb(ctx, out, x):
        if M * K == 0:
            return
        import cupy

        from ..backends import cuda_fp8
        data_o, sc_o = out
        dev = x.__dlpack_device__()[1]
        args = (_ptr(x), _ptr(data_o), _ptr(sc_o), M, K, x_dt, fmt)
        with cupy.cuda.Device(dev):
            if variant == "mxfp8_cols":
                cuda_fp8.quantize_mx_columnwise(*args, dev, ctx.stream)
            elif variant == "128x128":
                cuda_fp8.quantize_blocks_2d(*args, dev, ctx.stream)
            else:
                cuda_fp8.quantize_blocks(*args, variant == "mxfp8", dev, ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}


# ----------------------------------------------------------------------------------------------------
# activations with FP8 output (fusedkit.gelu(..., fp8_fmt=, fp8_scale=) and friends)

def act_forward(x, bias, scale, kind, fmt):
    """(bytes (..., H), scale_inv (1,), amax (1,) of the fp32 activation); ``scale`` a (1,) float32 array."""
    key = (tuple(x.shape), _dtypes.canonical(x.dtype), kind, fmt, bias is not None)
    return _dispatch(_act_callable("cpu", key), lambda device: _act_callable("gpu", key), (x, bias, scale))


@functools.lru_cache(maxsize=None)
def _act_callable(platform: str, key):
    shape, x_dt, kind, fmt, has_b = key
    H = shape[-1] // 2 if kind in _ref.activations.GATED else shape[-1]
    results = (_sds(tuple(shape[:-1]) + (H,), "uint8"), _sds((1,), "float32"), _sds((1,), "float32"))
    return buffer_callback(_act_callbacks(key)[platform], results, vmap_method=_VMAP)


def _act_callbacks(key):
    """{"cpu": callback, "gpu": callback} (tests run the GPU one on fake buffers)."""
    shape, x_dt, kind, fmt, has_b = key
    N = shape[-1]
    H = N // 2 if kind in _ref.activations.GATED else N
    M = math.prod(shape[:-1])

    def cpu_cb(ctx, out, x, b, scale):
        data_o, sinv_o, amax_o = out
        y32 = _ref.activations.forward(_np(x), kind, _np(b), np.float32)
        data, sinv, amax = _ref.fp8.quantize_delayed(y32, np.float32(_np(scale).reshape(())), fmt)
        np.asarray(data_o)[...] = data
        np.asarray(sinv_o)[...] = sinv
        np.asarray(amax_o)[...] = amax

    def gpu_cb(ctx, out, x, b, scale):
        import cupy

        from ..backends import cuda_activations
        data_o, sinv_o, amax_o = out
        dev = x.__dlpack_device__()[1]
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.memsetAsync(_ptr(amax_o), 0, 4, int(ctx.stream))  # the kernel merges into it
            cuda_activations.forward_fp8(_ptr(x), _ptr(b), _ptr(data_o), _ptr(scale), _ptr(sinv_o), _ptr(amax_o),
                                         M, H, x_dt, fmt, kind, dev, ctx.stream)

    return {"cpu": cpu_cb, "gpu": gpu_cb}
