"""Fill the kernel cache with FP8 GEMM instantiations before a timed or tested run, in parallel.

    FUSEDKIT_NVRTC_OPTIONS="-DX=1" PYTHONPATH=. python3 tools/precompile_gemm.py [--no-sk] "128, 2," "E4M3, fk::E4M3"

Each argument is a substring; an instantiation is compiled when it contains all of them (none: every
registered one). --no-sk leaves out the stream-K instantiations (the tile table does not pick them, so
an A/B of the table's kernels does not need them). The cache key covers FUSEDKIT_NVRTC_OPTIONS, so each
experiment needs its own call.
"""
import sys

from fusedkit.backends import cuda_gemm
from fusedkit.bench import precompile

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-sk"]
    skip = set(cuda_gemm.sk_expressions()) if "--no-sk" in sys.argv[1:] else set()
    exprs = [e for e in cuda_gemm.all_expressions()[cuda_gemm.FILE] if e not in skip and all(s in e for s in args)]
    print(f"precompiling {len(exprs)} GEMM instantiations", flush=True)
    precompile(cuda_gemm.FILE, exprs)
