"""Kernel launches with pre-packed parameters: the per-call host cost of a fusedkit op.

CuPy's ``Function.__call__`` converts every argument on every call (8-10 us for a norm kernel, measured
on the H200 host; the whole op budget is 10 us). A ``Launcher`` is built once per launch plan: it
knows the parameter types, keeps one native buffer with a slot per parameter (C alignment, via
``struct``) and the array of slot addresses that ``cuLaunchKernel`` reads. A call packs the values
with one ``struct.pack_into`` and calls the driver directly. The driver copies the parameters at launch,
so the buffer may be reused at once; a lock keeps two Python threads from interleaving pack and launch.

Parameter codes: ``p`` pointer (int, 0 = null), ``q`` int64, ``i`` int32, ``f`` float32.
"""
from __future__ import annotations

import ctypes
import struct
import threading

_FMT = {"p": "Q", "q": "q", "i": "i", "f": "f"}
_bound = threading.local()  # devices whose primary context this thread has made current


class Launcher:
    __slots__ = ("_func", "_fmt", "_buf", "_params", "_params_addr", "_lock", "_launch", "_rt", "device")

    def __init__(self, function, codes: str, device: int):
        """``function``: a loaded ``cupy.cuda.function.Function`` (``RawKernel.kernel``)."""
        from cupy_backends.cuda.api import driver, runtime

        self._func = function.ptr
        self._fmt = struct.Struct("@" + "".join(_FMT[c] for c in codes))
        self._buf = ctypes.create_string_buffer(max(self._fmt.size, 1))
        base = ctypes.addressof(self._buf)
        offsets, off = [], 0
        for c in codes:  # slot offsets under C alignment, as struct lays them out
            size = struct.calcsize(_FMT[c])
            off = (off + size - 1) // size * size
            offsets.append(off)
            off += size
        self._params = (ctypes.c_void_p * max(len(codes), 1))(*[base + o for o in offsets])
        self._params_addr = ctypes.addressof(self._params)
        self._lock = threading.Lock()
        self._launch = driver.launchKernel
        self._rt = runtime
        self.device = device

    def __call__(self, grid, block: tuple, smem: int, stream: int, *values) -> None:
        """One launch: ``grid`` = blocks (int) or (x, y); ``block`` = (x, y); ``stream`` a raw pointer.

        The driver launches in the thread's current context, so the kernel's device must be current
        with its primary context bound: a thread that has not touched CUDA yet (torch's autograd
        workers, for one) gets it bound here once, and another current device is switched to the
        kernel's and back."""
        rt = self._rt
        cur = rt.getDevice()
        if cur != self.device:
            rt.setDevice(self.device)
            try:
                self._launch_now(grid, block, smem, stream, values)
            finally:
                rt.setDevice(cur)
            return
        bound = getattr(_bound, "devices", None)
        if bound is None:
            bound = _bound.devices = set()
        if cur not in bound:
            rt.setDevice(cur)  # binds the primary context of the current device to this thread
            bound.add(cur)
        self._launch_now(grid, block, smem, stream, values)

    def launch_current(self, grid, block: tuple, smem: int, stream: int, *values) -> None:
        """A launch for callers that know the kernel's device is current (fusedkit/_callcache.py):
        only binds the thread's context the first time."""
        bound = getattr(_bound, "devices", None)
        if bound is None or self.device not in bound:
            self(grid, block, smem, stream, *values)
            return
        self._launch_now(grid, block, smem, stream, values)

    def _launch_now(self, grid, block, smem, stream, values) -> None:
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        with self._lock:
            self._fmt.pack_into(self._buf, 0, *values)
            self._launch(self._func, gx, gy, 1, block[0], block[1], 1, smem, stream, self._params_addr, 0)


def stream_ptr(stream) -> int:
    """A raw stream pointer from a CuPy stream object (``.ptr``) or anything int-like (torch's and
    XLA's raw pointers)."""
    return stream.ptr if hasattr(stream, "ptr") else int(stream)
