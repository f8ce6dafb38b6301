"""Run-to-run spread of the FP8 GEMM against cuBLASLt: the same shapes timed in alternating rounds in
one process (split accumulation, per-tensor scales), each timing stamped with the wall clock so it can
be lined up with a background ``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw -lms 100`` log.

    python3 tools/gemm_repeat.py out.json        (GEMM_ROUNDS=6)

Why: across four runs on 2026-12-03 our split GEMM at 4096^3 read 958-1169 TFLOP/s while cuBLASLt read
1327-1355. If the spread follows the SM clock (power), it is the kernel's energy per FLOP; if it shows
with a steady clock, it is the schedule (tile order, L2 hits).
"""
import json
import os
import sys
import time

import torch

import fusedkit as fk
from fusedkit.bench import GpuTimer

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336)]


def main(out_path):
    timer = GpuTimer(torch)
    rounds = int(os.environ.get("GEMM_ROUNDS", "6"))
    rows = []
    ops = {}
    for (M, K, N) in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        a, b = fk.quantize(x, fmt="e4m3"), fk.quantize(w, fmt="e4m3")
        e4m3 = torch.float8_e4m3fn
        a8, b8t = a.data.view(e4m3), b.data.view(e4m3).t()
        sa, sb = a.scale_inv.reshape(()), b.scale_inv.reshape(())
        ops[(M, K, N)] = {
            "fusedkit": (lambda a=a, b=b: fk.fp8_gemm(a, b, use_split_accumulator=True)),
            "cublaslt": (lambda a8=a8, b8t=b8t, sa=sa, sb=sb: torch._scaled_mm(
                a8, b8t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=False)),
        }
    for r in range(rounds):
        for shape, impls in ops.items():
            M, K, N = shape
            for name in (("fusedkit", "cublaslt") if r % 2 == 0 else ("cublaslt", "fusedkit")):
                t0 = time.time()
                ms = timer.ms(impls[name], rep=20, min_time_ms=80.0)
                tf = 2 * M * N * K / ms / 1e9
                rows.append({"round": r, "shape": list(shape), "impl": name, "ms": ms, "TFLOPs": tf,
                             "t_start": t0, "t_end": time.time()})
                print(f"round {r} {M}x{K}x{N} {name:9s} {tf:7.0f} TFLOP/s  t={t0:.2f}", flush=True)
    for shape in ops:
        for name in ("fusedkit", "cublaslt"):
            v = [x["TFLOPs"] for x in rows if tuple(x["shape"]) == shape and x["impl"] == name]
            print(f"SUMMARY {shape} {name:9s} min {min(v):7.0f} max {max(v):7.0f} TFLOP/s", flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemm_repeat.json")
