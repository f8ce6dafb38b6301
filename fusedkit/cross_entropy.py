"""Public fused cross-entropy: validation, then the CPU reference (host arrays) or the CUDA kernels
(CuPy arrays, CUDA torch tensors; cuda/cross_entropy.cu). See docs/cross_entropy.rst.

Layout: logits ``(..., V)`` with the class (vocab) dimension LAST, as an LM head produces it (torch's
``F.cross_entropy`` takes classes in dim 1), ``target`` of shape ``logits.shape[:-1]``.
"""
from __future__ import annotations

import math
import numbers

from . import _dtypes, _interop
from .reference import cross_entropy as _ref
from ._interop import JAX

REDUCTIONS = _ref.REDUCTIONS
_JAX_INPLACE = "fusedkit: JAX arrays are immutable; inplace_grad=True is not supported for JAX"
_INT_DTYPES = ("int32", "int64")


def _int_name(a) -> str:
    return str(a.dtype).replace("torch.", "")


def _validate(logits, target, reduction, label_smoothing, z_loss):
    """Checks shared by both backends; returns (logits dtype, N, M, target dtype name)."""
    if len(logits.shape) == 0:
        raise ValueError("fusedkit: logits must have at least one dimension (the class/vocab one, last)")
    N = logits.shape[-1]
    if N < 1 or N >= 2**31:
        raise ValueError(f"fusedkit: the vocab (last) dimension of logits must be in [1, 2**31), got shape "
                         f"{tuple(logits.shape)}")
    try:
        x_dt = _dtypes.canonical(logits.dtype)
    except TypeError:
        raise TypeError(f"fusedkit: logits must be float32, float16 or bfloat16, got {logits.dtype}") from None
    t_dt = _int_name(target)
    if t_dt not in _INT_DTYPES:
        raise TypeError(f"fusedkit: target must be int32 or int64 class indices, got {target.dtype}; "
                        f"cast it (e.g. target.astype('int64') / target.long())")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"fusedkit: target must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])} "
                         f"(one class index per token; classes are logits' LAST dim), got {tuple(target.shape)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"fusedkit: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"fusedkit: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (math.isfinite(float(z_loss)) and float(z_loss) >= 0.0):
        raise ValueError(f"fusedkit: z_loss must be a finite number >= 0, got {z_loss}")
    M = 1
    for s in logits.shape[:-1]:
        M *= s
    if M >= 2**31:
        raise ValueError(f"fusedkit: at most 2**31 - 1 tokens per call, got {M}")
    return x_dt, N, M, t_dt


def _host_inplace(fn, kind, logits, arrays, kwargs):
    """The CPU reference with the gradient written over the caller's logits (returned as is)."""
    if kind == "jax_cpu":
        raise TypeError(_JAX_INPLACE)
    conv = [None if a is None else _interop.to_numpy(a, kind) for a in arrays]
    out = fn(*conv, **kwargs)
    if isinstance(out, tuple):
        return tuple(_interop.from_numpy(o, kind) for o in out[:-1]) + (logits,)
    return logits


def cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0,
                  return_lse=False, return_grad=False, inplace_grad=False):
    """Cross-entropy of ``logits`` (..., V) against class indices ``target`` (...), in one fused pass.

    Per token ``loss = (1 - e) * (lse - logits[t]) + e * (lse - mean(logits)) + z_loss * lse**2`` with
    ``lse = logsumexp(logits)`` and ``e = label_smoothing`` (as ``torch.nn.functional.cross_entropy``
    defines label smoothing; ``z_loss`` is PaLM's auxiliary loss). Tokens whose target equals
    ``ignore_index`` contribute nothing (loss 0, gradient row 0, lse 0).

    Args:
        logits: float32, float16 or bfloat16, shape ``(..., V)``; the class (vocab) dimension is the last.
        target: int32 or int64 class indices of shape ``logits.shape[:-1]``.
        ignore_index: target value of tokens to skip.
        label_smoothing: ``e`` in [0, 1].
        reduction: ``"mean"`` (over the non-ignored tokens; NaN when every token is ignored, as torch),
            ``"sum"``, or ``"none"`` (per-token losses of shape ``target.shape``).
        z_loss: weight of ``lse**2`` added to each token's loss (and to the gradient).
        return_lse: also return ``lse`` (float32, shape ``target.shape``; 0 for ignored tokens), e.g. to
            call :func:`cross_entropy_backward` later or to log the z-loss.
        return_grad: also return the gradient of the (reduced) loss with respect to ``logits``, for an
            upstream gradient of 1 (for ``"none"``: of the sum of the per-token losses), in the logits'
            dtype, computed in the same pass as the loss (the logits are read once).
        inplace_grad: write that gradient over ``logits`` (which is then returned as the gradient):
            no second (tokens x V) buffer. Needs ``return_grad=True``.

    Returns:
        ``loss`` (float32: a 0-d array for ``"mean"``/``"sum"``, else shape ``target.shape``), or a tuple
        ``(loss, lse)``, ``(loss, grad)`` or ``(loss, lse, grad)`` as requested, in the caller's array type.

    Targets outside ``[0, V)`` (other than ``ignore_index``) raise ValueError on the CPU; on the GPU they
    are not checked (that would need a device sync): such a token gets a NaN loss, so a mean or sum turns
    NaN, and a zero gradient row; no memory outside the row is touched.
    """
    kind = _interop.call_kind(logits, (target,))
    _interop.check_same_framework(kind, (("target", target),))
    x_dt, N, M, t_dt = _validate(logits, target, reduction, label_smoothing, z_loss)
    if inplace_grad and not return_grad:
        raise ValueError("fusedkit: inplace_grad=True needs return_grad=True")
    kw = dict(ignore_index=int(ignore_index), label_smoothing=float(label_smoothing), reduction=reduction,
              z_loss=float(z_loss), return_lse=return_lse, return_grad=return_grad, inplace_grad=inplace_grad)
    if kind in _interop.HOST_KINDS:
        if inplace_grad:
            return _host_inplace(_ref.cross_entropy, kind, logits, (logits, target), kw)
        return _interop.run_on_host(_ref.cross_entropy, kind, (logits, target), kw)
    if kind == JAX:  # JAX GPU arrays and traced values: XLA buffer callbacks (fusedkit/jax/_prims.py)
        if inplace_grad:
            raise TypeError(_JAX_INPLACE)
        from .jax import _prims
        return _prims.cross_entropy(logits, target, int(ignore_index), float(label_smoothing), reduction,
                                    float(z_loss), bool(return_lse), bool(return_grad))

    X = _interop.view(logits, kind, "logits")
    TG = _interop.view(target, kind, "target")
    _interop.same_device([X, TG])
    tshape = tuple(X.shape[:-1])
    loss, lp = _interop.empty(kind, X, tshape if reduction == "none" else (), "float32")
    lse = lsp = None
    if return_lse:
        lse, lsp = _interop.empty(kind, X, tshape, "float32")
    grad = gp = None
    if return_grad:
        grad, gp = (logits, X.ptr) if inplace_grad else _interop.empty(kind, X, tuple(X.shape), x_dt)
    keep = gpu_forward(X.ptr, TG.ptr, t_dt == "int32", M, N, x_dt, ignore_index, label_smoothing, z_loss,
                       reduction, lp, lsp or 0, gp or 0, X.device, _interop.stream(kind, X.device),
                       lambda n, dtype: _interop.empty(kind, X, (n,), dtype))
    del keep  # queued on the stream: the allocators order any reuse after these launches
    out = (loss,) + ((lse,) if return_lse else ()) + ((grad,) if return_grad else ())
    return out[0] if len(out) == 1 else out


def scratch_sizes(M: int, reduction: str, backward: bool = False) -> tuple[int, int]:
    """(float32, int32) elements of scratch that gpu_forward (or gpu_backward) allocates at most for M
    tokens: the per-token losses of a reduced forward, the count of a mean, and two rounds of the
    reduction's block partials (fusedkit.jax sizes its callbacks' scratch outputs with this)."""
    from .backends import cuda_cross_entropy as ce
    P = max(1, -(-M // ce.REDUCE_CHUNK))
    parts = 2 * P if P > 1 else 0
    tok = 0 if backward or reduction == "none" else M
    return tok + parts, 1 + parts


def gpu_forward(xp, tp, t32, M, N, x_dt, ignore_index, label_smoothing, z_loss, reduction, lp, lsp, gp, device,
                stream, alloc):
    """The CUDA launches of cross_entropy on device pointers: the loss into lp (per token for "none",
    else reduced), lse into lsp and the gradient into gp where non-zero. ``alloc(n, dtype)`` ->
    (keep-alive, pointer) for scratch; returns the keep-alives."""
    from .backends import cuda_cross_entropy as ce
    keep, tok, cp = [], lp, 0
    if reduction != "none":
        tok = 0
        if M:
            o, tok = alloc(M, "float32")
            keep.append(o)
    if M and gp and reduction == "mean":
        o, cp = alloc(1, "int32")
        keep.append(o)
        keep += ce.reduce(0, tp, t32, M, ignore_index, 0, cp, False, device, stream, alloc)
    # each kernel after the first starts while the one before runs and waits for its output inside
    # (programmatic dependent launch, cuda/common/griddep.cuh); forward launches nothing for M == 0
    ce.forward(xp, tp, t32, gp, tok, lsp, cp, M, N, x_dt, ignore_index, label_smoothing, z_loss, 1.0, device,
               stream, dependent=bool(cp))
    if reduction != "none":
        keep += ce.reduce(tok, tp, t32, M, ignore_index, lp, 0, reduction == "mean", device, stream, alloc,
                          dependent=M > 0)
    return keep


def gpu_backward(glp, per_token, scale, xp, tp, t32, lsp, gp, M, N, x_dt, ignore_index, label_smoothing, z_loss,
                 reduction, device, stream, alloc):
    """The CUDA launches of cross_entropy_backward on device pointers (glp: the float32 grad_loss, or 0
    with the Python number ``scale``); returns the keep-alives of the scratch from ``alloc``."""
    from .backends import cuda_cross_entropy as ce
    keep, cp = [], 0
    if M == 0:
        return keep
    if reduction == "mean":
        o, cp = alloc(1, "int32")
        keep.append(o)
        keep += ce.reduce(0, tp, t32, M, ignore_index, 0, cp, False, device, stream, alloc)
    ce.backward(glp, per_token, xp, tp, t32, lsp, gp, cp, M, N, x_dt, ignore_index, label_smoothing, z_loss,
                scale, device, stream, dependent=bool(cp))
    return keep


def cross_entropy_backward(grad_loss, logits, target, lse, *, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", z_loss=0.0, inplace_grad=False):
    """Gradient of :func:`cross_entropy` with respect to ``logits`` from a saved ``lse`` (one read of the
    logits, one write of the gradient; no reduction over the vocab).

    Args:
        grad_loss: the upstream gradient of the loss: a Python number, or an array in the logits'
            framework (float32 on the GPU) with one element for ``"mean"``/``"sum"``, or of shape
            ``target.shape`` (or one element) for ``"none"``.
        logits, target: as given to the forward.
        lse: the forward's ``lse`` (``return_lse=True``): float32 of shape ``target.shape``.
        ignore_index, label_smoothing, reduction, z_loss: as given to the forward.
        inplace_grad: write the gradient over ``logits`` (returned as the gradient).

    Returns:
        The gradient, of the logits' shape and dtype.
    """
    gl_is_array = not isinstance(grad_loss, numbers.Number)
    kind = _interop.call_kind(logits, (target, lse, grad_loss if gl_is_array else None))
    _interop.check_same_framework(kind, (("target", target), ("lse", lse))
                                  + ((("grad_loss", grad_loss),) if gl_is_array else ()))
    x_dt, N, M, t_dt = _validate(logits, target, reduction, label_smoothing, z_loss)
    tshape = tuple(logits.shape[:-1])
    if tuple(lse.shape) != tshape or _dtypes.canonical_or_name(lse.dtype) != "float32":
        raise ValueError(f"fusedkit: `lse` must be float32 of shape {tshape} (the forward's return_lse "
                         f"output), got {tuple(lse.shape)} {lse.dtype}")
    per_token = False
    if gl_is_array:
        size = 1
        for s in grad_loss.shape:
            size *= s
        if reduction == "none" and tuple(grad_loss.shape) == tshape and size != 1:
            per_token = True
        elif size != 1:
            want = f"one element or shape {tshape}" if reduction == "none" else "one element"
            raise ValueError(f"fusedkit: `grad_loss` for reduction={reduction!r} must have {want}, got shape "
                             f"{tuple(grad_loss.shape)}")
    kw = dict(ignore_index=int(ignore_index), label_smoothing=float(label_smoothing), reduction=reduction,
              z_loss=float(z_loss), inplace_grad=inplace_grad)
    if kind in _interop.HOST_KINDS:
        gl = grad_loss if not gl_is_array else _interop.to_numpy(grad_loss, kind)

        def fn(x, t, s):
            return _ref.cross_entropy_backward(gl, x, t, s, **kw)
        if inplace_grad:
            return _host_inplace(fn, kind, logits, (logits, target, lse), {})
        return _interop.run_on_host(fn, kind, (logits, target, lse), {})
    if kind == JAX:
        if inplace_grad:
            raise TypeError(_JAX_INPLACE)
        if gl_is_array and _dtypes.canonical_or_name(grad_loss.dtype) != "float32":
            raise TypeError(f"fusedkit: an array `grad_loss` must be float32, got {grad_loss.dtype}")
        from .jax import _prims
        return _prims.cross_entropy_backward(grad_loss if gl_is_array else float(grad_loss), per_token, logits,
                                             target, lse, int(ignore_index), float(label_smoothing),
                                             reduction, float(z_loss))

    X = _interop.view(logits, kind, "logits")
    TG = _interop.view(target, kind, "target")
    LS = _interop.view(lse, kind, "lse")
    views = [X, TG, LS]
    glp, scale = 0, 1.0
    if gl_is_array:
        GL = _interop.view(grad_loss, kind, "grad_loss")
        if GL.dtype != "float32":
            raise TypeError(f"fusedkit: an array `grad_loss` must be float32 on the GPU, got {GL.dtype}")
        views.append(GL)
        glp = GL.ptr
    else:
        scale = float(grad_loss)
    _interop.same_device(views)
    grad, gp = (logits, X.ptr) if inplace_grad else _interop.empty(kind, X, tuple(X.shape), x_dt)
    keep = gpu_backward(glp, per_token, scale, X.ptr, TG.ptr, t_dt == "int32", LS.ptr, gp, M, N, x_dt, ignore_index,
                        label_smoothing, z_loss, reduction, X.device, _interop.stream(kind, X.device),
                        lambda n, dtype: _interop.empty(kind, X, (n,), dtype))
    del keep
    return grad
