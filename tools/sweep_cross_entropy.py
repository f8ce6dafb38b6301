"""Sweep the fused cross-entropy's launch configs on the GPU (bf16 logits, loss + gradient, 4MN bytes):
register rows (warps x vectors per thread), clusters of C CTAs, the staged kernel (threads x cluster
size: the row chunk per CTA in shared memory), the persistent kernel (the register mapping, the next
row's chunk by bulk copy) and the looped kernel.

    python3 tools/sweep_cross_entropy.py out.json        (SWEEP_NS=32768,131072 limits it;
        SWEEP_KINDS=persistent,staged keeps those kinds; SWEEP_ELEMS=1073741824: the benchmark's size;
        SWEEP_STAGES=1,2,3: the persistent kernel's ring depths, default 1,2)
    SWEEP_POLICIES=0,1,2 python3 tools/sweep_cross_entropy.py out.json   (staged clusters under each
        cluster scheduling policy preference: 0 default, 1 spread, 2 load balancing)

Why: at 0.39-0.52 of copy (benchmark 025917Z) the shipped rule puts one row per SM (two 512-thread
CTAs of 64 registers), so its load, reduce and store phases run in series; smaller CTAs (more of them
resident, rows in different phases side by side) or more CTAs per cluster may overlap them. Prints each
config's time, GB/s and fraction of copy and the best per N; writes JSON to argv[1]. Winners go into
fusedkit/backends/cuda_cross_entropy.py TUNED (after tests/test_cross_entropy.py passes with them:
``config=`` is the same launch path the tests use).
"""
import json
import os
import sys

import torch

from fusedkit.backends import cuda_cross_entropy as cc
from fusedkit.bench import GpuTimer, copy_gbps, sweep_configs, run_meta

STAGES = [int(s) for s in os.environ.get("SWEEP_STAGES", "1,2").split(",")]


def candidates(N):
    vec = 8
    nv = N // vec
    out = []
    for c in (1, 2, 4, 8):
        for warps in (4, 8, 16, 32):
            for items in (1, 2, 4, 8):
                cap = c * 32 * warps * items
                data_regs = items * cc.regs_per_item(vec, 2)
                # 1024-thread CTAs have 64 registers: 32 of row data spill (NVRTC 13.5, sm_90a)
                if not cap >= nv > cap // 2 or data_regs > 32 or (warps == 32 and data_regs > 16):
                    continue
                out.append(("rows", vec, items, warps, c))
    for threads in (256, 512):
        for c in (1, 2, 4, 8, 16):
            for buffers in (1, 2):
                if buffers * -(-nv // c) * 16 <= 200 * 1024 and -(-nv // c) >= threads:
                    out.append(("staged", threads, c, buffers))
    for c in (1, 2, 4, 8, 16):  # persistent: 16-bit rows of <= 8 vectors a thread, ring <= 200 KB
        for warps in (16, 32):
            for items in (2, 4, 8):
                cap = c * 32 * warps * items
                for stages in STAGES:
                    if cap >= nv > cap // 2 and stages * -(-nv // c) * 16 <= 200 * 1024:
                        out.append(("persistent", vec, items, warps, c) + ((stages,) if stages > 1 else ()))
    kinds = os.environ.get("SWEEP_KINDS")
    out += [("looped", vec)]
    return [c for c in out if not kinds or c[0] in kinds.split(",")]


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    stream = torch.cuda.current_stream().cuda_stream
    ns = [int(n) for n in os.environ.get("SWEEP_NS", "32768,131072,262144").split(",")]
    results = []
    for N in ns:
        M = int(os.environ.get("SWEEP_ELEMS", 2**27)) // N
        x = (torch.randn(M, N, device="cuda") * 2).bfloat16()
        g = torch.empty_like(x)
        t = torch.randint(0, N, (M,), device="cuda")
        loss = torch.empty(M, device="cuda")
        def make(cfg):
            return lambda: cc.forward(x.data_ptr(), t.data_ptr(), False, g.data_ptr(), loss.data_ptr(), 0, 0, M,
                                      N, "bfloat16", -100, 0.0, 0.0, 1.0, 0, stream, config=cfg)
        policies = os.environ.get("SWEEP_POLICIES")
        if policies:  # the staged cluster configs under each cluster scheduling policy preference
            for pol in (int(p) for p in policies.split(",")):
                cc.STAGED_CLUSTER_POLICY = pol
                cands = [c for c in candidates(N) if c[0] == "staged" and c[2] > 1 and c[3] == 1 and c[1] == 256]
                sweep_configs(timer, copy, f"N={N} policy={pol}", cands, make, 4 * M * N, results, N=N, policy=pol)
            cc.STAGED_CLUSTER_POLICY = 0
        else:
            sweep_configs(timer, copy, f"N={N}", candidates(N), make, 4 * M * N, results, N=N)
        del x, g, t, loss
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({**run_meta(torch.cuda.get_device_name()), "copy_GBps": copy, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_cross_entropy.json")
