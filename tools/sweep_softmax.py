"""Sweep the softmax kernels' launch configs on the GPU (bf16, M x N = 2**27): register rows (warps x
vectors per thread), clusters (C CTAs x warps x vectors), the staged forward and backward (rows of
32768+) and the looped kernel, forward and backward.

    python3 tools/sweep_softmax.py out.json

SWEEP_DIRS=fwd or bwd limits it (masked: the masked forward, N = Sq, of the benchmark's mask);
SWEEP_NS=65536,262144 picks the rows; SWEEP_MIN_ITEMS=4 leaves out thin splits; SWEEP_STAGES=1,2,3 the
staged kinds' ring depths (default 1,2).

Prints every config's time, GB/s and fraction of copy, and the best per (direction, N); writes JSON to
argv[1]. Winners go into fusedkit/backends/cuda_softmax.py TUNED_FWD / TUNED_MASKED_FWD /
TUNED_STAGED_FWD / TUNED_STAGED_BWD / TUNED_BWD or its rule.
"""
import json
import os
import sys

import torch

from fusedkit.backends import cuda_softmax as cs
from fusedkit.bench import GpuTimer, copy_gbps, sweep_configs, run_meta


MIN_ITEMS = int(os.environ.get("SWEEP_MIN_ITEMS", "1"))  # e.g. 4: leave out the thin splits (slow everywhere)
STAGES = [int(s) for s in os.environ.get("SWEEP_STAGES", "1,2").split(",")]  # the staged kinds' ring depths


def candidates(N, direction):
    vec = 8
    nv = N // vec
    max_items = cs.MAX_ITEMS_FWD[2] if direction == "fwd" else cs.MAX_ITEMS_BWD
    out = []
    for c in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4, 8, 16, 32):
            for items in (1, 2, 4, 8):
                cap = c * 32 * warps * items
                if items > max_items or items < MIN_ITEMS or not cap >= nv > cap // 2:
                    continue
                if c > 1 and nv < 2048:      # clusters only for long rows
                    continue
                out.append(("rows", vec, items, warps) if c == 1 else ("cluster", vec, items, warps, c))
    if direction == "fwd" and N >= 32768:  # the persistent staged forward (chunk <= 200 KB of shared memory)
        for c in (1, 2, 4, 8, 16):
            for warps in (8, 16, 32):
                for items in (4, 8):
                    cap = c * 32 * warps * items
                    for stages in STAGES:
                        if items >= MIN_ITEMS and cap >= nv > cap // 2 and stages * -(-nv // c) * 16 <= 200 * 1024:
                            out.append(("staged", vec, items, warps, c) + ((stages,) if stages > 1 else ()))
    if direction == "bwd" and N >= 32768:  # the persistent staged backward (y and dy chunks <= 200 KB)
        for c in (2, 4, 8, 16):
            for warps in (16, 32):
                for items in (2, 4, 8):
                    cap = c * 32 * warps * items
                    if items == 8 and warps == 32:   # 8 vectors of y and dy: ~110 registers, 512 threads at most
                        continue
                    for stages in STAGES:
                        if items >= MIN_ITEMS and cap >= nv > cap // 2 and stages * 2 * -(-nv // c) * 16 <= 200 * 1024:
                            out.append(("staged", vec, items, warps, c) + ((stages,) if stages > 1 else ()))
    return out + [("looped", vec)]


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    stream = torch.cuda.current_stream().cuda_stream
    ns = [int(n) for n in os.environ.get("SWEEP_NS", "1024,4096,8192,16384,65536,262144").split(",")]
    results = []
    for N in ns:
        M = 2**27 // N
        x = (torch.randn(M, N, device="cuda") * 2).bfloat16()
        y = torch.empty_like(x)
        dy = torch.randn(M, N, device="cuda").bfloat16()
        dx = torch.empty_like(x)
        for direction in os.environ.get("SWEEP_DIRS", "fwd,bwd").split(","):
            if direction == "masked":  # the benchmark's masked forward: (B, 16, Sq, N) scores, (B, 1, Sq, N) mask
                B = M // (16 * N)
                hide = torch.rand(B, 1, N, N, device="cuda") < 0.2
                args = (1,) + cs.mask_layout((B, 16, N, N), tuple(hide.shape))

                def make(cfg, hide=hide, args=args):
                    return lambda: cs.forward(x.data_ptr(), hide.data_ptr(), y.data_ptr(), M, N, "bfloat16",
                                              "bfloat16", 1.0, False, cs.MASK_TENSOR, args, 0, stream, config=cfg)
                sweep_configs(timer, copy, f"masked N={N}", candidates(N, "fwd"), make,
                              4 * M * N + hide.numel(), results, direction=direction, N=N)
                continue
            if direction == "fwd":
                def make(cfg):
                    return lambda: cs.forward(x.data_ptr(), 0, y.data_ptr(), M, N, "bfloat16", "bfloat16", 1.0,
                                              False, cs.MASK_NONE, cs.NO_MASK, 0, stream, config=cfg)
            else:
                def make(cfg):
                    return lambda: cs.backward(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), M, N, "bfloat16", 1.0,
                                               False, 0, stream, config=cfg)
            sweep_configs(timer, copy, f"{direction} N={N}", candidates(N, direction), make,
                          (4 if direction == "fwd" else 6) * M * N, results, direction=direction, N=N)
        del x, y, dy, dx
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({**run_meta(torch.cuda.get_device_name()), "copy_GBps": copy, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_softmax.json")
