"""Arrays in, arrays out: which framework an input belongs to, raw device views, output allocation,
and the stream a kernel must launch on.

Rules (docs/interop.rst):
* NumPy arrays (and CPU torch tensors / CPU JAX arrays) run on the CPU backend; the result has the
  caller's type.
* CuPy arrays and CUDA torch tensors are read in place (no copy) and the kernels launch on the
  caller's current stream: CuPy's current stream, or ``torch.cuda.current_stream()``.
  No call synchronises the device.
* JAX arrays on a GPU go through ``fusedkit.jax`` (``buffer_callback`` on XLA's stream).
* Any other object with ``__dlpack__`` is imported with ``numpy.from_dlpack`` (host memory only;
  other GPU producers: convert to CuPy or torch first).
* Inputs must be C-contiguous: a strided view raises ValueError (call ``.contiguous()`` /
  ``cupy.ascontiguousarray``); fusedkit never copies behind your back.
* All inputs of one call must be on one device and of the same framework.
* CuPy has no bfloat16 dtype: bf16 data comes in as torch or JAX arrays (or NumPy with ml_dtypes).
"""
from __future__ import annotations

import math

import numpy as np

from . import _dtypes

HOST, CUPY, TORCH, JAX = "host", "cupy", "torch", "jax"

_kind_by_type: dict = {}


def framework(x) -> str:
    """'host' | 'cupy' | 'torch' | 'jax' for an input array."""
    t = type(x)
    k = _kind_by_type.get(t)
    if k is None:
        root = t.__module__.split(".")[0]
        if isinstance(x, np.ndarray):
            k = HOST
        elif root == "cupy":
            k = CUPY
        elif root == "torch":
            k = TORCH
        elif root in ("jax", "jaxlib"):
            k = JAX
        elif hasattr(x, "__dlpack__"):
            k = "dlpack"
        else:
            raise TypeError(f"fusedkit expects an array (NumPy, CuPy, torch, JAX or any __dlpack__ "
                            f"producer), got {t.__name__}")
        _kind_by_type[t] = k
    if k == TORCH and not x.is_cuda:
        return "torch_cpu"
    if k == JAX:
        return JAX if _jax_on_gpu(x) else "jax_cpu"
    return k


def _jax_on_gpu(x) -> bool:
    try:
        return next(iter(x.devices())).platform in ("gpu", "cuda", "rocm")
    except Exception:  # tracers inside jit: the JAX adapter decides
        return True


# Frameworks whose arrays run on the CPU backend, and the two JAX kinds (traced / GPU, and CPU).
HOST_KINDS = (HOST, "torch_cpu", "jax_cpu", "dlpack")
JAX_KINDS = (JAX, "jax_cpu")


def call_kind(x, others) -> str:
    """The framework that serves a call: x's, except that traced JAX values anywhere make it 'jax'
    (weights or masks closed over inside jax.jit are concrete arrays while x is a tracer)."""
    kind = framework(x)
    if kind in JAX_KINDS and any(a is not None and framework(a) == JAX for a in others):
        return JAX
    return kind


def plain_scalar(v):
    """A NumPy scalar (np.float32(30.0): it has a shape and a dtype, but is no array) as the Python number
    it holds, exactly; anything else unchanged. Scale arguments take floats or 1-element arrays."""
    return v.item() if isinstance(v, np.generic) else v


def check_same_framework(kind: str, named) -> None:
    """Raises TypeError when any (name, array) of a call is not of framework ``kind`` (JAX CPU and GPU
    arrays mix: a traced call may close over concrete CPU constants)."""
    for name, a in named:
        if a is None:
            continue
        k = framework(a)
        if k != kind and not (kind in JAX_KINDS and k in JAX_KINDS):
            raise TypeError(f"fusedkit: `{name}` is a {k} array but `x` is {kind}; "
                            f"pass all arrays of one call from one framework and device")


def run_on_host(fn, kind: str, arrays, kwargs):
    """``fn`` (a CPU reference) on host arrays of framework ``kind``; results in that framework."""
    conv = [None if a is None else to_numpy(a, kind) for a in arrays]
    out = fn(*conv, **kwargs)
    if isinstance(out, tuple):
        return tuple(from_numpy(o, kind) for o in out)
    return from_numpy(out, kind)


# ----------------------------------------------------------------------------------------------------
# host conversions (torch CPU tensors, JAX CPU arrays <-> NumPy)

def to_numpy(x, kind: str):
    if kind == HOST:
        return x
    if kind == "torch_cpu":
        import torch
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(_dtypes.numpy_dtype("bfloat16"))
        return x.detach().numpy()
    if kind == "jax_cpu":
        return np.asarray(x)
    if kind == "dlpack":
        return np.from_dlpack(x)
    raise AssertionError(kind)


def from_numpy(a, kind: str):
    if a is None or kind in (HOST, "dlpack"):
        return a
    if kind == "torch_cpu":
        import torch
        if a.dtype == _dtypes.numpy_dtype("bfloat16"):
            return torch.from_numpy(np.asarray(a, order="C").view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.asarray(a, order="C"))  # keeps 0-d results 0-d
    if kind == "jax_cpu":
        import jax.numpy as jnp
        return jnp.asarray(a)
    raise AssertionError(kind)


# ----------------------------------------------------------------------------------------------------
# device views

class DevArray:
    """A C-contiguous device buffer of a caller's array: raw pointer, shape, dtype name, device."""

    __slots__ = ("ptr", "shape", "dtype", "device", "obj")

    def __init__(self, ptr, shape, dtype, device, obj):
        self.ptr, self.shape, self.dtype, self.device, self.obj = ptr, shape, dtype, device, obj

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


_TORCH_NAME = {}


def _torch_dtype_name(dt) -> str:
    n = _TORCH_NAME.get(dt)
    if n is None:
        n = _TORCH_NAME[dt] = str(dt).replace("torch.", "")
    return n


def view(x, kind: str, what: str) -> DevArray:
    """A DevArray over ``x`` (no copy). Raises on non-contiguous input."""
    if kind == TORCH:
        if not x.is_contiguous():
            raise ValueError(f"fusedkit: `{what}` is not contiguous (strides {tuple(x.stride())}); "
                             f"call .contiguous() first")
        return DevArray(x.data_ptr(), tuple(x.shape), _torch_dtype_name(x.dtype), x.device.index, x)
    if kind == CUPY:
        if not x.flags.c_contiguous:
            raise ValueError(f"fusedkit: `{what}` is not C-contiguous (strides {x.strides}); "
                             f"call cupy.ascontiguousarray first")
        return DevArray(x.data.ptr, x.shape, _dtypes.canonical_or_name(x.dtype), x.data.device_id, x)
    raise AssertionError(kind)


def _on_device(device: int, make, *args):
    """CuPy allocation on ``device``; skips the device switch (about 1 us) when it is current."""
    import cupy
    if cupy.cuda.runtime.getDevice() == device:
        return make(*args)
    with cupy.cuda.Device(device):
        return make(*args)


def empty(kind: str, like: DevArray, shape, dtype: str):
    """A new uninitialised array of the caller's framework on ``like``'s device -> (obj, ptr)."""
    if kind == TORCH:
        import torch
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=like.obj.device)
        return t, t.data_ptr()
    if kind == CUPY:
        import cupy
        if dtype == "bfloat16":
            raise TypeError("CuPy has no bfloat16 dtype: pass torch or JAX arrays for bf16 output, "
                            "or choose out_dtype='float16' / 'float32'")
        a = _on_device(like.device, cupy.empty, shape, dtype)
        return a, a.data.ptr
    raise AssertionError(kind)


def full(kind: str, like: DevArray, shape, dtype: str, value: float):
    """A new array filled with ``value`` on the launch stream -> (obj, ptr). Zeros (the FP8 ops' amax
    buffers, scratch counters) are written by cudaMemsetAsync: about 1 us less GPU time per call than the
    framework's fill kernel (H200, tools/ab_amax_fill.py); other values by that fill kernel."""
    if value == 0.0:
        obj, ptr = empty(kind, like, shape, dtype)
        nbytes = math.prod(shape) * (_dtypes.ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize)
        if nbytes:
            import cupy
            _on_device(like.device, cupy.cuda.runtime.memsetAsync, ptr, 0, nbytes, stream(kind, like.device))
        return obj, ptr
    if kind == TORCH:
        import torch
        t = torch.full(shape, value, dtype=getattr(torch, dtype), device=like.obj.device)
        return t, t.data_ptr()
    if kind == CUPY:
        import cupy
        a = _on_device(like.device, cupy.full, shape, value, dtype)
        return a, a.data.ptr
    raise AssertionError(kind)


def _torch_raw_stream():
    """torch's current raw cudaStream_t for a device index, without building a Stream object (the
    accessor inductor's generated code uses); falls back to the public API."""
    import torch
    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fn is None:
        return lambda device: torch.cuda.current_stream(device).cuda_stream
    return fn


_raw_stream = None


def stream(kind: str, device: int) -> int:
    """The raw stream pointer to launch on: the caller framework's current stream on ``device``."""
    global _raw_stream
    if kind == TORCH:
        if _raw_stream is None:
            _raw_stream = _torch_raw_stream()
        return _raw_stream(device)
    import cupy
    return cupy.cuda.get_current_stream(device).ptr


def same_device(args: list[DevArray]) -> None:
    d = args[0].device
    for a in args[1:]:
        if a is not None and a.device != d:
            raise ValueError(f"fusedkit: inputs are on different devices ({d} and {a.device}); "
                             f"move them to one device first")
