"""CUDA launches for the fused cross-entropy (kernels in cuda/cross_entropy.cu). Pointers in, no syncs.

``fwd_config`` picks, per vocab size N, how a row lives on chip: on sm_90+, rows of at least
STAGED_MIN_BYTES whose length and pointers allow 16-byte vectors are staged in shared memory by one bulk
copy per CTA (``("staged", threads, C, buffers)``: C CTAs of a cluster split the row, at most
STAGE_CHUNK_BYTES each, so several rows share an SM in different phases); otherwise one block's registers (``("rows",
vec, items, warps, 1)``: 32 * warps threads x items vectors of vec elements; short rows pack 4 / warps
rows per block), a thread-block cluster of C CTAs splitting the row in registers (``("rows", vec, items,
16, C)``, sm_90+, launched with a cluster-dimension attribute through fusedkit/_launch.py), or, beyond
that, ``("looped", vec)`` (two passes over global memory). ``("persistent", vec, items, warps, C)``
(sm_90, 16-byte vectors): the register mapping of the cluster kernel in a persistent grid whose CTAs
bulk-copy their chunk of the next row while they finish the current one (TUNED_PERSISTENT names
the shapes; ``config=`` and tools/sweep_cross_entropy.py reach the others); an optional sixth field,
the ring depth (1 to 4 buffers, rows loaded ahead; default 1). Sequence of a call (all on the caller's
stream): ``mean`` with a gradient first counts the non-ignored targets (ce_reduce without losses), then
the fused kernel writes per-token losses (and lse, and the gradient), then ce_reduce sums them in a fixed
order (65536 tokens per block; ce_reduce_final over the block partials when there are several).
"""
from __future__ import annotations

from functools import lru_cache

from .. import _env, _jit
from .._dtypes import CXX, ITEMSIZE
from .._launch import Launcher, stream_ptr
from ._common import (LaunchPlan, align_elems, blocks_per_sm, check_row_config, grid_stride_blocks, launcher,
                      resident_clusters, ring_stages, sm_count, stages_arg, vec_width)

FILE = "cross_entropy.cu"
CLUSTERS = (2, 4, 8)     # portable cluster sizes tried, smallest first
LOOPED_THREADS = 512     # kCeLoopedThreads
REDUCE_THREADS = 1024    # kCeReduceThreads
REDUCE_CHUNK = 65536     # kCeReduceChunk: tokens per ce_reduce block (fixed, so sums are reproducible)
BWD_THREADS = 256

# Launch configs measured best on the H200, keyed by (N, itemsize): filled from sweeps (the rule in
# fwd_config applies elsewhere). 262144: sweep_ce_persistent_2026-12-05T1011Z.json (4096 x 262144
# bf16, loss and gradient): 16 CTAs of 32 KB, double-buffered, 0.847 of copy against 0.825 for the
# rule's 8 CTAs x 64 KB (benchmarks on an H100 the same day, 102254Z / 102556Z: 0.892 / 0.848).
TUNED: dict = {(262144, 2): ("staged", 256, 16, 2)}

# The staged kernel (ce_fwd_staged): rows of at least STAGED_MIN_BYTES, split over the fewest CTAs
# (cluster of 1, 2, 4, 8 or 16) that keep each CTA's chunk within STAGE_CHUNK_BYTES. Sweeps on the H200
# (tools/sweep_cross_entropy.py, bf16, loss + gradient, fraction of copy at N = 32768 / 131072 / 262144;
# benchmarks/results/sweep_ce_2026-12-03T*.json):
#   12:00Z, before: register rows and clusters 0.40-0.61, the two-pass looped kernel 0.64 / 0.60 / 0.60;
#   12:33Z, staged, one buffer, 256 threads: 64 KB chunks 0.873 (no cluster) / 0.700 (4 CTAs) / 0.669
#   (8 CTAs); 32 KB chunks 0.725 (2) / 0.665 (8) / 0.632 (16); 512 threads and the persistent
#   double-buffered form (BUFFERS = 2) slower everywhere. Clusters cost more than the chunk size buys:
#   at 32768, 64 KB in one CTA reads 0.873 and 32 KB in each of two 0.725.
STAGED_THREADS = 256
STAGED_BUFFERS = 1  # 2: persistent and double-buffered (slower, see cuda/cross_entropy.cu)
STAGE_CHUNK_BYTES = 64 * 1024
STAGED_MIN_BYTES = 32 * 1024
STAGED_CLUSTERS = (1, 2, 4, 8, 16)
STAGED_MAX_GROUPS = None  # tests: cap the staged grid (clusters) so each cluster walks many rows
# Cluster scheduling policy preference of the staged launches (0 default, 1 spread, 2 load balancing):
# tools/sweep_cross_entropy.py measures the three (SWEEP_POLICIES).
STAGED_CLUSTER_POLICY = 0
# The persistent kernel (ce_fwd_persistent): (items, warps, C) per (N, itemsize), taking precedence over
# the rule where it applies (the softmax forward's long-row scheme). Sweep
# sweep_ce_persistent_2026-12-05T1011Z.json (2^30 bf16 elements, loss and gradient, fraction of copy):
# 8192 x 131072 (8, 32, 2) 0.885 against 0.856 for the staged rule (4 CTAs x 64 KB; H100 benchmarks
# 102254Z / 102556Z: 0.878 / 0.874); at 262144 its best (8, 16, 8) read 0.837, below the staged 0.847
# (on an H100 the other way round, 0.936 against 0.906: ab_staged_pieces_H100_2026-12-06T1450Z.json;
# the H200 A/B decides).
# PERSISTENT_CANDIDATES: the splits the compile-all check builds and the sweep times (bf16); a fourth
# field is the ring depth (32 KB chunks, two rows loaded ahead).
TUNED_PERSISTENT: dict = {(131072, 2): (8, 32, 2)}
PERSISTENT_CANDIDATES = {32768: ((8, 16, 1), (4, 32, 1)),
                         131072: ((8, 16, 4), (4, 32, 4), (8, 32, 2), (4, 16, 8, 2)),
                         262144: ((8, 16, 8), (4, 32, 8), (4, 16, 16), (4, 16, 16, 2), (8, 8, 16, 2),
                                  (8, 16, 8, 2), (4, 32, 8, 2))}


def regs_per_item(vec: int, itemsize: int) -> int:
    """32-bit registers one vector of row data occupies (a 2-byte scalar still takes a register)."""
    return max(1, vec * itemsize // 4)


def fwd_config(N: int, itemsize: int, cluster: bool = True, max_vec: int = 16):
    """("staged", threads, C, buffers), ("rows", vec, items, warps, C) or ("looped", vec) for rows of N
    elements of ``itemsize`` bytes.

    Rule: with clusters (sm_90+) the staged kernel where staged_config allows it; else the fewest warps
    (1..16) with at most 8 registers of row data per thread, or 16 warps with at most 16 (ptxas then
    fits 1024 threads per SM at <= 64 registers); else, with clusters (sm_90+), the
    smallest cluster of 16-warp CTAs with at most 16 registers of data per thread, then 8 CTAs with up to
    32 (one 512-thread block per SM); without clusters one 16-warp block with up to 32; else looped.
    ``max_vec``: the pointers' alignment in elements (align_elems)."""
    vec = vec_width(N, itemsize, max_vec)
    p = TUNED_PERSISTENT.get((N, itemsize))
    if p is not None and cluster and vec * itemsize == 16:
        return ("persistent", vec) + tuple(p)
    if vec == vec_width(N, itemsize):
        t = TUNED.get((N, itemsize))
        if t is not None and (cluster or (t[0] == "rows" and t[4] == 1) or t[0] == "looped"):
            return t
    if cluster:
        st = staged_config(N, itemsize, max_vec)
        if st is not None:
            return st
    rpi = regs_per_item(vec, itemsize)
    nv = N // vec
    for warps in (1, 2, 4, 8, 16):
        items = -(-nv // (32 * warps))
        if items * rpi <= 8 or (warps == 16 and items * rpi <= 16):
            return ("rows", vec, items, warps, 1)
    if cluster:
        for c in CLUSTERS:
            items = -(-(-(-nv // c)) // 512)
            if items * rpi <= 16:
                return ("rows", vec, items, 16, c)
        c = CLUSTERS[-1]
    else:
        c = 1
    items = -(-(-(-nv // c)) // 512)
    if items * rpi <= 32:
        return ("rows", vec, items, 16, c)
    return ("looped", vec)


def staged_config(N: int, itemsize: int, max_vec: int = 16):
    """("staged", STAGED_THREADS, C, STAGED_BUFFERS) when a row of N elements can be staged (16-byte
    vectors: N and the pointers' alignment ``max_vec`` allow them; at least STAGED_MIN_BYTES), else
    None. C: the fewest CTAs of STAGED_CLUSTERS whose chunks fit STAGE_CHUNK_BYTES."""
    vec = 16 // itemsize
    row = N * itemsize
    if N % vec or max_vec < vec or row < STAGED_MIN_BYTES:
        return None
    for c in STAGED_CLUSTERS:
        if -(-(N // vec) // c) * 16 <= STAGE_CHUNK_BYTES:
            return ("staged", STAGED_THREADS, c, STAGED_BUFFERS)
    return None


def staged_chunk_bytes(cfg, N: int, itemsize: int) -> int:
    """Bytes of a row one CTA of a staged launch holds (its chunk of 16-byte vectors); the kernel's
    dynamic shared memory is cfg[3] (buffers) of them."""
    c = cfg[2]
    return -(-(N * itemsize // 16) // c) * 16


def rows_per_block(warps: int) -> int:
    return 4 // warps if warps < 4 else 1


def persistent_chunk_bytes(cfg, N: int) -> int:
    """Shared memory of a persistent config: one CTA's chunk of the row, whole 16-byte vectors, per
    buffer of its ring."""
    return ring_stages(cfg) * -(-(N // cfg[1]) // cfg[4]) * 16


def fwd_expr(cfg, dt: str) -> str:
    if cfg[0] == "staged":
        return f"fk::ce_fwd_staged<{CXX[dt]}, {cfg[1]}, {cfg[2]}, {cfg[3]}>"
    if cfg[0] == "persistent":
        vec, items, warps, c = cfg[1:5]
        return f"fk::ce_fwd_persistent<{CXX[dt]}, {vec}, {items}, {warps}, {c}{stages_arg(ring_stages(cfg))}>"
    if cfg[0] == "rows":
        _, vec, items, warps, c = cfg
        if c == 1:
            return f"fk::ce_fwd<{CXX[dt]}, {vec}, {items}, {warps}>"
        return f"fk::ce_fwd_cluster<{CXX[dt]}, {vec}, {items}, {warps}, {c}>"
    return f"fk::ce_fwd_looped<{CXX[dt]}, {cfg[1]}>"


def bwd_expr(dt: str, vec: int) -> str:
    return f"fk::ce_bwd<{CXX[dt]}, {vec}>"


REDUCE_EXPR = "fk::ce_reduce"
REDUCE_FINAL_EXPR = "fk::ce_reduce_final"
FWD_CODES = "ppppppqiiqfff"
BWD_CODES = "ppppppqiiiqfff"
REDUCE_CODES = "ppiqqppppi"
REDUCE_FINAL_CODES = "ppippi"


@lru_cache(maxsize=None)
def clusters_ok(device: int) -> bool:
    """Thread-block clusters exist from compute capability 9.0."""
    import cupy
    return cupy.cuda.Device(device).compute_capability >= "90"


_plans: dict = _jit.plan_cache()
_logged: set = set()


def _fwd_plan(N, dt, device, config, max_vec):
    """The LaunchPlan of the fused kernel, cached per shape/dtype. Its cap: the grid's clusters for the
    persistent kernel and the double-buffered staged one (the resident ones), 0 for the other staged
    launches (one row per cluster, capped only by STAGED_MAX_GROUPS in tests), None for the register and
    looped kernels."""
    key = (N, dt, device, config, max_vec, STAGED_CLUSTER_POLICY)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    cfg = config or fwd_config(N, ITEMSIZE[dt], clusters_ok(device), max_vec)
    if cfg[0] in ("rows", "persistent"):  # register-mapped: the row must fit the config
        vec, items, warps, c = cfg[1:5]
        check_row_config("cross_entropy", cfg, N, vec, c * 32 * warps * items)
    expr = fwd_expr(cfg, dt)
    k = _jit.get_kernel(FILE, expr, device)
    smem, cap = 0, None
    if cfg[0] in ("staged", "persistent"):  # a chunk of the row in shared memory: resident clusters
        rpb = 1
        if cfg[0] == "staged":
            c, block, policy = cfg[2], (cfg[1], 1), STAGED_CLUSTER_POLICY
            smem = cfg[3] * staged_chunk_bytes(cfg, N, ITEMSIZE[dt])
        else:
            c, block, policy = cfg[4], (32 * cfg[3], 1), 0
            smem = persistent_chunk_bytes(cfg, N)
        try:
            per_sm = blocks_per_sm(k, expr, device, block[0], smem)  # also opts in past 48 KB
        except RuntimeError:
            per_sm = 0
        fn = Launcher(k.kernel, FWD_CODES, device, cluster=c if c > 1 else None, cluster_policy=policy)
        resident = (resident_clusters(fn, block, device, smem) if (c > 1 and per_sm)
                    else per_sm * sm_count(device))
        if resident < 1:
            _env.debug(1, f"cross_entropy: {expr} cannot be resident here; using the register rule")
            plan = _plans[key] = _fwd_plan(N, dt, device, fwd_config(N, ITEMSIZE[dt], False, max_vec), max_vec)
            return plan
        # the persistent kinds walk rows over the resident clusters; staged with one buffer: a row each
        cap = resident if cfg[0] == "persistent" or cfg[3] == 2 else 0
    elif cfg[0] == "rows":
        warps, c = cfg[3], cfg[4]
        rpb = rows_per_block(warps) if c == 1 else 1
        block = (32 * warps, rpb)
        fn = Launcher(k.kernel, FWD_CODES, device, cluster=c if c > 1 else None)
        if c > 1 and resident_clusters(fn, block, device) < 1:
            # the cluster cannot be resident (a partitioned GPU, MIG): the looped kernel always can
            _env.debug(1, f"cross_entropy: {expr} cannot launch clusters of {c} here; using the looped kernel")
            plan = _plans[key] = _fwd_plan(N, dt, device, ("looped", cfg[1]), max_vec)
            return plan
    else:
        c, rpb, block = 1, 1, (LOOPED_THREADS, 1)
        fn = Launcher(k.kernel, FWD_CODES, device)
    if _env.DEBUG >= 1 and expr not in _logged:
        _logged.add(expr)
        _env.debug(1, f"cross_entropy: {expr} grid=rows/{rpb}*{c} block={block} cluster={c} smem={smem}")
    plan = _plans[key] = LaunchPlan(fn, block, rpb, c, smem, cap)
    return plan


def forward(logits, target, t32, grad, loss, lse, count, M, N, dt, ignore_index, smoothing, z_loss,
            grad_scale, device, stream, config=None, dependent=False):
    """The fused kernel: per-token loss (M floats) and, when their pointers are non-zero, lse and the
    gradient (grad may equal logits: in place). count: pointer to the int count of non-ignored tokens
    ("mean" with a gradient), else 0. ``dependent``: launched as the programmatic dependent of the
    reduce() that writes count, just queued (fusedkit/_launch.py)."""
    if M == 0:
        return
    s = ITEMSIZE[dt]
    max_vec = align_elems(((logits, s), (grad, s)))
    fn, block, rpb, c, smem, cap = _fwd_plan(N, dt, device, config, max_vec)
    rows = -(-M // rpb)  # blocks (clusters) of the grid
    if cap is not None:  # staged (cap 0: one row per cluster) or persistent (cap: the resident clusters)
        rows = min(rows, cap or rows, STAGED_MAX_GROUPS or rows)
    fn(rows * c, block, smem, stream_ptr(stream), logits, target, grad, loss, lse, count, M, N, int(t32),
       int(ignore_index), float(smoothing), float(z_loss), float(grad_scale), dependent=dependent)


def backward(grad_loss, per_token, logits, target, t32, lse, grad, count, M, N, dt, ignore_index, smoothing,
             z_loss, grad_scale, device, stream, dependent=False):
    """grad (M x N) from logits and the saved lse; the row scale is grad_scale * grad_loss[0 or row]
    (grad_loss may be 0) / *count (count: pointer for "mean", else 0; ``dependent`` as in forward)."""
    if M == 0:
        return
    s = ITEMSIZE[dt]
    vec = vec_width(N, s, align_elems(((logits, s), (grad, s))))
    nvec = N // vec
    tx = 32
    while tx < BWD_THREADS and tx < nvec:
        tx *= 2
    ty = BWD_THREADS // tx
    grid = grid_stride_blocks(M, ty, device)
    launcher(FILE, bwd_expr(dt, vec), BWD_CODES, device)(
        grid, (tx, ty), 0, stream_ptr(stream), grad_loss, logits, target, lse, grad, count, M, N, int(t32),
        int(per_token), int(ignore_index), float(smoothing), float(z_loss), float(grad_scale), dependent=dependent)


def reduce(loss, target, t32, T, ignore_index, out, out_count, mean, device, stream, alloc, dependent=False):
    """out = sum (or mean, with ``mean``) of the T per-token losses (loss may be 0: count only) and
    out_count = the number of non-ignored targets (either output may be 0). Deterministic: fixed chunks
    and trees. ``alloc(n, dtype)`` -> (keep-alive, pointer) for the block partials of large T.
    ``dependent``: the first launch is the programmatic dependent of forward(), just queued (it waits
    for the losses)."""
    sp = stream_ptr(stream)
    P = max(1, -(-T // REDUCE_CHUNK))
    red = launcher(FILE, REDUCE_EXPR, REDUCE_CODES, device)
    if P == 1:
        red(1, (REDUCE_THREADS, 1), 0, sp, loss, target, int(t32), T, int(ignore_index), 0, 0, out, out_count,
            int(mean), dependent=dependent)
        return []
    ks, psum = alloc(P, "float32")
    kc, pcount = alloc(P, "int32")
    red(P, (REDUCE_THREADS, 1), 0, sp, loss, target, int(t32), T, int(ignore_index), psum, pcount, 0, 0, int(mean),
        dependent=dependent)
    launcher(FILE, REDUCE_FINAL_EXPR, REDUCE_FINAL_CODES, device)(
        1, (REDUCE_THREADS, 1), 0, sp, psum, pcount, P, out, out_count, int(mean))
    return [ks, kc]


def all_expressions():
    """Every instantiation the library requests for the tested and benchmarked vocab sizes (sm_90
    cluster configs and the no-cluster ones), with and without 16-byte vectors, plus the reductions."""
    exprs = {REDUCE_EXPR, REDUCE_FINAL_EXPR}
    Ns = (1, 7, 781, 1024, 4096, 32768, 50257, 131072, 262144)
    for dt in ("float32", "float16", "bfloat16"):
        s = ITEMSIZE[dt]
        for N in Ns:
            for cluster in (True, False):
                for max_vec in (16, 1):  # aligned, and views off a 16-byte boundary
                    exprs.add(fwd_expr(fwd_config(N, s, cluster, max_vec), dt))
        for c in STAGED_CLUSTERS:  # every cluster size of the staged kernel (the tests force 1-8)
            for buffers in (1, 2):
                exprs.add(fwd_expr(("staged", STAGED_THREADS, c, buffers), dt))
        for N, cands in PERSISTENT_CANDIDATES.items():  # the persistent kernel's candidates (bf16)
            for cand in cands if dt == "bfloat16" else ():
                exprs.add(fwd_expr(("persistent", 8) + tuple(cand), dt))
        for vec in sorted({1, 16 // s}):
            exprs.add(fwd_expr(("looped", vec), dt))
            exprs.add(bwd_expr(dt, vec))
    return {FILE: sorted(exprs)}
