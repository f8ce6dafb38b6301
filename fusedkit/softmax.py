"""Public softmax / log-softmax and their backwards: validation, then the CPU reference (host arrays) or
the CUDA kernels (cuda/softmax.cu; CuPy arrays and CUDA torch tensors).

The softmax runs over the last axis. ``axis`` is accepted for NumPy-style call sites but must name the
last axis (``-1`` or ``x.ndim - 1``) on every backend: the kernels read rows in place, and fusedkit never
copies behind your back. For another axis move it last yourself, e.g.
``fusedkit.softmax(x.movedim(a, -1).contiguous()).movedim(-1, a)`` (torch) or
``cupy.moveaxis(fusedkit.softmax(cupy.ascontiguousarray(cupy.moveaxis(x, a, -1))), -1, a)``.
"""
from __future__ import annotations

from . import _dtypes, _interop
from . import reference as _ref
from ._interop import JAX

_FLOATS = _dtypes.FLOAT_DTYPES
_MAX_N = 2**31 - 1


def _dt_name(a) -> str:
    return _dtypes.canonical_or_name(a.dtype).replace("torch.", "")


def _float_dtype(a, what: str) -> str:
    dt = _dt_name(a)
    if dt not in _FLOATS:
        raise TypeError(f"fusedkit: `{what}` must be float32, float16 or bfloat16, got {dt}")
    return dt


def _check_axis(axis, ndim: int) -> None:
    try:
        a = int(axis)
    except (TypeError, ValueError):
        raise TypeError(f"fusedkit: axis must be an int, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"fusedkit: axis {a} is out of range for an array of {ndim} dims")
    if a % ndim != ndim - 1:
        raise ValueError(f"fusedkit: softmax runs over the last axis only (axis=-1), got axis={a}; move the axis "
                         f"last first (x.movedim({a}, -1).contiguous() in torch, cupy.moveaxis + "
                         f"cupy.ascontiguousarray in CuPy) and move the result back")


def _check_mask(mask, x_shape, kind) -> None:
    if mask is None:
        return
    dt = _dt_name(mask)
    if dt != "bool":
        raise TypeError(f"fusedkit: `mask` must be a boolean array (True = masked out), got dtype {dt}; "
                        f"convert it with mask.astype(bool) / mask.bool()")
    ms = tuple(mask.shape)
    ok = len(ms) <= len(x_shape) and all(m in (1, n) for m, n in zip(ms[::-1], x_shape[::-1]))
    if not ok:
        raise ValueError(f"fusedkit: `mask` of shape {ms} does not broadcast to x's shape {tuple(x_shape)}; "
                         f"each mask dim must be 1 or equal x's dim (aligned from the right), e.g. "
                         f"(batch, 1, Sq, Sk) for x of shape (batch, heads, Sq, Sk)")


def _np_dt(o_dt):
    return _dtypes.numpy_dtype(o_dt)


def mask_launch_args(shape, mask_shape, causal: bool, mask_ptr: int):
    """(mask pointer, MASK_* bits, mask_args) of cuda_softmax.forward for x of ``shape`` and a mask of
    ``mask_shape`` (None: no mask tensor) at ``mask_ptr``, contiguous, broadcast by strides."""
    from .backends import cuda_softmax as cs
    mptr, args, masking = 0, cs.NO_MASK, cs.MASK_NONE
    if mask_shape is not None:
        mptr, masking = mask_ptr, cs.MASK_TENSOR
        args = (1,) + cs.mask_layout(tuple(shape), tuple(mask_shape))
    if causal:
        masking |= cs.MASK_CAUSAL
        args = (shape[-2],) + tuple(args[1:])
    return mptr, masking, args


def _forward(x, axis, scale, mask, causal, out_dtype, log):
    kind = _interop.call_kind(x, (mask,))
    _interop.check_same_framework(kind, (("mask", mask),))
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError("fusedkit: softmax needs an array of at least one dimension")
    _check_axis(axis, len(shape))
    x_dt = _float_dtype(x, "x")
    o_dt = x_dt if out_dtype is None else _dtypes.canonical(out_dtype)
    N = shape[-1]
    if N > _MAX_N:
        raise ValueError(f"fusedkit: rows of at most {_MAX_N} elements are supported, got {N}")
    if causal and len(shape) < 2:
        raise ValueError(f"fusedkit: causal=True needs x of at least two dims (..., Sq, Sk), got shape {shape}")
    _check_mask(mask, shape, kind)
    scale = float(scale)
    if kind in _interop.HOST_KINDS:
        if log:
            return _interop.run_on_host(lambda x_: _ref.log_softmax(x_, -1, scale=scale, out_dtype=_np_dt(o_dt)),
                                        kind, (x,), {})
        return _interop.run_on_host(
            lambda x_, m_: _ref.softmax(x_, -1, scale=scale, mask=m_, causal=causal, out_dtype=_np_dt(o_dt)),
            kind, (x, mask), {})
    if kind == JAX:  # JAX GPU arrays and traced values: XLA buffer callbacks (fusedkit/jax/_prims.py)
        from .jax import _prims
        return _prims.softmax_forward(x, mask, scale, causal, o_dt, log)
    from .backends import cuda_softmax as cs

    X = _interop.view(x, kind, "x")
    views = [X]
    MK = None
    if mask is not None:
        MK = _interop.view(mask, kind, "mask")
        views.append(MK)
    mptr, masking, args = mask_launch_args(shape, None if mask is None else mask.shape, causal,
                                           0 if MK is None else MK.ptr)
    _interop.same_device(views)
    y, yp = _interop.empty(kind, X, shape, o_dt)
    M = X.size // N if N else 0
    if M > 0:
        cs.forward(X.ptr, mptr, yp, M, N, x_dt, o_dt, scale, log, masking, args, X.device,
                   _interop.stream(kind, X.device))
    return y


def _backward(dy, y, scale, log):
    kind = _interop.call_kind(y, (dy,))
    _interop.check_same_framework(kind, (("dy", dy),))
    if len(y.shape) == 0:
        raise ValueError("fusedkit: softmax_backward needs arrays of at least one dimension")
    y_dt = _float_dtype(y, "y")
    dy_dt = _float_dtype(dy, "dy")
    if tuple(dy.shape) != tuple(y.shape) or dy_dt != y_dt:
        raise ValueError(f"fusedkit: `dy` must match y's shape {tuple(y.shape)} and dtype {y_dt} (y: the forward's "
                         f"output), got {tuple(dy.shape)} {dy_dt}")
    scale = float(scale)
    fn = _ref.log_softmax_backward if log else _ref.softmax_backward
    if kind in _interop.HOST_KINDS:
        return _interop.run_on_host(lambda d_, y_: fn(d_, y_, scale=scale), kind, (dy, y), {})
    if kind == JAX:
        from .jax import _prims
        return _prims.softmax_backward(dy, y, scale, log)
    from .backends import cuda_softmax as cs

    Y = _interop.view(y, kind, "y")
    DY = _interop.view(dy, kind, "dy")
    _interop.same_device([Y, DY])
    dx, dxp = _interop.empty(kind, Y, Y.shape, y_dt)
    N = Y.shape[-1]
    M = Y.size // N if N else 0
    if M > 0:
        cs.backward(DY.ptr, Y.ptr, dxp, M, N, y_dt, scale, log, Y.device, _interop.stream(kind, Y.device))
    return dx


# ----------------------------------------------------------------------------------------------------
# public API

def softmax(x, axis=-1, *, scale=1.0, mask=None, causal=False, out_dtype=None):
    """Softmax over the last axis of ``x * scale``: ``y = exp(v - max) / sum(exp(v - max))``.

    Args:
        x: float32, float16 or bfloat16 array of shape ``(..., N)``.
        axis: must name the last axis (``-1``); see the module notes for other axes.
        scale: multiplies x before the softmax (attention's ``1 / sqrt(head_dim)``).
        mask: optional boolean array, True = masked out, broadcastable to x's shape (each dim 1 or
            equal to x's, aligned from the right), e.g. ``(batch, 1, Sq, Sk)`` for scores of shape
            ``(batch, heads, Sq, Sk)``, ``(batch, 1, 1, Sk)`` for key padding, ``(Sq, 1)`` for whole rows.
            Broadcasting is done by strides; the mask is not expanded in memory.
        causal: mask out the upper triangle of the last two dims ``(Sq, Sk)``: row i sees columns
            ``j <= i + Sk - Sq`` (bottom-right aligned when Sq != Sk). Combines with ``mask``.
        out_dtype: dtype of y (default: x's).

    Returns y of x's shape. A row whose every element is masked gives zeros (never NaN); a NaN or +inf
    in a row makes that row NaN.
    """
    return _forward(x, axis, scale, mask, causal, out_dtype, log=False)


def log_softmax(x, axis=-1, *, scale=1.0, out_dtype=None):
    """Log-softmax over the last axis of ``x * scale``: ``y = v - max - log(sum(exp(v - max)))``.

    Same ``axis``, ``scale`` and ``out_dtype`` rules as :func:`softmax`. A row of -inf gives NaN (as in
    torch).
    """
    return _forward(x, axis, scale, None, False, out_dtype, log=True)


def softmax_backward(dy, y, *, scale=1.0):
    """Gradient of :func:`softmax` with respect to x: ``dx = scale * y * (dy - sum(dy * y))`` per row.

    ``y`` is the forward's output (masks need not be passed again: masked positions have y = 0, so
    dx = 0 there); ``dy`` has y's shape and dtype; dx comes back in that dtype.
    """
    return _backward(dy, y, scale, log=False)


def log_softmax_backward(dy, y, *, scale=1.0):
    """Gradient of :func:`log_softmax` with respect to x: ``dx = scale * (dy - exp(y) * sum(dy))`` per
    row, with ``y`` the forward's output."""
    return _backward(dy, y, scale, log=True)
