"""``python -m fusedkit {info,bench,compile-check}``."""
import sys


def info() -> int:
    import os
    import platform

    from . import _env, _jit, _nvrtc
    from ._version import __version__
    print(f"fusedkit {__version__}  python {platform.python_version()}  ({sys.executable})")
    print(f"kernel sources: {_jit.cuda_dir()}  tree {_jit.sources()[1][:12]}")
    cache = _env.cache_dir()
    n = len([f for f in os.listdir(cache) if f.endswith(".cubin")]) if os.path.isdir(cache) else 0
    print(f"cache: {cache}  ({n} kernels; set FUSEDKIT_CACHE_DIR to move it)   debug level {_env.DEBUG}")
    try:
        print("nvrtc: %d.%d" % _nvrtc.version())
    except Exception as e:  # noqa: BLE001
        print(f"nvrtc: not found ({str(e).splitlines()[0]})")
    for mod in ("numpy", "ml_dtypes", "numba", "cupy", "torch", "jax"):
        try:
            m = __import__(mod)
            print(f"{mod}: {getattr(m, '__version__', '?')}")
        except Exception:  # noqa: BLE001
            print(f"{mod}: not installed")
    try:
        import cupy
        for d in range(cupy.cuda.runtime.getDeviceCount()):
            p = cupy.cuda.runtime.getDeviceProperties(d)
            cc = int(cupy.cuda.Device(d).compute_capability)
            print(f"GPU {d}: {p['name'].decode()}  cc {cc // 10}.{cc % 10}  target {_jit.arch_for(cc)}  "
                  f"{p['multiProcessorCount']} SMs  {p['totalGlobalMem'] / 2**30:.0f} GiB")
        print("backends: cuda (CuPy, torch, JAX arrays), cpu (NumPy arrays)")
    except Exception:  # noqa: BLE001
        print("GPU: none visible -> backends: cpu (NumPy arrays; torch/JAX CPU arrays)")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd, rest = (argv[0], argv[1:]) if argv else ("info", [])
    if cmd == "info":
        return info()
    if cmd == "bench":
        from . import bench
        return bench.main(rest)
    if cmd == "compile-check":
        from . import compile_check
        return compile_check.main()
    print("usage: python -m fusedkit {info,bench,compile-check}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
