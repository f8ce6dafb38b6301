"""Where the persistent staged kernels lose time: their time against the rows each cluster walks.

    PYTHONPATH=. python3 tools/probe_staged_rows.py out.json

For the softmax forward at N = 262144 and the fused cross-entropy (loss + gradient) at 131072 and 262144
(bf16, the shipped configs): the resident clusters G of the persistent grid (the plan's cap), then the
time at M = G, 2G, 4G, 8G, 16G rows and at the benchmark's M (2^27 / N for softmax, 2^30 / N for
cross-entropy), each against a copy of the same bytes timed beside it. A least-squares line through the
multiples of G gives the time per row step (each cluster one row) and the fixed part (launch, the first
row's fill, the last row's drain); a benchmark M that is not a multiple of G shows its tail as the
excess over that line at ceil(M / G) steps. Writes JSON to argv[1].

PROBE_FWD_CONFIGS="8,4,16,16,2;8,8,8,16,2" adds the softmax forward at 262144 with those staged configs
(vec, items, warps, C[, ring depth]) forced, e.g. to see whether a ring's gain is in the step or in the
fixed part.
"""
import json
import math
import os
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_cross_entropy as cce
from fusedkit.backends import cuda_softmax as csm
from fusedkit.bench import GpuTimer, run_meta


def cap_of(plans) -> int:
    """The grid cap of the persistent plans (LaunchPlan.cap)."""
    caps = [p.cap for p in plans.values() if p.cap]
    return max(caps) if caps else 0


def case(timer, label, N, bench_M, make, plans, bytes_per_elem):
    plans.clear()
    make(1)()  # builds the plan
    G = cap_of(plans)
    rows = []
    for M in sorted({G * k for k in (1, 2, 4, 8, 16)} | {bench_M}):
        fn = make(M)
        nbytes = bytes_per_elem * M * N
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        t_copy = timer.ms(lambda: dst.copy_(src), rep=20)
        t = timer.ms(fn, rep=20)
        del src, dst
        rows.append({"M": M, "steps": math.ceil(M / G), "ms": t, "copy_ms": t_copy, "frac": t_copy / t})
        print(f"{label:34s} G={G:3d} M={M:6d} steps={math.ceil(M / G):4d} {t * 1e3:9.1f} us  copy "
              f"{t_copy * 1e3:9.1f} us  frac {t_copy / t:.3f}", flush=True)
        del fn
        torch.cuda.empty_cache()
    fit = [r for r in rows if r["M"] % G == 0]
    n = len(fit)
    sx = sum(r["steps"] for r in fit)
    sy = sum(r["ms"] for r in fit)
    sxx = sum(r["steps"] ** 2 for r in fit)
    sxy = sum(r["steps"] * r["ms"] for r in fit)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    print(f"{label:34s} per step {b * 1e3:.2f} us, fixed {a * 1e3:.2f} us", flush=True)
    return {"label": label, "N": N, "G": G, "rows": rows, "step_ms": b, "fixed_ms": a}


def main(out_path):
    timer = GpuTimer(torch)
    res = []

    def softmax_at(N, cfg=None):
        def make(M):
            x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)
            stream = torch.cuda.current_stream().cuda_stream
            return lambda: csm.forward(x.data_ptr(), 0, y.data_ptr(), M, N, "bfloat16", "bfloat16", 1.0, False,
                                       csm.MASK_NONE, csm.NO_MASK, 0, stream, config=cfg)
        return make

    def ce_at(N):
        def make(M):
            x = (torch.randn(M, N, device="cuda") * 2).to(torch.bfloat16)
            t = torch.randint(0, N, (M,), device="cuda")
            return lambda: fk.cross_entropy(x, t, return_grad=True)
        return make

    res.append(case(timer, "softmax fwd 262144", 262144, 2**27 // 262144, softmax_at(262144), csm._fwd_plans, 4))
    for spec in filter(None, os.environ.get("PROBE_FWD_CONFIGS", "").split(";")):
        cfg = ("staged",) + tuple(int(v) for v in spec.split(","))
        res.append(case(timer, f"softmax fwd 262144 {cfg}", 262144, 2**27 // 262144, softmax_at(262144, cfg),
                        csm._fwd_plans, 4))
    for N in (131072, 262144):
        res.append(case(timer, f"cross-entropy {N}", N, 2**30 // N, ce_at(N), cce._plans, 4))
    json.dump({**run_meta(torch.cuda.get_device_name()), "cases": res}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
