"""Sweep the FP8 GEMM's tile table on the GPU: for each issue-5 shape, time fusedkit.fp8_gemm with every
(accumulation mode, BN, cluster, output store) variant the kernel is built for (cuda_gemm.VARIANTS), next to
cuBLASLt (torch._scaled_mm) in the same mode; bf16 output, as the benchmark.

    python3 tools/sweep_gemm.py out.json

FK_NO_CLUSTER=1 leaves out the two-CTA clusters; FK_STORES (default "staged,whole") names the output
stores timed beside "direct" ("none": direct only); FK_SCHEDS=dp,sk also times the stream-K tail of the
variants built with it (cuda_gemm.SK_VARIANTS), "sk" alone only those; "sk_notail" times their stream-K
kernel walking every tile data-parallel (what the tail gains apart from the kernel's own code). FK_SHAPES="8192x8192x8192,..."
(M x K x N) keeps those of the issue-5 shapes (default: all five).

Also times block scaling and the fused epilogue (bias + GeLU + E4M3 output + amax, split accumulation)
with direct and staged stores, against plain split cuBLASLt.

Prints TFLOP/s and the ratio to cuBLASLt per config and the best per (shape, mode); writes JSON to
argv[1]. Winners go into fusedkit/backends/cuda_gemm.py config().
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit import _registry
from fusedkit.backends import cuda_gemm
from fusedkit.bench import GEMM_WORK, GpuTimer, run_meta
from fusedkit.fp8 import BlockScaling


def main(out_path):
    timer = GpuTimer(torch)
    flops = _registry.OPS["fp8_gemm"].flops
    stores = os.environ.get("FK_STORES", "staged,whole").split(",")
    scheds = os.environ.get("FK_SCHEDS", "dp").split(",")

    def walks(mode, bn, cluster, store):
        return [w for w in scheds if w == "dp" or (mode, bn, cluster, store) in cuda_gemm.SK_VARIANTS]
    shapes = os.environ.get("FK_SHAPES")
    keep = {tuple(int(d) for d in s.split("x")) for s in shapes.split(",")} if shapes else set(GEMM_WORK)
    results = []
    for (M, K, N) in [s for s in GEMM_WORK if s in keep]:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        a, b = fk.quantize(x, fmt="e4m3"), fk.quantize(w, fmt="e4m3")
        e4m3 = torch.float8_e4m3fn
        a8, b8t = a.data.view(e4m3), b.data.view(e4m3).t()
        sa, sb = a.scale_inv.reshape(()), b.scale_inv.reshape(())
        for mode, split in (("fast", False), ("split", True)):
            lt = timer.ms(lambda: torch._scaled_mm(a8, b8t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                   use_fast_accum=not split))
            best = None
            for _, bn, cluster, store, walk in [v + (w,) for v in cuda_gemm.VARIANTS if v[0] == mode
                                                and (v[2] == 1 or not os.environ.get("FK_NO_CLUSTER"))
                                                and (v[3] == "direct" or v[3] in stores) for w in walks(*v)]:
                with cuda_gemm.forced_tiles(**{mode: (bn, cluster, store, walk)}):
                    ms = timer.ms(lambda: fk.fp8_gemm(a, b, use_split_accumulator=split))
                r = {"shape": [M, K, N], "mode": mode, "BN": bn, "cluster": cluster, "store": store, "sched": walk,
                     "ms": ms, "TFLOPs": flops(M, N, K) / ms / 1e9, "cublaslt_ms": lt, "vs_cublaslt": lt / ms}
                results.append(r)
                print(f"{M}x{K}x{N} {mode:5s} BN={bn} cluster={cluster} {store:6s} {walk}: {r['TFLOPs']:6.0f} "
                      f"TFLOP/s  {r['vs_cublaslt']:.3f}x cuBLASLt", flush=True)
                if best is None or ms < best["ms"]:
                    best = r
            print(f"BEST {M}x{K}x{N} {mode}: BN={best['BN']} cluster={best['cluster']} store={best['store']} "
                  f"sched={best['sched']} {best['vs_cublaslt']:.3f}x cuBLASLt", flush=True)
            if split:
                lt_split = lt
        # block scaling and the fused epilogue (bias + GeLU + E4M3 output + amax, split): direct against
        # staged stores, each against plain split cuBLASLt (per-tensor; torch has no block-scaled one)
        ab = fk.quantize(x, fmt="e4m3", recipe=BlockScaling())
        bb = fk.quantize(w, fmt="e4m3", recipe=BlockScaling(), weight=True)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        out_scale = torch.full((1,), 0.5, device="cuda")
        extra = (("block", lambda: fk.fp8_gemm(ab, bb)),
                 ("split_epilogue_e4m3", lambda: fk.fp8_gemm(a, b, bias=bias, activation="gelu", out_dtype="e4m3",
                                                             out_scale=out_scale, use_split_accumulator=True)))
        for label, fn in extra:
            mode = label.split("_")[0]
            for store in ["direct"] + [s for s in stores if s == "staged"]:
                for walk in walks(mode, 128, 1, store):
                    with cuda_gemm.forced_tiles(**{mode: (128, 1, store, walk)}):
                        ms = timer.ms(fn)
                    r = {"shape": [M, K, N], "mode": label, "BN": 128, "cluster": 1, "store": store, "sched": walk,
                         "ms": ms, "TFLOPs": flops(M, N, K) / ms / 1e9, "cublaslt_ms": lt_split,
                         "vs_cublaslt": lt_split / ms}
                    results.append(r)
                    print(f"{M}x{K}x{N} {label} {store:6s} {walk}: {r['TFLOPs']:6.0f} TFLOP/s  "
                          f"{r['vs_cublaslt']:.3f}x plain split cuBLASLt", flush=True)
        torch.cuda.empty_cache()
    json.dump({**run_meta(torch.cuda.get_device_name()), "rows": results}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_gemm.json")
