"""Environment switches, read once at import (documented in docs/getting_started.rst).

FUSEDKIT_DEBUG      0 (default) silent; 1 print the chosen launch config of each new kernel;
                    2 also name expression, options and compile time; 3 also the full source.
FUSEDKIT_CACHE_DIR  where compiled kernels (cubin + lowered names) are cached on disk;
                    default ``$XDG_CACHE_HOME/fusedkit`` or ``~/.cache/fusedkit``.
FUSEDKIT_NVRTC      path of libnvrtc to use instead of the automatic search (the libnvrtc-builtins
                    beside it is loaded too).
FUSEDKIT_NVRTC_OPTIONS  extra NVRTC options (experiments, e.g. -DFK_STREAM_LOADS=0); in the cache key.
FUSEDKIT_COMPILE_TARGETS  comma-separated targets of the compile-all check (default sm_80,sm_90a,sm_100a).
FUSEDKIT_STAGED     1 (default) lets memory-bound kernels on sm_90+ stage rows through shared memory
                    with bulk copies; 0 forces the register-only kernels (comparison, debugging).
FUSEDKIT_PDL        1 (default) launches the second and later kernels of a multi-kernel call on sm_90+
                    as programmatic dependents of the one before (fusedkit/_launch.py); 0 plain launches.
"""
import os
import sys

DEBUG = int(os.environ.get("FUSEDKIT_DEBUG", "0") or 0)
STAGED = os.environ.get("FUSEDKIT_STAGED", "1") != "0"
PDL = os.environ.get("FUSEDKIT_PDL", "1") != "0"  # read at each dependent launch: A/B tools flip it


def cache_dir() -> str:
    d = os.environ.get("FUSEDKIT_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "fusedkit")
    return d


def debug(level: int, msg: str) -> None:
    if DEBUG >= level:
        print(f"[fusedkit] {msg}", file=sys.stderr, flush=True)
