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

from fusedkit.bench import GpuTimer, _gemm_impls, run_meta

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336)]


def main(out_path):
    timer = GpuTimer(torch)
    rounds = int(os.environ.get("GEMM_ROUNDS", "6"))
    rows = []
    ops = {}
    for (M, K, N) in SHAPES:  # the benchmark's own operands and calls (fusedkit.bench._gemm_impls)
        ops[(M, K, N)] = _gemm_impls(torch, M, K, N)["fp8_gemm"]
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
    json.dump({**run_meta(torch.cuda.get_device_name()), "rows": rows}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemm_repeat.json")
