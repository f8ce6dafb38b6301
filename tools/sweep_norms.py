"""Sweep the norm kernels' launch configs on the GPU: register kernels (warps per row x vectors per
thread) and staged kernels (the same x shared-memory ring depth x the occupancy asked of ptxas).

SWEEP_DIRS=bwd limits it to one direction; SWEEP_BWD_ROWS=0 leaves the register backward out (sm_90
runs the staged one). Every candidate is compiled first, in parallel (the kernel cache), and those
that spill are skipped. Prints, per (op, N), every config's time and GB/s and the best one, and writes JSON to argv[1].
The winners go into fusedkit/backends/cuda_norms.py TUNED / TUNED_STAGED (see docs/perf_notes.rst).
"""
import ast
import json
import os
import statistics
import sys

import torch

from fusedkit import _jit
from fusedkit._launch import cupy_stream
from fusedkit.backends import cuda_norms as cn
from fusedkit.bench import GpuTimer, copy_gbps, precompile as bench_precompile, run_meta

RING_BYTES = (16 << 10, 48 << 10)  # staged: ring bytes per block (deeper rings lost in sweep 1554Z)
BWD_ROWS = os.environ.get("SWEEP_BWD_ROWS", "1") == "1"
TUNED_ONLY = os.environ.get("SWEEP_TUNED_ONLY", "0") == "1"  # just the shipped config (A/B runs)
SWEEP_NS = tuple(int(n) for n in os.environ.get("SWEEP_NS", "1024,4096,8192,16384").split(","))
# 32 warps (1024-thread blocks, at most 64 registers: most LayerNorm backwards spill) and extra ring
# depths (e.g. "3": 192 KB at N = 16384) are opt-in
MAX_WARPS = int(os.environ.get("SWEEP_MAX_WARPS", "16"))
EXTRA_STAGES = tuple(int(s) for s in os.environ.get("SWEEP_STAGES", "").split(",") if s)
# SWEEP_PAIR=1: the backward candidates also include the two-CTA kernel (norm_bwd_staged_pair, each
# row split over a cluster of two CTAs), with every staged config of the half row (4+ warps), with and
# without PIPE; with SWEEP_TUNED_ONLY=1, the pairs made from the half row's shipped staged config.
PAIR = os.environ.get("SWEEP_PAIR", "0") == "1"
# SWEEP_CLUSTERS="1,2,4": the staged backward candidates at each cluster-merge size (the CTAs of a
# cluster add their dweight / dbias partial rows before writing one; with SWEEP_TUNED_ONLY=1, the
# shipped staged config at each size)
CLUSTERS = tuple(int(c) for c in os.environ.get("SWEEP_CLUSTERS", "1").split(",") if c)
# SWEEP_PAIR_MERGE="1,2": the pair candidates with 1 and 2 pairs per cluster adding their partial rows
# (with SWEEP_TUNED_ONLY=1: the shipped pair config at each)
PAIR_MERGES = tuple(int(c) for c in os.environ.get("SWEEP_PAIR_MERGE", "1").split(",") if c)
# SWEEP_PAIR_SPLIT="2,4": also rows in quarters over four CTAs (the quarter row's staged config), at each
# merge; SWEEP_EXTRA="16384:('staged', 8, 4, 16, 2, 0, 4);8192:('looped', 8)": explicit extra candidates
# per N (each sweeps in the directions whose kernels it names)
PAIR_SPLITS = tuple(int(c) for c in os.environ.get("SWEEP_PAIR_SPLIT", "2").split(",") if c)
EXTRA = [(int(n), ast.literal_eval(c))
         for n, c in (e.split(":", 1) for e in os.environ.get("SWEEP_EXTRA", "").split(";") if e)]
# SWEEP_PEERS=1: the benchmark's torch.compile and Liger forwards (and the public fusedkit call) timed
# beside the forward configs, in the same rounds. SWEEP_ROUNDS: the candidates (and peers) timed that
# many times, interleaved.
PEERS = os.environ.get("SWEEP_PEERS", "0") == "1"
ROUNDS = int(os.environ.get("SWEEP_ROUNDS", "1"))
OPS = tuple(os.environ.get("SWEEP_OPS", "ln,rms").split(","))  # SWEEP_OPS=rms: RMSNorm only


def min_blocks_choices(threads):
    """Occupancies asked of ptxas for the staged backward (0: the kernel's default, 2 or 1 block)."""
    return {128: (0, 4, 6), 256: (0, 3, 4), 512: (0, 2)}.get(threads, (0,))


def candidates(N, direction, rms):
    """Register kernels (warps x vectors per thread) and staged kernels (x ring depth x min blocks)."""
    extra = [tuple(c) for n, c in EXTRA if n == N]
    if TUNED_ONLY:
        if direction == "fwd":
            return [cn.fwd_config(N, 2, rms)] + extra
        pairs = [cn.pair_from_half(N, 2, rms, pipe) for pipe in (False, True)] if PAIR else []
        shipped = cn.bwd_config(N, 2, rms, staged=True)
        if shipped[0] == "staged":
            merged = [shipped[:6] + (c,) for c in CLUSTERS if c != shipped[6]]
        else:
            merged = [shipped[:7] + (m, shipped[8]) for m in PAIR_MERGES if shipped[0] == "pair" and m != shipped[7]]
        quarters = [cn.pair_from_half(N, 2, rms, False, m, 4) for m in PAIR_MERGES] if 4 in PAIR_SPLITS else []
        return [shipped] + merged + [p for p in pairs + quarters if p] + extra
    vec = cn.vec_width(N, 2)
    nv = N // vec
    out = []
    for warps in (1, 2, 4, 8, 16, 32):
        for items in (1, 2, 4, 8, 16):
            if not (32 * warps * items >= nv > 32 * warps * items // 2) or warps > MAX_WARPS:
                continue
            if direction == "fwd":
                out.append(("rows", vec, items, warps))
                threads = 32 * warps * cn.rows_per_block(warps)
                # occupancy hints (a hinted kernel is the general one, without FULL: cuda_norms.fwd_expr)
                for mb in sorted({t // threads for t in (1024, 1536, 2048)} - {0, 1}):
                    out.append(("rows", vec, items, warps, mb))
            elif items <= 4:
                if BWD_ROWS and warps <= 16:
                    out.append(("rows", vec, items, warps))
                group = cn.rows_per_block(warps) * N * 2 * 2
                threads = 32 * warps * cn.rows_per_block(warps)
                depths = {max(2, min(cn.MAX_STAGES, b // group)) for b in RING_BYTES} | set(EXTRA_STAGES)
                for st in sorted(depths):
                    for mb in min_blocks_choices(threads):
                        for c in CLUSTERS:
                            out.append(("staged", vec, items, warps, st, mb, c))
    if PAIR and direction == "bwd" and N % (2 * vec) == 0:
        for c in candidates_plain(N // 2, rms):
            for pipe in (0, 1):
                for m in PAIR_MERGES:
                    out.append(("pair",) + c[1:6] + (pipe, m, 2))
    # explicit extras of this direction's kinds (e.g. "8192:('looped', 8)": the two-pass forward, its
    # second pass from L2, against the register kernels)
    kinds = ("rows", "looped") if direction == "fwd" else ("rows", "staged", "pair", "looped")
    return out + [c for c in extra if c[0] in kinds]


def candidates_plain(N, rms):
    """The staged backward candidates of rows of N with one row per block (the pair's half rows)."""
    global PAIR
    saved, PAIR = PAIR, False
    try:
        return list(dict.fromkeys(c[:6] + (1,) for c in candidates(N, "bwd", rms) if c[0] == "staged" and c[3] >= 4))
    finally:
        PAIR = saved


def expr_of(cfg, direction, rms, N):
    """The kernel the library launches for cfg at rows of N (the forward's FULL flag depends on N)."""
    if direction == "fwd":
        return cn.fwd_expr(cfg, "bfloat16", "bfloat16", "bfloat16", rms, plain_w=True, N=N)
    return cn.bwd_expr(cfg, "bfloat16", "bfloat16", rms, plain_w=True)


def precompile(directions):
    """Fills the kernel cache for every candidate in parallel (fusedkit.bench.precompile)."""
    bench_precompile(cn.FILE, [expr_of(cfg, d, op == "rms", N) for N in SWEEP_NS for d in directions
                               for op in OPS for cfg in candidates(N, d, op == "rms")])


def sweep_case(cfg, direction, rms, N, M, x, dy, w, y, dx, mean, rstd, dw, db, stream):
    """(cfg, zero-argument launch, bytes moved, compiled kernel) of one candidate; raises on a kernel that
    spills (skipped)."""
    expr = expr_of(cfg, direction, rms, N)
    k = _jit.get_kernel(cn.FILE, expr, 0)
    if k.local_size_bytes:
        raise RuntimeError(f"spills ({k.local_size_bytes} B local), skipped")
    if direction == "fwd":
        def fn():
            cn.forward(x.data_ptr(), 0, w.data_ptr(), 0 if rms else w.data_ptr(), y.data_ptr(), 0,
                       0 if rms else mean.data_ptr(), rstd.data_ptr(), M, N, "bfloat16", "bfloat16", "bfloat16",
                       1e-5, 0, rms, 0, stream, config=cfg)
        return cfg, fn, 4 * M * N, k

    def alloc(n):
        t = torch.empty(n, device="cuda")
        return t, t.data_ptr()

    def fn():
        cn.backward(dy.data_ptr(), x.data_ptr(), w.data_ptr(), mean.data_ptr(), rstd.data_ptr(), dx.data_ptr(),
                    dw.data_ptr(), 0 if rms else db.data_ptr(), M, N, "bfloat16", "bfloat16", 0, rms, 0, stream,
                    alloc, config=cfg)
    return cfg, fn, 6 * M * N, k


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    stream = cupy_stream(torch.cuda.current_stream().cuda_stream)
    results = []
    directions = os.environ.get("SWEEP_DIRS", "fwd,bwd").split(",")
    precompile(directions)
    for N in SWEEP_NS:
        M = 2**27 // N
        x = (torch.randn(M, N, device="cuda") * 0.5 - 2.3).bfloat16()
        dy = torch.randn(M, N, device="cuda").bfloat16()
        w = torch.randn(N, device="cuda").bfloat16()
        y = torch.empty_like(x)
        dx = torch.empty_like(x)
        mean = torch.empty(M, device="cuda")
        rstd = torch.empty(M, device="cuda")
        dw = torch.empty(N, device="cuda", dtype=torch.bfloat16)
        db = torch.empty_like(dw)
        for rms in [op == "rms" for op in OPS]:
            for direction in directions:
                cases = []  # (cfg, fn, bytes, kernel or None)
                for cfg in candidates(N, direction, rms):
                    try:
                        cases.append(sweep_case(cfg, direction, rms, N, M, x, dy, w, y, dx, mean, rstd, dw, db,
                                                stream))
                    except Exception as e:  # noqa: BLE001
                        print(f"N={N} {direction} rms={rms} {cfg}: {type(e).__name__} {str(e)[:120]}")
                if PEERS and direction == "fwd":
                    from fusedkit.bench import _impls
                    impls = _impls(torch, "rms_norm_fwd" if rms else "layer_norm_fwd", M, N, torch.bfloat16)
                    cases += [(("peer", name), fn, 4 * M * N, None) for name, fn in impls.items()
                              if name in ("fusedkit", "torch_compile", "liger")]
                times = {}
                for rnd in range(ROUNDS):
                    for cfg, fn, nbytes, k in cases:
                        try:
                            ms = timer.ms(fn, rep=10, min_time_ms=30)
                        except Exception as e:  # noqa: BLE001
                            print(f"N={N} {direction} rms={rms} {cfg}: {type(e).__name__} {str(e)[:120]}")
                            continue
                        times.setdefault(cfg, []).append(ms)
                        gbps = nbytes / ms / 1e6
                        regs, local = (k.num_regs, k.local_size_bytes) if k is not None else (None, None)
                        results.append({"N": N, "rms": rms, "dir": direction, "cfg": list(cfg), "ms": ms,
                                        "GBps": gbps, "of_copy": gbps / copy, "regs": regs, "local_bytes": local,
                                        "round": rnd})
                        print(f"N={N:6d} {'rms' if rms else 'ln '} {direction} {str(cfg):28s} "
                              f"{ms:.4f} ms {gbps:6.0f} GB/s {gbps / copy:.3f} regs={regs} local={local}",
                              flush=True)
                kernels = {c: statistics.median(t) for c, t in times.items() if c[0] != "peer"}
                if kernels:
                    best = min(kernels, key=kernels.get)
                    nbytes = next(b for c, _, b, _ in cases if c == best)
                    print(f"BEST N={N} {'rms' if rms else 'ln'} {direction}: {best} "
                          f"{nbytes / kernels[best] / 1e6 / copy:.3f} of copy (median of {ROUNDS})", flush=True)
        del x, dy, y, dx
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({**run_meta(torch.cuda.get_device_name()), "copy_GBps": copy, "results": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
