"""Host time per fusedkit.fp8_gemm call without a GPU: CPU torch tensors posing as CUDA tensors, the
launch a stub (tests/_fake_cuda_gemm.py). Times the full path (the call cache emptied before every
call) and the cached path of fusedkit/_callcache.py, at 256^3 as the benchmark's
fp8_gemm_host_overhead rows (plain bf16 output; bias + GeLU + E4M3 output with amax).

    PYTHONPATH=. python3 tools/profile_gemm_host.py [--profile]

What this leaves out is the CUDA side (the launch, the framework's allocator and memset on a real
device): the benchmark's rows on a GPU give the whole call.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch  # noqa: E402

import fusedkit as fk  # noqa: E402
from fusedkit import _callcache  # noqa: E402
from fusedkit.fp8.tensor import FP8Tensor  # noqa: E402
from _fake_cuda_gemm import fake_cuda_gemm  # noqa: E402


def per_call_us(fn, n=5000, before=None):
    for _ in range(200):
        before and before()
        fn()
    t = time.perf_counter()
    for _ in range(n):
        before and before()
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(profile=False):
    M = N = K = 256
    a = FP8Tensor(torch.randint(0, 255, (M, K), dtype=torch.uint8), torch.full((1,), 0.01), "e4m3")
    b = FP8Tensor(torch.randint(0, 255, (N, K), dtype=torch.uint8), torch.full((1,), 0.02), "e4m3")
    bias = torch.randn(N, dtype=torch.bfloat16)
    out_scale = torch.full((1,), 0.5)
    cases = {"plain": lambda: fk.fp8_gemm(a, b),
             "epilogue": lambda: fk.fp8_gemm(a, b, bias=bias, activation="gelu", out_dtype="e4m3",
                                             out_scale=out_scale)}
    with fake_cuda_gemm():
        t_clear = per_call_us(_callcache.clear)
        for name, fn in cases.items():
            full = per_call_us(fn, before=_callcache.clear) - t_clear
            cached = per_call_us(fn)
            print(f"{name:9s} full path {full:6.1f} us   cached {cached:6.1f} us   (CPU torch, launch stubbed)")
        if profile:
            import cProfile
            import pstats
            cProfile.runctx("for _ in range(3000): fn()", globals(), {"fn": cases["epilogue"]}, "/tmp/gemm_host.prof")
            pstats.Stats("/tmp/gemm_host.prof").sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main("--profile" in sys.argv)
