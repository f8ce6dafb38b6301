"""Kernel JIT: CUDA C++ templates in ``cuda/`` -> cubin (NVRTC) -> CuPy RawModule, cached on disk.

* A kernel is asked for by (file, name expression), e.g. ("norms.cu", "fk::norm_fwd<fk::bf16, ...>");
  each request compiles only that instantiation, once.
* The disk cache key hashes the whole ``cuda/`` tree (every header is handed to NVRTC from memory,
  so nothing reaches the compiler that the key does not cover), the fusedkit version, the NVRTC
  version, the options and the name expression.
* Loaded kernels are memoized per (device, file, name expression).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from functools import lru_cache

from . import _env, _nvrtc
from ._version import __version__

BASE_OPTIONS = ("-std=c++17", "-DFUSEDKIT=1")  # no fast-math: FP8 casts need exact subnormals


def cuda_dir() -> str:
    """The kernel sources: ``fusedkit/cuda`` inside a wheel, else the repository's top-level ``cuda/``."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "cuda"), os.path.join(os.path.dirname(here), "cuda")):
        if os.path.isfile(os.path.join(d, "norms.cu")):
            return d
    raise FileNotFoundError(f"fusedkit: kernel sources not found next to {here}; reinstall fusedkit")


@lru_cache(maxsize=None)
def sources() -> tuple[dict[str, str], str]:
    """({relative path: text} for every .cu/.cuh under cuda/, hash of the whole tree)."""
    root = cuda_dir()
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            if n.endswith((".cu", ".cuh")):
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, root).replace(os.sep, "/")
                with open(p, encoding="utf-8") as f:
                    files[rel] = f.read()
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return files, h.hexdigest()


def arch_for(cc: int) -> str:
    """NVRTC target for a compute capability given as 10*major+minor (90 -> sm_90a)."""
    if cc in (90, 100):
        return f"sm_{cc}a"
    return f"sm_{cc}"


def compile_options(arch: str, extra=()) -> list[str]:
    user = os.environ.get("FUSEDKIT_NVRTC_OPTIONS", "").split()  # experiments; part of the cache key
    return [*BASE_OPTIONS, f"--gpu-architecture={arch}", *user, *extra]


def compile_cubin(file: str, name_expressions: list[str], arch: str, extra=()) -> _nvrtc.CompileResult:
    """Compile name expressions of one .cu for one target (no GPU needed)."""
    files, tree_hash = sources()
    headers = {k: v for k, v in files.items() if k.endswith(".cuh")}
    src = f"// fusedkit {__version__} tree {tree_hash}\n" + files[file]
    return _nvrtc.compile_program(src, file, headers, name_expressions, compile_options(arch, extra))


def _cache_key(file: str, expr: str, arch: str) -> str:
    _, tree_hash = sources()
    h = hashlib.sha256()
    for part in (__version__, str(_nvrtc.version()), tree_hash, file, expr, " ".join(compile_options(arch))):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:40]


def cached_cubin(file: str, expr: str, arch: str) -> tuple[str, str]:
    """Path of the cubin holding ``expr`` and its lowered (mangled) name; compiles on a cache miss."""
    d = _env.cache_dir()
    key = _cache_key(file, expr, arch)
    cubin_path = os.path.join(d, key + ".cubin")
    meta_path = os.path.join(d, key + ".json")
    if os.path.exists(cubin_path) and os.path.exists(meta_path):
        with open(meta_path) as f:
            return cubin_path, json.load(f)["lowered"]
    t0 = time.perf_counter()
    res = compile_cubin(file, [expr], arch)
    dt = time.perf_counter() - t0
    _env.debug(2, f"compiled {expr} ({file}, {arch}) in {dt * 1e3:.0f} ms; options {compile_options(arch)}")
    if _env.DEBUG >= 3:
        _env.debug(3, sources()[0][file])
    os.makedirs(d, exist_ok=True)
    # atomic writes: another process may compile the same kernel at the same time
    for path, data, mode in ((cubin_path, res.cubin, "wb"),
                             (meta_path, json.dumps({"expr": expr, "lowered": res.lowered[expr],
                                                     "arch": arch, "compile_s": dt}), "w")):
        fd, tmp = tempfile.mkstemp(dir=d)
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    return cubin_path, res.lowered[expr]


_kernels: dict = {}
_arch_of_device: dict = {}


def device_arch(device: int) -> str:
    a = _arch_of_device.get(device)
    if a is None:
        import cupy
        cc = int(cupy.cuda.Device(device).compute_capability)
        if cc < 80:
            raise RuntimeError(f"fusedkit needs a GPU of compute capability 8.0 or newer; device {device} "
                               f"is {cc // 10}.{cc % 10}. Use NumPy arrays for the CPU backend.")
        a = _arch_of_device[device] = arch_for(cc)
    return a


def get_kernel(file: str, expr: str, device: int):
    """A CuPy RawKernel for ``expr`` on ``device`` (memoized)."""
    k = _kernels.get((device, file, expr))
    if k is not None:
        return k
    import cupy
    path, lowered = cached_cubin(file, expr, device_arch(device))
    with cupy.cuda.Device(device):
        mod = cupy.RawModule(path=path)
        k = mod.get_function(lowered)
        k.kernel  # load the module now; launches then call k.kernel (a cupy Function) directly
    _kernels[(device, file, expr)] = k
    _env.debug(1, f"kernel {expr}: {k.num_regs} registers, {k.shared_size_bytes} B static shared memory")
    return k


_plan_caches: list = []


def plan_cache() -> dict:
    """A module's dict of launch plans or launchers built from compiled kernels. clear_memory_cache()
    empties every such dict with the kernels, so nothing keeps a kernel of the previous options."""
    d: dict = {}
    _plan_caches.append(d)
    return d


def clear_memory_cache() -> None:
    """Forget the compiled kernels held in memory and every plan built from them (the disk cache stays:
    its key covers the NVRTC options). Tools call it between builds with different options."""
    _kernels.clear()
    for d in _plan_caches:
        d.clear()
