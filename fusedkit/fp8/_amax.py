"""Where a per-tensor FP8 cast puts the amax of its input: a fresh zeroed fp32 element (the default), or
the caller's ``amax_out``, as Transformer Engine writes into the recipe's amax-history slot.

``amax_out`` is a 1-element float32 array of the input's framework (on its device), typically
``history[0, i:i+1]`` of the history that :func:`fusedkit.fp8.update_scales` rolls and zeroes each step.
The cast merges into it, ``amax_out = max(amax_out, amax(x))``, so several casts of one step (micro-
batches) accumulate, and no call zeroes anything (on the GPU: no memset per call). Delayed scaling only:
current scaling derives the scale from the amax of this input alone. The merge is the kernels' own
(atomicMax on the fp32 bit patterns, exact for values >= 0); the host path merges the same way.
"""
from __future__ import annotations

import numpy as np

from .. import _dtypes, _interop


def require_delayed(amax_out, scale, who: str) -> None:
    """ValueError for ``amax_out`` with current scaling (no ``scale``)."""
    if amax_out is not None and scale is None:
        raise ValueError(f"{who}: `amax_out` is for delayed scaling (pass `scale=`); current scaling takes the "
                         "scale from this tensor's own amax, returned as `.amax`")


def check(amax_out, kind: str, who: str) -> None:
    """A clear error unless ``amax_out`` is a writable 1-element float32 array of x's framework."""
    fw = _interop.framework(amax_out)
    if fw in _interop.JAX_KINDS:
        raise TypeError(f"{who}: `amax_out` cannot be a JAX array (JAX arrays are immutable); take `.amax` "
                        "of the result instead")
    if fw != kind:
        raise TypeError(f"{who}: `amax_out` must be an array of the input's framework and device ({kind}), "
                        f"got {fw}")
    n = int(np.prod(amax_out.shape)) if len(amax_out.shape) else 1
    if n != 1 or _dtypes.canonical_or_name(amax_out.dtype) != "float32":
        raise ValueError(f"{who}: `amax_out` must be a 1-element float32 array (e.g. history[0, i:i+1]), got "
                         f"shape {tuple(amax_out.shape)} {_dtypes.canonical_or_name(amax_out.dtype)}")


def device_target(amax_out, kind: str, like, who: str):
    """(obj, ptr) of the element the kernels merge the amax into (atomicMax): ``amax_out`` or a new
    zeroed one."""
    if amax_out is None:
        return _interop.full(kind, like, (1,), "float32", 0.0)
    check(amax_out, kind, who)
    A = _interop.view(amax_out, kind, "amax_out")
    _interop.same_device([like, A])
    return amax_out, A.ptr


def merge_host(amax_out, amax, kind: str, who: str):
    """The host path's merge of ``amax`` (an fp32 scalar) into ``amax_out``, in place -> amax_out."""
    check(amax_out, kind, who)
    a = amax_out.detach().numpy() if kind == "torch_cpu" else amax_out  # shares memory
    bits = np.asarray(a).reshape(-1).view(np.uint32)
    if not np.shares_memory(bits, a):
        raise TypeError(f"{who}: `amax_out` must be writable in place (a NumPy array or a CPU torch tensor)")
    bits[0] = max(bits[0], np.float32(amax).view(np.uint32))
    return amax_out
