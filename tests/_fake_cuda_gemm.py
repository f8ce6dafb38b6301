"""CPU torch tensors posing as CUDA tensors for fusedkit.fp8_gemm's host path (no GPU needed).

Inside ``fake_cuda_gemm()`` a CPU torch tensor passes for a CUDA tensor on device 0, the kernel is a
stub, tensor maps are stand-ins derived from their pointer and geometry, and every launch's kernel
parameters are captured as bytes instead of launched. The host path (validation, planning, output
allocation, the call cache of fusedkit/_callcache.py) runs for real, so tests can compare the
parameters of the full path with those of the cached path, and tools/profile_gemm_host.py can time the
host path on any machine. Every patch is undone on exit.
"""
from __future__ import annotations

import contextlib
import ctypes
import struct
import types


@contextlib.contextmanager
def fake_cuda_gemm(sms=132):
    import cupy
    import torch
    from cupy_backends.cuda.api import driver

    from fusedkit import _callcache, _interop
    from fusedkit.backends import cuda_gemm

    launches = []   # (grid, smem, the _Params bytes) per launch
    real_view, real_framework = _interop.view, _interop.framework

    def framework(x):
        k = real_framework(x)
        return _interop.TORCH if k == "torch_cpu" else k

    def view(x, kind, what):
        v = real_view(x, kind, what)
        v.device = 0
        return v

    def launch_kernel(fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        base = ctypes.cast(args, ctypes.POINTER(ctypes.c_void_p))[0]
        launches.append((gx, smem, ctypes.string_at(base, ctypes.sizeof(cuda_gemm._Params))))

    def tensor_map(ptr, rows, cols, elem_bytes, box_cols, box_rows):
        return struct.pack("<6q", ptr, rows, cols, elem_bytes, box_cols, box_rows) + bytes(80)

    epochs = iter(range(1, 1 << 30))

    def sk_workspace(device, stream, grid, bn):   # stand-in pointers, a fresh epoch per launch
        return 0x5000, 0x6000, next(epochs)

    class Device:
        def __init__(self, device=None):
            self.id = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1), max_dynamic_shared_size_bytes=1 << 20)
    patches = [
        (_interop, "framework", framework), (_interop, "view", view),
        (_interop, "stream", lambda kind, device: 0),
        (cupy.cuda, "Device", Device),
        (cupy.cuda.runtime, "getDevice", lambda: 0),
        (cupy.cuda.runtime, "memsetAsync", lambda ptr, value, n, stream: ctypes.memset(ptr, value, n)),
        (driver, "launchKernel", launch_kernel),
        (cuda_gemm, "sm_count", lambda device: sms), (cuda_gemm, "supported", lambda device: True),
        (cuda_gemm, "_capturing", lambda stream: False),
        (cuda_gemm, "_kernel", lambda e, device, smem: kernel), (cuda_gemm, "_tensor_map", tensor_map),
        (cuda_gemm, "_sk_workspace", sk_workspace),
        (torch.Tensor, "is_cuda", property(lambda self: True)),
        (torch.Tensor, "get_device", lambda self: 0),
        (torch.cuda, "current_device", lambda: 0),
        (_callcache, "_raw_stream", lambda device: 0),
    ]
    saved = [(obj, name, obj.__dict__.get(name, _MISSING)) for obj, name, _ in patches]
    _callcache.clear()
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield launches
    finally:
        for obj, name, old in reversed(saved):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        _callcache.clear()


_MISSING = object()
