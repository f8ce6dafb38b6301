"""Diagnosis of the two-CTA backward (norm_bwd_staged_pair) against the staged one at one shape:
the plan's resident clusters and grid, then the time with the launch capped at several cluster
counts. Usage: python tools/diag_pair.py [N] [--once] (--once: one call of each, for ncu)."""
import sys

import cupy
import numpy as np

from fusedkit.backends import cuda_norms as cn

N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 16384
ONCE = "--once" in sys.argv
M = 2**27 // N
rng = np.random.default_rng(0)
x = cupy.asarray(rng.standard_normal((M, N)), dtype=cupy.float32).astype(cupy.float16)
dy = cupy.asarray(rng.standard_normal((M, N)), dtype=cupy.float32).astype(cupy.float16)
w = cupy.ones(N, cupy.float16)
dx = cupy.empty_like(x)
mean = cupy.zeros(M, cupy.float32)
rstd = cupy.ones(M, cupy.float32)
dw = cupy.empty(N, cupy.float16)
db = cupy.empty(N, cupy.float16)
stream = cupy.cuda.get_current_stream()
keep = []


def alloc(n):
    a = cupy.empty(n, cupy.float32)
    keep.append(a)
    return a, a.data.ptr


def run(cfg, rms):
    cn.backward(dy.data.ptr, x.data.ptr, w.data.ptr, mean.data.ptr, rstd.data.ptr, dx.data.ptr, dw.data.ptr,
                0 if rms else db.data.ptr, M, N, "float16", "float16", 0, rms, 0, stream, alloc, config=cfg)


def ms(cfg, rms, reps=20):
    run(cfg, rms)
    if ONCE:
        return float("nan")
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record()
    for _ in range(reps):
        run(cfg, rms)
    b.record()
    b.synchronize()
    keep.clear()
    return cupy.cuda.get_elapsed_time(a, b) / reps


src = cupy.empty(2**28, cupy.uint8)
dst = cupy.empty_like(src)
e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
dst[...] = src
e0.record()
for _ in range(20):
    dst[...] = src
e1.record()
e1.synchronize()
copy = 2 * src.nbytes * 20 / cupy.cuda.get_elapsed_time(e0, e1) / 1e6
print(f"copy {copy:.0f} GB/s  M={M} N={N}")
for rms in (False, True):
    staged = cn.bwd_config(N, 2, rms, staged=True)
    t = ms(staged, rms)
    print(f"{'rms' if rms else 'ln '} staged {staged} {t:.4f} ms {6 * M * N / t / 1e6 / copy:.3f} of copy")
    for pipe in (False, True):
        cfg = cn.pair_from_half(N, 2, rms, pipe)
        plan = cn._bwd_plan(N, "float16", "float16", rms, 0, cfg, 16, True)
        nb, P = plan.grid(M)
        fit0 = plan.fit
        for fit in (fit0, 64, 128, 132, 264):
            plan.fit = fit
            t = ms(cfg, rms)
            print(f"{'rms' if rms else 'ln '} {cfg} resident-fit {fit0} (using {fit}) grid {plan.grid(M)} "
                  f"block {plan.block} smem {plan.smem}: {t:.4f} ms {6 * M * N / t / 1e6 / copy:.3f} of copy",
                  flush=True)
        plan.fit = fit0
