"""Kernel launches with pre-packed parameters: the per-call host cost of a fusedkit op.

CuPy's ``Function.__call__`` converts every argument on every call (8-10 us for a norm kernel, measured
on the H200 host; the whole op budget is 10 us). A ``Launcher`` is built once per launch plan: it
knows the parameter types, keeps one native buffer with a slot per parameter (C alignment, via
``struct``) and the array of slot addresses that ``cuLaunchKernel`` reads. A call packs the values
with one ``struct.pack_into`` and calls the driver directly. The driver copies the parameters at launch,
so the buffer may be reused at once; a lock keeps two Python threads from interleaving pack and launch.

Parameter codes: ``p`` pointer (int, 0 = null), ``q`` int64, ``i`` int32, ``f`` float32.

Thread-block clusters (sm_90+): ``Launcher(..., cluster=C)`` (or ``(cx, cy, cz)``) launches through
``cuLaunchKernelEx`` with a cluster-dimension launch attribute instead (one pre-built ``CUlaunchConfig``;
the grid must be a multiple of the cluster shape). Kernels compiled with ``__cluster_dims__`` need no
attribute and use the plain path.

Programmatic dependent launch (sm_90+): a call with ``dependent=True`` adds the programmatic-stream-
serialization attribute, so the kernel may start while the kernel before it on the stream runs (once
that one's CTAs called ``griddepcontrol.launch_dependents``). Only for kernels written for it
(cuda/common/griddep.cuh: ``griddep_wait()`` before reading what the kernel before wrote), and only
right after a fusedkit launch of a kernel that triggers; elsewhere, and before compute capability 9.0,
it is a plain launch. ``FUSEDKIT_PDL=0`` (or ``fusedkit._env.PDL = False``) turns it off, for A/B runs.
"""
from __future__ import annotations

import ctypes
import struct
import threading

from . import _env

_FMT = {"p": "Q", "q": "q", "i": "i", "f": "f"}
_bound = threading.local()  # devices whose primary context this thread has made current


class Launcher:
    __slots__ = ("_func", "_fmt", "_buf", "_params", "_params_addr", "_lock", "_launch", "_rt", "device",
                 "cluster", "_dims", "_policy", "_dependent")

    def __init__(self, function, codes: str, device: int, cluster=None, cluster_policy: int = 0):
        """``function``: a loaded ``cupy.cuda.function.Function`` (``RawKernel.kernel``); ``cluster``: None,
        or the cluster shape of a cluster launch (an int C for (C, 1, 1), or a 3-tuple);
        ``cluster_policy``: CUclusterSchedulingPolicy (0 default, 1 spread, 2 load balancing)."""
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
        dims = self._dims = _cluster_dims(cluster)
        self._policy = cluster_policy
        self.cluster = None if dims == (1, 1, 1) else ExLaunch(self._func, dims, cluster_policy)
        self._dependent = None  # the ExLaunch of dependent=True calls, built on the first (False: cc < 9.0)

    def __call__(self, grid, block: tuple, smem: int, stream: int, *values, dependent: bool = False) -> None:
        """One launch: ``grid`` = blocks (int) or (x, y); ``block`` = (x, y); ``stream`` a raw pointer;
        ``dependent``: a programmatic dependent launch (module docstring).

        The driver launches in the thread's current context, so the kernel's device must be current
        with its primary context bound: a thread that has not touched CUDA yet (torch's autograd
        workers, for one) gets it bound here once, and another current device is switched to the
        kernel's and back."""
        rt = self._rt
        cur = rt.getDevice()
        if cur != self.device:
            rt.setDevice(self.device)
            try:
                self._launch_now(grid, block, smem, stream, values, dependent)
            finally:
                rt.setDevice(cur)
            return
        bound = getattr(_bound, "devices", None)
        if bound is None:
            bound = _bound.devices = set()
        if cur not in bound:
            rt.setDevice(cur)  # binds the primary context of the current device to this thread
            bound.add(cur)
        self._launch_now(grid, block, smem, stream, values, dependent)

    def launch_current(self, grid, block: tuple, smem: int, stream: int, *values,
                       dependent: bool = False) -> None:
        """A launch for callers that know the kernel's device is current (fusedkit/_callcache.py):
        only binds the thread's context the first time."""
        bound = getattr(_bound, "devices", None)
        if bound is None or self.device not in bound:
            self(grid, block, smem, stream, *values, dependent=dependent)
            return
        self._launch_now(grid, block, smem, stream, values, dependent)

    def _launch_now(self, grid, block, smem, stream, values, dependent=False) -> None:
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        with self._lock:
            self._fmt.pack_into(self._buf, 0, *values)
            ex = self._dependent_launch() if dependent and _env.PDL else None
            ex = ex or self.cluster
            if ex is not None:
                ex.launch(gx, gy, block, smem, stream, self._params_addr)
                return
            self._launch(self._func, gx, gy, 1, block[0], block[1], 1, smem, stream, self._params_addr, 0)

    def _dependent_launch(self):
        if self._dependent is None:
            major = self._rt.getDeviceProperties(self.device)["major"]
            self._dependent = major >= 9 and ExLaunch(self._func, self._dims, self._policy, programmatic=True)
        return self._dependent


def stream_ptr(stream) -> int:
    """A raw stream pointer from a CuPy stream object (``.ptr``) or anything int-like (torch's and
    XLA's raw pointers)."""
    return stream.ptr if hasattr(stream, "ptr") else int(stream)


class _StreamHandle:
    """A raw stream pointer behind the CUDA stream protocol (``__cuda_stream__``, version 0)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def cupy_stream(ptr: int):
    """A CuPy stream object for a raw stream pointer that CuPy does not own (torch's current stream),
    for ``with`` blocks around CuPy allocations and math: ``Stream.from_external`` (CuPy 14+;
    ``ExternalStream`` is deprecated there and warns on every construction), else ``ExternalStream``."""
    import cupy
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(int(ptr)))
    return cupy.cuda.ExternalStream(int(ptr))


# ----------------------------------------------------------------------------------------------------
# Launches with attributes: cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION and the others
# below, through ctypes (CuPy does not wrap it). Layouts from cuda.h (CUDA 12/13): CUlaunchAttribute is
# 72 bytes (id, 4 bytes of padding, a 64-byte value union at offset 8); CUlaunchConfig is 56 bytes
# (hStream at 32, attrs at 40, numAttrs at 48). tests/test_cross_entropy.py checks these offsets.

_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5  # value: CUclusterSchedulingPolicy (an int)
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # value: an int, 1 = allowed
_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


class _CUlaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64), ("clusterDim", ctypes.c_uint * 3),
                ("policy", ctypes.c_int), ("allowed", ctypes.c_int)]


class _CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _CUlaunchAttributeValue)]


class _CUlaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_CUlaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _cluster_dims(cluster) -> tuple:
    if cluster is None:
        return (1, 1, 1)
    if isinstance(cluster, int):
        return (cluster, 1, 1)
    dims = tuple(int(c) for c in cluster) + (1,) * (3 - len(cluster))
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"fusedkit: cluster shape must be an int or up to three positive ints, got {cluster!r}")
    return dims


_cuda = None


def _libcuda():
    """The driver library (already loaded by CuPy on a GPU machine), with the prototypes used here."""
    global _cuda
    if _cuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_CUlaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p]
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                     ctypes.POINTER(_CUlaunchConfig)]
        lib.cuOccupancyMaxActiveClusters.restype = ctypes.c_int
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorName.restype = ctypes.c_int
        _cuda = lib
    return _cuda


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _libcuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"fusedkit: {what} failed: {(name.value or b'?').decode()} ({rc})")


class ExLaunch:
    """One kernel's launches through cuLaunchKernelEx: a CUlaunchConfig built once with its attributes (the
    cluster dimension; when ``policy`` is not 0, a cluster scheduling policy preference: 1 spread, 2 load
    balancing; with ``programmatic``, programmatic stream serialization, and then the cluster dimension
    only for a cluster of more than one CTA); a launch fills in grid, block, shared memory and stream.
    Clusters of more than 8 CTAs (non-portable) get CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    set on the function."""

    __slots__ = ("func", "dims", "_attr", "_cfg", "_cfg_ref", "_lib")

    def __init__(self, func: int, dims: tuple, policy: int = 0, programmatic: bool = False):
        self.func, self.dims = func, dims
        self._lib = _libcuda()
        if dims[0] * dims[1] * dims[2] > 8:
            from cupy_backends.cuda.api import driver
            driver.funcSetAttribute(func, _CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        # the cluster attribute: always, except on the dependent launches of kernels without clusters
        # (cuOccupancyMaxActiveClusters needs it even for clusters of one)
        clustered = dims != (1, 1, 1) or not programmatic
        wanted = [(_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, "clusterDim", dims)] if clustered else []
        if policy and clustered:
            wanted.append((_CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, "policy", int(policy)))
        if programmatic:
            wanted.append((_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, "allowed", 1))
        n = len(wanted)
        self._attr = (_CUlaunchAttribute * max(n, 1))()
        for a, (attr_id, field, value) in zip(self._attr, wanted):
            a.id = attr_id
            if field == "clusterDim":
                for k in range(3):
                    a.value.clusterDim[k] = value[k]
            else:
                setattr(a.value, field, value)
        self._cfg = _CUlaunchConfig()
        self._cfg.gridDimZ = self._cfg.blockDimZ = 1
        self._cfg.attrs = self._attr
        self._cfg.numAttrs = n
        self._cfg_ref = ctypes.byref(self._cfg)

    def _set(self, gx, gy, block, smem, stream):
        c = self._cfg
        c.gridDimX, c.gridDimY = gx, gy
        c.blockDimX, c.blockDimY = block[0], block[1]
        c.sharedMemBytes = smem
        c.hStream = stream or None

    def launch(self, gx, gy, block, smem, stream, params_addr) -> None:
        if gx % self.dims[0] or gy % self.dims[1]:
            raise ValueError(f"fusedkit: grid ({gx}, {gy}) is not a multiple of the cluster shape {self.dims}")
        self._set(gx, gy, block, smem, stream)
        _check(self._lib.cuLaunchKernelEx(self._cfg_ref, self.func, params_addr, None), "cuLaunchKernelEx")

    def max_active_clusters(self, block, smem: int = 0) -> int:
        """Clusters of this shape that can be resident at once on the current device (0: the kernel
        cannot launch with this cluster shape, block and shared memory)."""
        self._set(self.dims[0], self.dims[1], block, smem, 0)
        n = ctypes.c_int(0)
        _check(self._lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), self.func, self._cfg_ref),
               "cuOccupancyMaxActiveClusters")
        return n.value
