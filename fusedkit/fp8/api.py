"""``fusedkit.quantize`` / ``fusedkit.cast_transpose`` / ``fusedkit.dequantize``.

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
cuda/fp8_cast.cu; JAX GPU arrays (and tracers inside ``jax.jit``) the same kernels through XLA buffer
callbacks (every quantize mode, the fused casts, dequantize).
"""
from __future__ import annotations

import math

import numpy as np

from .. import _callcache, _dtypes, _interop
from ..reference import activations as _ref_act
from ..reference import fp8 as _ref
from . import _amax
from .formats import as_format
from .recipes import BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, delayed_scale, update_amax_history
from .tensor import FP8Tensor, host_copy

_HOST = _interop.HOST_KINDS
_CURRENT = CurrentScaling()  # the default recipe (frozen): built once, not per call (3 us a call)


def cast_transpose(x, *, fmt="e4m3", scale=None, recipe=None, amax_out=None) -> FP8Tensor:
    """``quantize(x, ..., transpose=True)``: row-wise and transposed FP8 bytes in one pass."""
    return quantize(x, fmt=fmt, scale=scale, recipe=recipe, transpose=True, amax_out=amax_out)


def quantize(x, *, fmt="e4m3", scale=None, recipe=None, transpose=False, weight=False,
             columnwise=False, amax_out=None) -> FP8Tensor:
    """FP8-quantize ``x`` with a per-tensor scale: delayed (``scale`` given) or current scaling;
    ``transpose=True`` also writes the transposed bytes (``.data_t``, (N, M)). ``amax_out`` (delayed
    scaling): a 1-element float32 array of x's framework, e.g. ``history[0, i:i+1]``, that the amax of x
    is merged into (``max``) instead of a new array; ``.amax`` is then that array (see
    ``fusedkit.fp8._amax``: no zeroing per call, microbatches accumulate). With ``recipe`` an
    ``MXFP8Scaling`` or a ``BlockScaling``, block-scaled bytes and per-block scales; ``weight=True``
    takes a BlockScaling's weight blocks (128 x 128) instead of its activation blocks (1 x 128).
    ``columnwise=True`` with ``MXFP8Scaling``: blocks of 32 rows of each column of x viewed as 2-D
    (M, N), Transformer Engine's columnwise MXFP8 for the weight-gradient GEMM: ``.data`` in x's
    layout, ``.scale_inv`` E8M0 bytes of shape (ceil(M / 32), N), ``.block == (32, 1)``."""
    if not transpose and amax_out is None and not columnwise and (recipe is None or type(recipe) is CurrentScaling):
        t = _callcache.quantize(x, fmt, scale, recipe or _CURRENT)
        if t is not None:  # a repeat call of a signature that launched before (fusedkit/_callcache.py)
            return t
    f = as_format(fmt)
    if columnwise and not isinstance(recipe, MXFP8Scaling):
        raise ValueError("fusedkit.quantize: columnwise=True needs recipe=MXFP8Scaling() (column-wise "
                         "blocks of 32 rows); per-tensor scales are the same either way")
    _amax.require_delayed(amax_out, scale, "fusedkit.quantize")
    if isinstance(recipe, (MXFP8Scaling, BlockScaling)):
        if scale is not None or transpose:
            raise ValueError("fusedkit.quantize: block-scaled recipes take no `scale` and no `transpose`")
        if columnwise:
            return _quantize_mx_columnwise(x, f, recipe)
        return _quantize_blocks(x, f, recipe, weight)
    if recipe is not None and not isinstance(recipe, CurrentScaling):
        raise TypeError("fusedkit.quantize: recipe must be CurrentScaling, MXFP8Scaling or BlockScaling; "
                        "for delayed scaling pass the scale from your amax history as `scale=`")
    rec = recipe or _CURRENT
    kind = _interop.framework(x)
    x_dt = _dtypes.canonical(x.dtype)
    if kind in _HOST:
        xa = _interop.to_numpy(x, kind)
        if scale is not None:
            data, sinv, amax = _ref.quantize_delayed(xa, np.float32(np.asarray(scale).reshape(())), f)
        else:
            data, sinv, amax, _ = _ref.quantize_current(xa, f, rec.amax_epsilon, rec.power_of_2_scales)
        data_t = _interop.from_numpy(_ref.transpose_2d(data), kind) if transpose else None
        if amax_out is not None:
            amax = _amax.merge_host(amax_out, amax, kind, "fusedkit.quantize")
        return FP8Tensor(_interop.from_numpy(data, kind), sinv, f, amax, data_t=data_t)  # x's framework
    if kind == _interop.JAX:
        return _quantize_jax(x, f, scale, rec, transpose, amax_out)
    from ..backends import cuda_fp8

    X = _interop.view(x, kind, "x")
    data, dp = _interop.empty(kind, X, X.shape, "uint8")
    sinv, sp = _interop.empty(kind, X, (1,), "float32")
    amax, ap = _amax.device_target(amax_out, kind, X, "fusedkit.quantize")  # kernels merge into it (atomicMax)
    current = scale is None
    ptrs = _scale_ptrs(kind, X, scale, ap, "fusedkit.quantize")
    # launched for empty tensors too: block 0 writes scale_inv (and the current-scaling scale)
    args = (ptrs["scale"], ptrs["amax_in"], ptrs["scale_out"], sp, ptrs["amax_out"])
    opts = (x_dt, f.name, current, rec.amax_epsilon, int(rec.power_of_2_scales), X.device,
            _interop.stream(kind, X.device))
    if not transpose:
        cuda_fp8.quantize(X.ptr, dp, *args, X.size, *opts)
        if amax_out is None and kind in (_interop.CUPY, _interop.TORCH):
            _callcache.remember_quantize(x, fmt, f, scale, rec, kind, X.device, X.size, x_dt, current, X.ptr)
        return FP8Tensor(data, sinv, f, amax)
    N = X.shape[-1] if X.shape else 1
    M = X.size // N if N else 0
    data_t, dtp = _interop.empty(kind, X, (N, M), "uint8")
    cuda_fp8.cast_transpose(X.ptr, dp, dtp, *args, M, N, *opts)
    return FP8Tensor(data, sinv, f, amax, data_t=data_t)


def _quantize_jax(x, f, scale, rec, transpose, amax_out):
    """quantize on JAX GPU arrays and tracers: XLA buffer callbacks (fusedkit/jax/_fp8.py) running the
    kernels of the CuPy path on XLA's stream (the CPU reference under jit on the CPU)."""
    from ..jax import _fp8
    if amax_out is not None:
        _amax.check(amax_out, _interop.JAX, "fusedkit.quantize")  # raises: JAX arrays are immutable
    if scale is not None:  # (x's dtype was checked by quantize: _dtypes.canonical)
        scale = _fp8.scale_array(scale, "fusedkit.quantize", "scale")
    data, data_t, sinv, amax = _fp8.quantize(x, scale, f.name, rec.amax_epsilon, rec.power_of_2_scales, transpose)
    return FP8Tensor(data, sinv, f, amax, data_t=data_t)


def _scale_ptrs(kind, X, scale, ap, who):
    """The scale pointers of a per-tensor cast whose zeroed amax buffer is at ``ap``: current scaling
    (``scale`` None: the amax pass fills amax, the cast derives the scale from it) or delayed (a float,
    or a 1-element fp32 device array of the caller's framework)."""
    # "keep" holds the scratch arrays: the caller keeps the dict until its launches are queued (a
    # scratch freed before then could be handed to a later allocation of the same call, e.g. the fp32 g
    # of dact_cast_transpose, which then overwrote the scale; found on the H200, shape (5, 13))
    if scale is None:
        keep, scp = _interop.empty(kind, X, (1,), "float32")
        return dict(scale=0, amax_in=ap, scale_out=scp, amax_out=0, keep=keep)
    scale = _interop.plain_scalar(scale)
    if hasattr(scale, "shape"):
        if _interop.framework(scale) != kind:
            raise TypeError(f"{who}: `scale` must be a {kind} array like the input, or a float")
        S = _interop.view(scale, kind, "scale")
        if S.size != 1 or S.dtype != "float32":
            raise ValueError(f"{who}: `scale` must be a float or a 1-element float32 array")
        return dict(scale=S.ptr, amax_in=0, scale_out=0, amax_out=ap)
    keep, scp = _interop.full(kind, X, (1,), "float32", float(scale))
    return dict(scale=scp, amax_in=0, scale_out=0, amax_out=ap, keep=keep)


def cast_transpose_dbias(dy, *, fmt="e5m2", scale=None, recipe=None, amax_out=None):
    """Row-wise and transposed FP8 bytes of ``dy`` plus the bias gradient, in one pass (Transformer
    Engine's ``cast_transpose_dbias``, for the backward of a linear layer with bias).

    Returns ``(t, dbias)``: ``t`` an FP8Tensor (``.data``, ``.data_t`` of dy viewed as 2-D (M, N),
    ``.scale_inv``, ``.amax``) and ``dbias[n] = sum over the rows of dy[:, n]`` (fp32 accumulation,
    returned in dy's dtype; deterministic: fixed-order partial sums, no atomics). ``scale`` /
    ``recipe`` as in :func:`quantize` (delayed scaling with ``scale``, else current scaling). Gradients
    default to E5M2."""
    t, db = _cast_transpose_fused(dy, None, None, fmt, scale, recipe, True, "fusedkit.cast_transpose_dbias",
                                  amax_out)
    return t, db


def dact_cast_transpose(dy, x, *, activation="gelu", fmt="e5m2", scale=None, recipe=None, dbias=False,
                        amax_out=None):
    """The backward of an activation fused with the FP8 cast-transpose of its result (Transformer
    Engine's ``dgelu_cast_transpose_dbias`` and friends): ``g = dy * act'(x)`` in fp32, cast to FP8
    row-wise and transposed in one pass that reads dy and x once.

    ``activation``: ``"gelu"`` (= ``"gelu_tanh"``, TE's GeLU), ``"gelu_erf"``, ``"silu"``, ``"relu"``,
    ``"squared_relu"``; ``x`` is the activation's input (bias already added), of dy's shape and dtype.
    Gated: ``"swiglu"``, ``"geglu"`` (= ``"geglu_tanh"``, TE's GeGLU), ``"geglu_erf"``, ``"reglu"``
    (TE's dswiglu / dgeglu / dreglu cast-transposes): ``x = [a | b]`` along its last dim (2H), ``y =
    act(a) * b``, dy of shape (..., H); ``g = [dy * b * act'(a) | dy * act(a)]`` has x's shape, and
    ``data_t`` is (2H, M).
    Returns the FP8Tensor of g (``.amax`` is the amax of g), or ``(t, dbias)`` with ``dbias=True``
    (column sums of g over the rows of the 2-D view, fp32, returned in dy's dtype). ``scale`` /
    ``recipe`` as in :func:`quantize`: delayed scaling with ``scale``, else current scaling (which
    needs a first pass over dy and x for the amax of g)."""
    t, db = _cast_transpose_fused(dy, x, activation, fmt, scale, recipe, dbias, "fusedkit.dact_cast_transpose",
                                  amax_out)
    return (t, db) if dbias else t


def _cast_transpose_fused(dy, x, activation, fmt, scale, recipe, want_dbias, who, amax_out=None):
    f = as_format(fmt)
    _amax.require_delayed(amax_out, scale, who)
    if recipe is not None and not isinstance(recipe, CurrentScaling):
        raise TypeError(f"{who}: recipe must be None or a CurrentScaling; for delayed scaling pass the scale "
                        f"from your amax history as `scale=` (block-scaled recipes are not fused here)")
    rec = recipe or _CURRENT
    if activation is not None and activation not in _ref.DACT_KINDS:
        raise ValueError(f"{who}: activation must be one of {', '.join(_ref.DACT_KINDS)}, got {activation!r}")
    kind = _interop.framework(dy)
    _interop.check_same_framework(kind, (("x", x),))
    d_dt = _dtypes.canonical(dy.dtype)
    if d_dt not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"{who}: dy must be float32, float16 or bfloat16, got {d_dt}")
    if len(dy.shape) == 0:
        raise ValueError(f"{who}: dy needs at least one dimension (it is viewed as 2-D: rows x last dim)")
    gated = activation is not None and _ref.DACT_KINDS[activation] in _ref_act.GATED
    if gated:
        want = tuple(dy.shape[:-1]) + (2 * dy.shape[-1],)
        if tuple(x.shape) != want or _dtypes.canonical(x.dtype) != d_dt:
            raise ValueError(f"{who}: {activation} takes x = [a | b] with twice dy's last dim: x must be {want} "
                             f"{d_dt} for dy {tuple(dy.shape)}, got {tuple(x.shape)} {_dtypes.canonical(x.dtype)}")
    elif x is not None and (tuple(x.shape) != tuple(dy.shape) or _dtypes.canonical(x.dtype) != d_dt):
        raise ValueError(f"{who}: x must have dy's shape and dtype ({tuple(dy.shape)} {d_dt}), got "
                         f"{tuple(x.shape)} {_dtypes.canonical(x.dtype)}")
    if kind in _HOST:
        da = _interop.to_numpy(dy, kind)
        s = None if scale is None else np.float32(np.asarray(scale).reshape(()))
        if x is None:
            data, data_t, sinv, amax, db = _ref.cast_transpose_dbias(da, f, s, rec.amax_epsilon,
                                                                     rec.power_of_2_scales)
        else:
            data, data_t, sinv, amax, db = _ref.dact_cast_transpose(da, _interop.to_numpy(x, kind), activation, f,
                                                                    s, rec.amax_epsilon, rec.power_of_2_scales)
        if amax_out is not None:
            amax = _amax.merge_host(amax_out, amax, kind, who)
        t = FP8Tensor(_interop.from_numpy(data, kind), sinv, f, amax, data_t=_interop.from_numpy(data_t, kind))
        return t, (_interop.from_numpy(db, kind) if want_dbias else None)
    if kind == _interop.JAX:
        return _cast_transpose_fused_jax(dy, x, activation, f, scale, rec, want_dbias, who, amax_out, d_dt)
    from ..backends import cuda_fp8

    D = _interop.view(dy, kind, "dy")
    X = _interop.view(x, kind, "x") if x is not None else None
    _interop.same_device([D] + ([X] if X else []))
    out_shape = X.shape if gated else D.shape  # the cast values: x's shape for the gated kinds
    N = out_shape[-1]
    M = math.prod(out_shape[:-1]) if N else 0
    data, dp = _interop.empty(kind, D, out_shape, "uint8")
    data_t, dtp = _interop.empty(kind, D, (N, M), "uint8")
    sinv, sp = _interop.empty(kind, D, (1,), "float32")
    gx, gy = cuda_fp8.ct_grid(M, N, want_dbias)
    # amax (element 0, atomicMax target; unused with amax_out) and, with dbias, the kernel's gx ticket
    # counters: one zeroed buffer, not needed at all for amax_out without dbias (no zeroing per call)
    buf, bp = (None, 0) if amax_out is not None and not want_dbias else \
        _interop.full(kind, D, (1 + (gx if want_dbias else 0),), "float32", 0.0)
    amax, ap = (buf[:1], bp) if amax_out is None else _amax.device_target(amax_out, kind, D, who)
    ptrs = _scale_ptrs(kind, D, scale, ap, who)
    # dact on rows the 16-byte loads can't take: g goes through an fp32 scratch (cast by the fp32 kernel,
    # whose dbias is fp32: rounded to dy's dtype here)
    g_path = X is not None and cuda_fp8.ct_fast_vec(N, (X.ptr, D.ptr), (dp, dtp), gated) == 1
    db_dt = "float32" if g_path else d_dt
    # scratch (part, g) is released on return, after the launches are queued: the caching allocators
    # order its reuse after them on this stream
    db, dbp, part, partp, g, gp = None, 0, None, 0, None, 0
    if want_dbias:
        db, dbp = _interop.empty(kind, D, (N,), db_dt)
        part, partp = _interop.empty(kind, D, (gy, N), "float32")
    if g_path:
        g, gp = _interop.empty(kind, D, (M, N), "float32")
    # launched for empty tensors too: block (0, 0) writes scale_inv; dbias of M = 0 rows is zeros
    cuda_fp8.cast_transpose_fused(X.ptr if X else D.ptr, D.ptr if X else 0, dp, dtp, ptrs["scale"],
                                  ptrs["amax_in"], ptrs["scale_out"], sp, ptrs["amax_out"], partp,
                                  bp + 4 if want_dbias else 0, dbp, M, N, d_dt, f.name,
                                  cuda_fp8.DACT_ID[activation] if X else -1, scale is None, rec.amax_epsilon,
                                  int(rec.power_of_2_scales), D.device, _interop.stream(kind, D.device), g=gp)
    if db is not None and db_dt != d_dt:
        if kind == _interop.TORCH:
            import torch
            db = db.to(getattr(torch, d_dt))
        else:
            db = db.astype(d_dt)
    return FP8Tensor(data, sinv, f, amax, data_t=data_t), db


def _cast_transpose_fused_jax(dy, x, activation, f, scale, rec, want_dbias, who, amax_out, d_dt):
    """cast_transpose_dbias / dact_cast_transpose on JAX GPU arrays and tracers (an XLA buffer callback)."""
    from ..backends import cuda_fp8
    from ..jax import _fp8
    if amax_out is not None:
        _amax.check(amax_out, _interop.JAX, who)  # raises: JAX arrays are immutable
    s = None if scale is None else _fp8.scale_array(scale, who, "scale")
    key = (tuple((dy if x is None else x).shape), d_dt, f.name, activation,
           cuda_fp8.DACT_ID[activation] if x is not None else -1,
           scale is None, float(rec.amax_epsilon), bool(rec.power_of_2_scales), bool(want_dbias))
    data, data_t, sinv, amax, db = _fp8.cast_transpose_fused(dy, x, s, key)
    return FP8Tensor(data, sinv, f, amax, data_t=data_t), db


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
    if not mx and tuple(block) not in ((1, 128), (128, 128)):
        raise ValueError(f"fusedkit.quantize: block scaling supports 1 x 128 and 128 x 128 blocks on the GPU, "
                         f"got {tuple(block)}")
    if kind == _interop.JAX:
        from ..jax import _fp8
        variant = "mxfp8" if mx else ("1x128" if tuple(block) == (1, 128) else "128x128")
        if not mx and len(x.shape) != 2:
            raise ValueError(f"fusedkit: block scaling takes a 2-D array, got shape {tuple(x.shape)}")
        data, sc = _fp8.quantize_blocks(x, f.name, variant)
        return FP8Tensor(data, sc, f, mode="mxfp8" if mx else "block", block=32 if mx else tuple(block))
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


def _quantize_mx_columnwise(x, f, recipe) -> FP8Tensor:
    """Column-wise MXFP8: bytes in x's layout, E8M0 scales (ceil(M / 32), N) of x viewed as 2-D."""
    if recipe.block != 32:
        raise ValueError(f"fusedkit.quantize: MXFP8 blocks are 32 elements, got {recipe.block}")
    _dtypes.canonical(x.dtype)  # float32 / float16 / bfloat16, or a TypeError that says so
    kind = _interop.framework(x)
    if kind in _HOST:
        data, sc = _ref.quantize_mxfp8_columnwise(_interop.to_numpy(x, kind), f, 32)
        return FP8Tensor(_interop.from_numpy(data, kind), _interop.from_numpy(sc, kind), f, mode="mxfp8",
                         block=(32, 1))
    if kind == _interop.JAX:
        from ..jax import _fp8
        data, sc = _fp8.quantize_blocks(x, f.name, "mxfp8_cols")
        return FP8Tensor(data, sc, f, mode="mxfp8", block=(32, 1))
    from ..backends import cuda_fp8

    X = _interop.view(x, kind, "x")
    N = X.shape[-1] if X.shape else 1
    M = X.size // N if N else 0
    data, dp = _interop.empty(kind, X, X.shape, "uint8")
    sc, sp = _interop.empty(kind, X, (-(-M // 32), N), "uint8")
    if M and N:
        cuda_fp8.quantize_mx_columnwise(X.ptr, dp, sp, M, N, X.dtype, f.name, X.device,
                                        _interop.stream(kind, X.device))
    return FP8Tensor(data, sc, f, mode="mxfp8", block=(32, 1))


def update_scales(history, scale, scale_inv=None, *, recipe=None, fmt="e4m3"):
    """One delayed-scaling step for n tensors at once, in place: ``history`` (L x n fp32, row 0 the
    latest amax of each tensor), ``scale`` and optional ``scale_inv`` (n fp32). Takes amax as the
    history's max (or row 0 with ``amax_compute_algo="most_recent"``), rolls the history (row 0 is
    zeroed for the next step) and sets ``scale = fp8_max / amax / 2**margin`` (the previous scale kept
    for an amax of 0, inf or NaN), ``scale_inv = 1 / scale``. One kernel launch on device arrays.
    JAX arrays (eager, or traced under ``jax.jit``) are immutable: the updated ``(history, scale,
    scale_inv)`` come back as new arrays (on a GPU the same kernel; on the CPU the step in jax.numpy,
    bit for bit, except that XLA flushes a subnormal ``scale_inv`` to zero there) and the inputs stay
    as they were."""
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
    if kind in ("host", "torch_cpu"):
        _interop.check_same_framework(kind, (("scale", scale), ("scale_inv", scale_inv)))
        h, s, si = (a.detach().numpy() if kind == "torch_cpu" and a is not None else a  # share memory
                    for a in (history, scale, scale_inv))
        new, amax = update_amax_history(h, rec.amax_compute_algo)
        h[...] = new
        s[...] = delayed_scale(amax, s, f.max, rec.margin)
        if si is not None:
            si[...] = np.float32(1.0) / s
        return history, scale, scale_inv
    if kind in _interop.JAX_KINDS:  # immutable: the updated arrays come back new (also under jax.jit)
        _interop.check_same_framework(kind, (("scale", scale), ("scale_inv", scale_inv)))
        from ..jax import _fp8
        return _fp8.update_scales(history, scale, scale_inv, f.max, rec.margin, rec.amax_compute_algo)
    if kind not in (_interop.CUPY, _interop.TORCH):
        raise TypeError(f"fusedkit.fp8.update_scales takes NumPy, CuPy, torch or JAX arrays, got {kind}")
    from ..backends import cuda_fp8

    H = _interop.view(history, kind, "history")
    S = _interop.view(scale, kind, "scale")
    SI = _interop.view(scale_inv, kind, "scale_inv") if scale_inv is not None else None
    _interop.same_device([H, S] + ([SI] if SI else []))
    if n:
        cuda_fp8.update_scales(H.ptr, S.ptr, SI.ptr if SI else 0, L, n, f.max, rec.margin,
                               rec.amax_compute_algo == "most_recent", H.device, _interop.stream(kind, H.device))
    return history, scale, scale_inv


_DEQUANT_OUT = ("float32", "bfloat16", "float16")


def dequantize(t: FP8Tensor, dtype="float32"):
    """FP8Tensor -> its values in ``dtype`` ("float32", "bfloat16" or "float16"), as an array of the
    framework of ``t.data``: ``fp8_value(data) * scale`` rounded once to ``dtype``, with the scale of each
    element's scaling (per tensor ``scale_inv``; MXFP8 E8M0 blocks of 32 along the rows or, for
    ``block=(32, 1)``, down the columns; 1 x 128 or 128 x 128 fp32 block scales). Host arrays use the
    reference; CuPy arrays, CUDA torch tensors and JAX GPU arrays (also inside ``jax.jit``) the kernel of
    cuda/fp8_dequantize.cu (one pass)."""
    if not isinstance(t, FP8Tensor):
        raise TypeError(f"fusedkit.dequantize expects an FP8Tensor (fusedkit.quantize(...)), got {type(t).__name__}")
    try:
        out_dt = _dtypes.canonical(dtype)
    except TypeError:
        out_dt = str(dtype)
    if out_dt not in _DEQUANT_OUT:
        raise ValueError(f"fusedkit.dequantize: dtype must be one of {', '.join(_DEQUANT_OUT)}, got {dtype!r}")
    kind = _interop.framework(t.data)
    if kind in _HOST:
        return _interop.from_numpy(host_copy(t, kind).dequantize(_dtypes.numpy_dtype(out_dt)), kind)
    if kind == _interop.JAX:
        return _dequantize_jax(t, out_dt)
    from ..backends import cuda_fp8
    X = _interop.view(t.data, kind, "t.data")
    if X.dtype != "uint8":
        raise TypeError(f"fusedkit.dequantize: `t.data` must hold FP8 bytes (uint8), got {X.dtype}")
    cols = X.shape[-1] if X.shape else 1
    rows = X.size // cols if cols else 0
    mode, (srows, scols), sdt = _dequant_scales(t, rows, cols)
    s = t.scale_inv
    if mode == "tensor" and not (hasattr(s, "shape") and _interop.framework(s) == kind):
        s, _ = _interop.full(kind, X, (1,), "float32", float(np.float32(np.asarray(s).reshape(()))))
    if _interop.framework(s) != kind:
        raise TypeError(f"fusedkit.dequantize: `t.scale_inv` must be a {kind} array like `t.data` (or a "
                        f"float, per-tensor scaling), got {type(s).__name__}")
    S = _interop.view(s, kind, "t.scale_inv")
    if S.dtype != sdt or S.size != srows * scols:
        raise ValueError(f"fusedkit.dequantize: `t.scale_inv` of this {mode} FP8Tensor must hold {srows} x {scols} "
                         f"{sdt} values for data of shape {tuple(X.shape)}, got {tuple(S.shape)} {S.dtype}")
    _interop.same_device([X, S])
    out, op = _interop.empty(kind, X, tuple(X.shape), out_dt)
    cuda_fp8.dequantize(X.ptr, S.ptr, op, rows, cols, scols, t.fmt.name, out_dt, mode, X.device,
                        _interop.stream(kind, X.device))
    return out


def _dequantize_jax(t, out_dt):
    """dequantize of JAX GPU bytes (or tracers): an XLA buffer callback around the same kernel."""
    import jax.numpy as jnp

    from ..jax import _fp8
    if _dtypes.canonical_or_name(t.data.dtype) != "uint8":
        raise TypeError(f"fusedkit.dequantize: `t.data` must hold FP8 bytes (uint8), got {t.data.dtype}")
    shape = tuple(t.data.shape)
    cols = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if cols else 0
    mode, (srows, scols), sdt = _dequant_scales(t, rows, cols)
    s = t.scale_inv
    if mode == "tensor":
        s = _fp8.scale_array(s, "fusedkit.dequantize", "t.scale_inv")
    elif not hasattr(s, "shape") or _interop.framework(s) not in _interop.JAX_KINDS:
        raise TypeError(f"fusedkit.dequantize: `t.scale_inv` of a {mode} FP8Tensor must be a JAX array like "
                        f"`t.data`, got {type(s).__name__}")
    elif _dtypes.canonical_or_name(s.dtype) != sdt or int(np.prod(s.shape)) != srows * scols:
        raise ValueError(f"fusedkit.dequantize: `t.scale_inv` of this {mode} FP8Tensor must hold {srows} x {scols} "
                         f"{sdt} values for data of shape {shape}, got {tuple(s.shape)} {s.dtype}")
    return _fp8.dequantize(t.data, jnp.reshape(s, (srows * scols,)), t.fmt.name, mode, t.mode, t.block,
                           srows, scols, out_dt)


def _dequant_scales(t, rows, cols):
    """(cuda_fp8.DEQUANT_MODES key, the scale grid (rows, cols), its dtype) of a device FP8Tensor."""
    if t.mode == "tensor":
        return "tensor", (1, 1), "float32"
    block = tuple(t.block) if isinstance(t.block, (tuple, list)) else t.block
    if t.mode == "mxfp8" and block in (None, 32, (1, 32)):
        return "mxfp8", (rows, -(-cols // 32)), "uint8"
    if t.mode == "mxfp8" and block == (32, 1):
        return "mxfp8_cols", (-(-rows // 32), cols), "uint8"
    if t.mode == "block" and block == (1, 128):
        return "block_1x128", (rows, -(-cols // 128)), "float32"
    if t.mode == "block" and block == (128, 128):
        return "block_128x128", (-(-rows // 128), -(-cols // 128)), "float32"
    raise ValueError(f"fusedkit.dequantize: no kernel for scaling mode {t.mode!r} with block {t.block!r} "
                     f"(supported: per tensor, MXFP8 blocks of 32 along rows or (32, 1) down columns, 1 x 128 "
                     f"and 128 x 128 blocks)")
