"""NVRTC through ctypes: the one compiler behind both the run-time JIT and the CPU-only compile check.

Using NVRTC directly (instead of CuPy's RawModule compile) lets fusedkit hand every header to NVRTC
from memory, so the cache key covers the whole ``cuda/`` tree, and lets a machine without a GPU or a
driver compile every kernel (CuPy's compile path needs a driver).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass

_lib = None


class NVRTCError(RuntimeError):
    pass


def _candidates():
    env = os.environ.get("FUSEDKIT_NVRTC")
    if env:
        yield env
    # pip wheels: nvidia-cuda-nvrtc (cu13 / cu12 layouts)
    for p in sys.path:
        for pat in ("nvidia/cu13/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*",
                    "nvidia/cu12/lib/libnvrtc.so.*"):
            for f in sorted(glob.glob(os.path.join(p, pat))):
                if "builtins" not in f and "alt" not in f:
                    yield f
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            for f in sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*"))):
                if "builtins" not in f and "alt" not in f:
                    yield f
    yield "libnvrtc.so.13"
    yield "libnvrtc.so.12"
    yield "libnvrtc.so"


def _preload_builtins(path: str) -> None:
    """libnvrtc opens its builtins library by name at the first compile: one found beside a libnvrtc
    given by path (FUSEDKIT_NVRTC, a wheel) is loaded first, so that name resolves without
    LD_LIBRARY_PATH (an older NVRTC wheel unpacked with ``pip install --target`` works as it is)."""
    folder = os.path.dirname(path)
    if not folder:
        return
    for f in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
        if ".alt." not in f:
            try:
                ctypes.CDLL(f, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass  # the compile reports a builtins library it cannot open


def lib():
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for cand in _candidates():
        try:
            _preload_builtins(cand)
            L = ctypes.CDLL(cand)
            L.nvrtcGetErrorString.restype = ctypes.c_char_p
            _lib = L
            return L
        except OSError as e:
            errors.append(f"{cand}: {e}")
    raise NVRTCError(
        "fusedkit could not find libnvrtc. Install it with `pip install nvidia-cuda-nvrtc` "
        "(or a CUDA toolkit), or point FUSEDKIT_NVRTC at libnvrtc.so. Tried:\n  " + "\n  ".join(errors[-6:]))


def version() -> tuple[int, int]:
    a, b = ctypes.c_int(), ctypes.c_int()
    lib().nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    return a.value, b.value


@dataclass
class CompileResult:
    cubin: bytes
    lowered: dict[str, str]
    log: str


def _check(rc, what, prog=None):
    if rc != 0:
        msg = lib().nvrtcGetErrorString(rc).decode()
        log = _log(prog) if prog is not None else ""
        raise NVRTCError(f"NVRTC {what} failed: {msg}\n{log}")


def _log(prog) -> str:
    n = ctypes.c_size_t()
    lib().nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib().nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def compile_program(source: str, name: str, headers: dict[str, str], name_expressions: list[str],
                    options: list[str]) -> CompileResult:
    """Compile ``source`` to a cubin; headers are given in memory as {include name: text}."""
    L = lib()
    prog = ctypes.c_void_p()
    hnames = list(headers)
    H = (ctypes.c_char_p * len(hnames))(*[headers[h].encode() for h in hnames])
    I = (ctypes.c_char_p * len(hnames))(*[h.encode() for h in hnames])
    _check(L.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(hnames), H, I),
           "create")
    try:
        for e in name_expressions:
            _check(L.nvrtcAddNameExpression(prog, e.encode()), f"add name {e}")
        O = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = L.nvrtcCompileProgram(prog, len(options), O)
        if rc != 0:
            raise NVRTCError(f"NVRTC could not compile {name} with {' '.join(options)}:\n{_log(prog)}")
        log = _log(prog)
        lowered = {}
        for e in name_expressions:
            p = ctypes.c_char_p()
            _check(L.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(p)), f"lowered name {e}", prog)
            lowered[e] = p.value.decode()
        n = ctypes.c_size_t()
        _check(L.nvrtcGetCUBINSize(prog, ctypes.byref(n)), "cubin size", prog)
        buf = ctypes.create_string_buffer(n.value)
        _check(L.nvrtcGetCUBIN(prog, buf), "cubin", prog)
        return CompileResult(buf.raw, lowered, log)
    finally:
        L.nvrtcDestroyProgram(ctypes.byref(prog))
