"""Fill the kernel cache with FP8 GEMM instantiations before a timed or tested run, in parallel.

    FUSEDKIT_NVRTC_OPTIONS="-DX=1" PYTHONPATH=. python3 tools/precompile_gemm.py "128, 2," "E4M3, fk::E4M3"

Each argument is a substring; an instantiation is compiled when it contains all of them (none: every
registered one). The cache key covers FUSEDKIT_NVRTC_OPTIONS, so each experiment needs its own call.
"""
import sys

from fusedkit.backends import cuda_gemm
from fusedkit.bench import precompile

if __name__ == "__main__":
    exprs = [e for e in cuda_gemm.all_expressions()[cuda_gemm.FILE] if all(s in e for s in sys.argv[1:])]
    print(f"precompiling {len(exprs)} GEMM instantiations", flush=True)
    precompile(cuda_gemm.FILE, exprs)
