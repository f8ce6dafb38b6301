"""Sweep the activation kernels' vectors per thread (UNROLL in cuda/activations.cu) on the GPU.

For gelu (tanh) and swiglu forward and swiglu backward at the benchmark shapes (bf16), times every
UNROLL of fusedkit.backends.cuda_activations.UNROLLS against a device copy in the same run; prints
ms, GB/s, fraction of copy and the best UNROLL per row, and writes JSON to argv[1]. The winners go into
cuda_activations.UNROLL_TABLE.
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_activations as ca
from fusedkit.bench import GpuTimer, copy_gbps, run_meta

WORK = [("gelu_fwd", 32768, 4096), ("gelu_fwd", 16384, 14336), ("swiglu_fwd", 32768, 14336),
        ("swiglu_bwd", 16384, 14336)]


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    rows = []
    for op, M, H in WORK:
        gated = op.startswith("swiglu")
        x = torch.randn(M, 2 * H if gated else H, device="cuda").bfloat16()
        dy = torch.randn(M, H, device="cuda").bfloat16()
        if op == "gelu_fwd":
            fn, nbytes = (lambda: fk.gelu(x, approximate="tanh")), 4 * M * H
        elif op == "swiglu_fwd":
            fn, nbytes = (lambda: fk.swiglu(x)), 6 * M * H
        else:
            fn, nbytes = (lambda: fk.swiglu_backward(dy, x)), 10 * M * H
        best = None
        for u in ca.UNROLLS:
            ca.UNROLL = u
            ms = timer.ms(fn)
            gbps = nbytes / ms / 1e6
            rows.append({"op": op, "shape": [M, H], "unroll": u, "ms": ms, "GBps": gbps, "of_copy": gbps / copy})
            print(f"{op:11s} {M:6d}x{H:<6d} unroll={u}  {ms:.4f} ms  {gbps:6.0f} GB/s  {gbps / copy:.3f}", flush=True)
            if best is None or ms < best[1]:
                best = (u, ms)
        print(f"BEST {op} {M}x{H}: unroll={best[0]} ({nbytes / best[1] / 1e6 / copy:.3f} of copy)", flush=True)
        del x, dy
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({**run_meta(torch.cuda.get_device_name()), "copy_GBps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_activations.json")
