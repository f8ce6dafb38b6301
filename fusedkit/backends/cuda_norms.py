"""CUDA launches for LayerNorm / RMSNorm (kernels in cuda/norms.cu).

Launch configs are small tables, not formulas scattered around: ``fwd_config`` / ``bwd_config`` pick
the kernel kind, the vector width (16-byte accesses when N and the pointers allow), the warps per row
and the vectors per thread, so that a row lives in registers; longer rows take the looped kernels.
Forward: one group of rows per block (non-persistent); ``forward_fp8`` is the same forward with FP8
output, grid-stride, with its own configs (TUNED_FP8), which the fp32-output forward shares.
Backward: persistent, staged through shared memory on sm_90 (bulk copies), with grid sizes from the
compiled kernel's occupancy; one column_sum launch adds the partial rows of dweight and dbias.
"""
from __future__ import annotations

from functools import lru_cache


from .. import _env, _jit
from .._launch import ExLaunch, Launcher, stream_ptr
from ._common import align_elems, blocks_per_sm, check_row_config, sm_count, vec_width  # noqa: F401 (vec_width, align_elems: also for tools)
from .._dtypes import CXX, ITEMSIZE
from .cuda_fp8 import FMT_CXX

FILE = "norms.cu"
MAX_ITEMS_FWD = 8   # vectors of 16 B per thread (4 registers each, one buffer)
MAX_ITEMS_BWD = 4   # x, dy and the fp32 dweight/dbias accumulators of those columns
MAX_WARPS_FWD = 16
MAX_WARPS_BWD = 16  # 512 threads keep 128 registers per thread

# Tuned (items, warps) per (op, N, itemsize, direction) for the register kernels: the winners of
# tools/sweep_norms.py on the H200 (bf16; benchmarks/results/; backward
# register fallback: sweep_*1406Z.json; forward: sweep_*1631Z.json). Other shapes use the rule in _rows_config.
# A third value is the plain forward's min_blocks (resident blocks asked of ptxas; A/B of run 1617Z:
# LayerNorm 16384 0.906 -> 0.938 of copy at 3 blocks, RMSNorm 16384 0.956 -> 0.943, the others equal).
# A hint also keeps the kernel general (no FULL, see fwd_expr). LayerNorm 8192 needs that: FULL (commit
# 7739dce, A/B'd at 1024 only) hoists the weight and bias loads and takes 79 registers (3 blocks of 256
# threads per SM) against 48 (5 blocks); the H200 benchmark of LayerNorm 16384 x 8192 fell from
# 0.930-0.934 of copy (every run of 12-03 and 12-04 up to afde242) to 0.903 with it, while 1024 and 4096
# gained 2 % (0.945 -> 0.966, 0.933 -> 0.952, runs 191717Z / 212618Z). (4, 8, 4) is that general kernel
# again, instruction for instruction (tools/sass_digest.py's per-kernel comparison).
TUNED: dict = {
    ("ln", 1024, 2, "fwd"): (4, 1), ("ln", 4096, 2, "fwd"): (4, 4), ("ln", 8192, 2, "fwd"): (4, 8, 4),
    ("ln", 16384, 2, "fwd"): (4, 16, 3),
    ("rms", 1024, 2, "fwd"): (2, 2), ("rms", 4096, 2, "fwd"): (2, 8), ("rms", 8192, 2, "fwd"): (4, 8),
    ("rms", 16384, 2, "fwd"): (4, 16),
    ("ln", 1024, 2, "bwd"): (2, 2), ("ln", 4096, 2, "bwd"): (2, 8), ("ln", 8192, 2, "bwd"): (2, 16),
    ("ln", 16384, 2, "bwd"): (4, 16),
    ("rms", 1024, 2, "bwd"): (4, 1), ("rms", 4096, 2, "bwd"): (4, 4), ("rms", 8192, 2, "bwd"): (4, 8),
    ("rms", 16384, 2, "bwd"): (4, 16),
}

# The staged backward (sm_90: rows through a ring of shared-memory stages filled by bulk copies), tuned
# (items, warps, stages, min_blocks, cluster) per (op, N, itemsize) (min_blocks: the occupancy asked of
# ptxas, 0 = the kernel's default; cluster: CTAs per cluster that add their dweight / dbias partial rows
# through distributed shared memory before writing one, 1 = none); used on sm_90 for every shape it
# applies to (rule in _staged_config). N = 16384 (was (4, 16, 2, 0) for both) runs the pair kernel below.
# A staged forward was measured too and lost to the register kernel at every swept shape (sweeps
# 1556Z-1612Z: 0.78-0.87 of copy against 0.91-0.96), so it was removed.
# The clusters: sweep_norms_bwd_cluster_merge_2026-12-04T0325Z.json (2^27 bf16 elements, backward with
# its column_sum, fraction of copy, cluster 1 -> the one shipped): LayerNorm 1024 0.878 -> 0.904, 4096
# 0.868 -> 0.910, 8192 0.873 -> 0.932 (cluster 2: 0.917); RMSNorm 1024 0.909 -> 0.925, 4096 0.906 -> 0.914,
# 8192 0.913 with cluster 1 (2: 0.909, 4: 0.898). LayerNorm 1024 then from every staged config x cluster
# (sweep_norms_bwd_1024_clusters_2026-12-04T0355Z.json): (2, 2, 6, 4, 2) 0.921, a plateau with (2, 2, 2,
# 0, 2) 0.918 and the earlier (1, 4, 4, 0, 2) 0.916; cluster 1 0.846-0.879, cluster 4 0.906-0.908.
TUNED_STAGED: dict = {
    ("ln", 1024, 2): (2, 2, 6, 4, 2), ("ln", 4096, 2): (2, 8, 2, 0, 2), ("ln", 8192, 2): (2, 16, 3, 0, 4),
    ("rms", 1024, 2): (2, 2, 2, 0, 2), ("rms", 4096, 2): (1, 16, 2, 0, 2), ("rms", 8192, 2): (2, 16, 2, 0, 1),
}
# The backward with each row split over a cluster of two CTAs (norm_bwd_staged_pair, sm_90), tuned
# (items, warps, stages, min_blocks, pipe, merge, split) of the row part per (op, N, itemsize) (merge:
# pairs per cluster that add their partial rows before writing one, 1 = none; split: CTAs per row, 2 or
# 4 (quarters: the config is the quarter row's)); takes precedence over TUNED_STAGED. The kernel keeps
# its name "pair" for quarters too. Sweep 223551Z (8192 x 16384 bf16, halves): LayerNorm 0.744 -> 0.808
# of copy, RMSNorm 0.829 -> 0.889; pipe = 1 (the next row's sums before the wait for the peer's) was slower (0.676 /
# 0.808). At N = 8192 (halves of 4096) every pair config lost to the staged kernel (sweep 2219Z).
TUNED_PAIR: dict = {
    ("ln", 16384, 2): (2, 8, 2, 0, 0, 2, 4), ("rms", 16384, 2): (2, 8, 3, 0, 0, 2, 4),
}
# 8192 x 16384 bf16, backward with its column_sum, fraction of copy. Halves, two pairs per cluster
# (merge 2; sweep_norms_bwd_pair_merge_2026-12-04T0333Z.json): LayerNorm 0.806 -> 0.836 (merge 4:
# 0.834), RMSNorm 0.891 -> 0.895. Quarters (split 4: four CTAs of 256 threads per row, two such CTAs
# per SM where a half-row CTA of 512 threads was alone; sweep_norms_bwd_quarters_2026-12-04T0341Z.json),
# two rows' groups per cluster: LayerNorm 0.839 -> 0.887 (3 stages 0.886, merge 1: 0.822), RMSNorm
# 0.895 -> 0.935 with the LayerNorm quarter config and 3 stages (RMSNorm's own 4096 config (1, 16):
# 0.66).
CLUSTER_CHOICES = (2, 4)        # cluster-merge sizes of the staged backward that are registered and swept
STAGE_BYTES_TARGET = 32 * 1024  # ring bytes per block when not tuned (deeper rings measured slower)
MAX_STAGES = 16                 # kMaxStages in cuda/common/bulk.cuh


def _rows_config(N, itemsize, max_items, max_warps, direction, rms, max_vec=16):
    """Fewest warps per row that keep at most 2 vectors per thread (the sweeps in benchmarks/results
    favour more threads with less register state); at max_warps, up to max_items vectors."""
    vec = vec_width(N, itemsize, max_vec)
    t = TUNED.get(("rms" if rms else "ln", N, itemsize, direction))
    if t is not None and vec == vec_width(N, itemsize):
        return ("rows", vec) + t
    nv = N // vec
    for warps in (1, 2, 4, 8, 16, 32):
        if warps > max_warps:
            break
        items = -(-nv // (32 * warps))
        if items <= 2 or (warps == max_warps and items <= max_items):
            return ("rows", vec, items, warps)
    return ("looped", vec)


def _staged_config(N, itemsize, rms):
    """The staged backward for the rows config, or None when rows are not 16-byte multiples or too long
    for registers. Stages: as many as fit STAGE_BYTES_TARGET (2..MAX_STAGES)."""
    vec = vec_width(N, itemsize)
    if vec * itemsize != 16:
        return None
    t = TUNED_STAGED.get(("rms" if rms else "ln", N, itemsize))
    if t is not None:
        return ("staged", vec) + t
    cfg = _rows_config(N, itemsize, MAX_ITEMS_BWD, MAX_WARPS_BWD, "bwd", rms)
    if cfg[0] != "rows":
        return None
    _, _, items, warps = cfg
    group_bytes = rows_per_block(warps) * N * itemsize * 2
    stages = max(2, min(MAX_STAGES, STAGE_BYTES_TARGET // group_bytes))
    return ("staged", vec, items, warps, stages, 0, 1)


# The FP8-output forward's own winners where they differ from the plain forward's (it is issue-bound,
# not memory-bound, and prefers other splits): (items, warps) per (op, N, itemsize). Sweep
# sweep_fp8_configs_2026-12-03T1653Z.json (bf16): RMSNorm 4096 0.821 -> 0.891 of copy, RMSNorm 14336
# 0.876 -> 0.927, LayerNorm 14336 0.759 -> 0.775 (12 warps: not a power of two).
# LayerNorm 14336 then (4, 14), the split that fills the row exactly: H200 sweep 1946Z 0.839 -> 0.867;
# A/B of 2026-12-06 (ab_ln_fp8_14336_H200_2026-12-06T0251Z.json, two runs each, interleaved) 0.843 /
# 0.840 -> 0.876 / 0.877.
# LayerNorm 14336 then (7, 8) with the non-persistent kernel (TUNED_FP8_WAVES): the H100 config sweep of
# that kernel (sweep_fp8_configs_none_{1,2}_H100_2026-12-06T1105Z.json, two runs within 0.002) read
# (7, 8) 0.971 / 0.972 of copy, (8, 7) 0.970, (4, 14) 0.876; the persistent kernel's best, (6, 10), 0.905
# and (4, 14) 0.901 (sweep_fp8_configs_shipped_H100_2026-12-06T1105Z.json). 8 warps of 7 vectors keep
# 112 bytes of the row in flight per thread where 14 warps of 4 kept 64.
# The fp32-output plain forward takes these configs too (fwd_fp8_config): the FP8 bytes and amax must
# equal the cast of the fp32 y bit for bit, and another split of the row sums moves y by an ulp.
TUNED_FP8: dict = {
    ("rms", 4096, 2): (4, 4), ("rms", 14336, 2): (5, 12), ("ln", 14336, 2): (7, 8),
}


def fwd_config(N: int, itemsize: int, rms: bool = False, max_vec: int = 16):
    """Launch config of the forward with 16-bit or input-typed output: ("rows", vec, items, warps),
    ("rows", vec, items, warps, min_blocks) where tuned with an occupancy hint, or ("looped", vec).
    max_vec: the pointers' alignment in elements (align_elems). fp32 output: fwd_fp8_config."""
    return _rows_config(N, itemsize, MAX_ITEMS_FWD, MAX_WARPS_FWD, "fwd", rms, max_vec)


def fwd_fp8_config(N: int, itemsize: int, rms: bool = False, max_vec: int = 16):
    """Launch config of the FP8-output forward and of the fp32-output plain forward (one config, so the
    FP8 output is exactly the cast of the fp32 one): TUNED_FP8 where it has the shape and the pointers
    allow its vector width, else fwd_config."""
    t = TUNED_FP8.get(("rms" if rms else "ln", N, itemsize))
    vec = vec_width(N, itemsize, max_vec)
    if t is not None and vec == vec_width(N, itemsize):
        return ("rows", vec) + t
    return fwd_config(N, itemsize, rms, max_vec)


def fwd_plain_config(N: int, itemsize: int, o_itemsize: int, rms: bool = False, max_vec: int = 16):
    """The plain forward's config for an output of o_itemsize bytes (4: the FP8 forward's config)."""
    pick = fwd_fp8_config if o_itemsize == 4 else fwd_config
    return pick(N, itemsize, rms, max_vec)


def pair_from_half(N, itemsize, rms, pipe: bool = False, merge: int = 1, split: int = 2):
    """A pair config for rows of N: the staged config of the row part (N / split: halves, or quarters
    with split 4), the PIPE flag (the next row's local sums before waiting for the peers' sums of this
    row), the groups per cluster whose partial rows are added before one is written (merge) and split;
    or None."""
    part = _staged_config(N // split, itemsize, rms) if N % split == 0 else None
    return None if part is None or part[3] < 4 else ("pair",) + part[1:6] + (int(pipe), merge, split)


def _pair_config(N, itemsize, rms):
    """The two-CTA backward where TUNED_PAIR has the shape and the half row keeps 16-byte vectors."""
    t = TUNED_PAIR.get(("rms" if rms else "ln", N, itemsize))
    vec = vec_width(N, itemsize)
    if t is None or vec * itemsize != 16 or N % (t[6] * vec):
        return None
    return ("pair", vec) + tuple(t)


def bwd_config(N: int, itemsize: int, rms: bool = False, staged: bool = False, max_vec: int = 16):
    """Launch config of the backward: ("staged", vec, items, warps, stages, min_blocks, cluster) or
    ("pair", vec, items, warps, stages, min_blocks, pipe, merge, split) when `staged` is allowed (sm_90+,
    16-byte aligned pointers) and applies, else ("rows", vec, items,
    warps) or ("looped", vec)."""
    cfg = None
    if staged and max_vec >= 16 // itemsize:
        cfg = _pair_config(N, itemsize, rms) or _staged_config(N, itemsize, rms)
    return cfg or _rows_config(N, itemsize, MAX_ITEMS_BWD, MAX_WARPS_BWD, "bwd", rms, max_vec)


def rows_per_block(warps: int) -> int:
    return 4 // warps if warps < 4 else 1


def _b(v: bool) -> str:
    return "true" if v else "false"


def plain_weights(w, b, rms, zero_centered) -> bool:
    """The register forward's PLAIN_W flag: weights given (and a bias for LayerNorm), gamma not
    zero-centred; then gamma and beta need no defaults (cuda/norms.cu store_row)."""
    return bool(w) and (rms or bool(b)) and not zero_centered


def bwd_plain_weights(has_w, zero_centered) -> bool:
    """The backward's PLAIN_W flag: a weight is given and gamma is not zero-centred (the bias plays no
    part in the backward)."""
    return bool(has_w) and not zero_centered


def _row_bytes(cfg, x_dt) -> int:
    """Bytes of the row one thread of a register config holds."""
    return cfg[1] * cfg[2] * ITEMSIZE[x_dt]


def full_rows(cfg, N, x_dt, w_dt) -> bool:
    """The register forward's FULL flag: rows of N fill every vector slot of the config (N == items x
    threads per row x vec), so the kernel drops its per-vector bounds tests (cuda/norms.cu load_row).
    Only where that compiles without spills under the kernel's register cap (compile-all check): 16-bit
    weights and at most 64 bytes of row per thread; the occupancy-hinted configs are left out by the
    callers (fwd_expr)."""
    return (N is not None and cfg[0] == "rows" and N == cfg[1] * cfg[2] * 32 * cfg[3]
            and ITEMSIZE[w_dt] == 2 and _row_bytes(cfg, x_dt) <= 64)


def fwd_expr(cfg, x_dt, w_dt, o_dt, rms, *, plain_w, N=None) -> str:
    """N: the row length the kernel serves (FULL when it fills the config; None: the general kernel)."""
    if cfg[0] == "rows":
        vec, items, warps = cfg[1:4]
        # the occupancy hint, measured with 16-bit weights and output (fp32 ones spill under its cap);
        # the kernel's default is 1
        hinted = len(cfg) > 4 and cfg[4] > 1
        hint = hinted and ITEMSIZE[w_dt] == 2 and ITEMSIZE[o_dt] == 2
        if full_rows(cfg, N, x_dt, w_dt) and not hinted:
            tail = ", 1, true"  # MIN_BLOCKS = 1, FULL
        else:
            tail = f", {cfg[4]}" if hint else ""
        return (f"fk::norm_fwd<{CXX[x_dt]}, {CXX[w_dt]}, {CXX[o_dt]}, {vec}, {items}, {warps}, {_b(rms)}, "
                f"{_b(plain_w)}{tail}>")
    return f"fk::norm_fwd_looped<{CXX[x_dt]}, {CXX[w_dt]}, {CXX[o_dt]}, {cfg[1]}, {_b(rms)}>"


def fwd_fp8_expr(cfg, x_dt, w_dt, fmt, rms, *, plain_w, persistent=True, N=None) -> str:
    """The FP8-output forward (fmt "e4m3" / "e5m2") for a forward config; ``persistent``: the
    grid-stride register kernel (else one row group per block, see norm_fwd_fp8); N as in fwd_expr.
    The persistent LayerNorm kernel prefetches its next row group into L2 (PREFETCH) where a group
    holds 16 KB or more: A/B 2126Z, LayerNorm -> FP8 0.826 -> 0.861 at 8192 and 0.767 -> 0.839 at 14336,
    0.871 -> 0.861 at 4096 (8 KB groups); RMSNorm lost 0-7 % with it (2110Z). Only with 16-bit weights
    and up to 80 bytes of row per thread (beyond, or with fp32 weights, it spilled)."""
    f = FMT_CXX[fmt]
    if cfg[0] == "rows":
        vec, items, warps = cfg[1:4]
        # FULL with one warp per row (warps = 1) spilled 4-16 B under the FP8 kernel's register cap
        full = persistent and full_rows(cfg, N, x_dt, w_dt) and warps >= 2
        group_bytes = rows_per_block(warps) * (N or 0) * ITEMSIZE[x_dt]
        prefetch = (persistent and not rms and ITEMSIZE[w_dt] == 2 and _row_bytes(cfg, x_dt) <= 80
                    and group_bytes >= 16384)
        if full or prefetch:
            tail = f", {_b(persistent)}, {_b(full)}, {_b(prefetch)}"
        else:
            tail = "" if persistent else ", false"
        return (f"fk::norm_fwd_fp8<{CXX[x_dt]}, {CXX[w_dt]}, {f}, {vec}, {items}, {warps}, {_b(rms)}, "
                f"{_b(plain_w)}{tail}>")
    return f"fk::norm_fwd_looped_fp8<{CXX[x_dt]}, {CXX[w_dt]}, {f}, {cfg[1]}, {_b(rms)}>"


def bwd_expr(cfg, x_dt, w_dt, rms, *, plain_w) -> str:
    """plain_w: weights given and gamma not zero-centred (the backward reads gamma without defaults)."""
    if cfg[0] in ("rows", "staged", "pair"):
        vec, items, warps = cfg[1:4]
        head = f"{CXX[x_dt]}, {CXX[w_dt]}, {vec}, {items}, {warps}, {_b(rms)}, {_b(plain_w)}"
        if cfg[0] == "rows":
            return f"fk::norm_bwd<{head}>"
        if cfg[0] == "pair":  # MERGE = 1, SPLIT = 2: the template's defaults
            tail = f", {cfg[7]}, {cfg[8]}" if cfg[8] != 2 else (f", {cfg[7]}" if cfg[7] > 1 else "")
            return f"fk::norm_bwd_staged_pair<{head}, {cfg[5]}, {_b(bool(cfg[6]))}{tail}>"
        cluster = f", {cfg[6]}" if cfg[6] > 1 else ""  # CLUSTER = 1: the template's default
        return f"fk::norm_bwd_staged<{head}, {cfg[5]}{cluster}>"
    return f"fk::norm_bwd_looped<{CXX[x_dt]}, {CXX[w_dt]}, {cfg[1]}, {_b(rms)}>"


def bwd_smem_bytes(cfg, rms: bool, N: int = 0, itemsize: int = 0) -> int:
    """Dynamic shared memory of the backward (mirrors norm_bwd / norm_bwd_staged in norms.cu).
    The staged ring (x and dy), then the dbias rows when a thread owns 32+ columns (DbiasInSmem). A
    cluster merge (staged, cluster > 1) stages 2 x rpb fp32 rows in the ring: it holds them, as
    stages >= 2 and 2-byte elements give stages x itemsize >= 4."""
    if cfg[0] == "looped":
        return 0
    vec, items, warps = cfg[1:4]
    rpb = rows_per_block(warps)
    cols = N // cfg[8] if cfg[0] == "pair" else N  # a pair's CTA stages its part of each row
    ring = cfg[4] * 2 * rpb * cols * itemsize if cfg[0] in ("staged", "pair") else 0
    return ring + (rpb * items * vec * 32 * warps * 4 if not rms and items * vec >= 32 else 0)


# column_sum's rows of threads per block (block 32 x COLSUM_LANES; 8 / 16 / 32 swept in
# sweep_norm_bwd_small_lanes_2026-12-03T1813Z.json: 32 won at every shape, RMSNorm 131072 x 1024
# backward 0.845 -> 0.898 of copy against 8).
COLSUM_LANES = 32


def colsum_expr(w_dt, lanes: int | None = None) -> str:
    return f"fk::column_sum<{CXX[w_dt]}, {lanes or COLSUM_LANES}>"


class ColumnSum:
    """The column_sum launch of a backward plan: one launch for dweight, dbias or both (their partial
    rows lie one after the other from ``part``, P x N fp32 each; blockIdx.y picks the output)."""

    __slots__ = ("fn", "lanes")

    def __init__(self, w_dt, device, lanes: int | None = None):
        self.lanes = lanes or COLSUM_LANES
        self.fn = Launcher(_jit.get_kernel(FILE, colsum_expr(w_dt, self.lanes), device).kernel, "pqipp", device)

    def launch_plan(self, N: int, n_parts: int):
        """(Launcher, grid, block) of the sum of n_parts buffers of partial rows of width N."""
        return self.fn, (-(-N // 32), n_parts), (32, self.lanes)

    def __call__(self, stream, part, P, N, outs, dependent=False) -> None:
        """outs: the output pointers present (dweight first), none of them 0; ``dependent``: launched as
        the programmatic dependent of the backward kernel just queued (fusedkit/_launch.py)."""
        if outs:
            fn, grid, block = self.launch_plan(N, len(outs))
            fn(grid, block, 0, stream, part, P, N, outs[0], outs[-1], dependent=dependent)


_logged: set = set()


def _log_config(op, expr, grid, block, smem=0):
    if _env.DEBUG >= 1 and expr not in _logged:
        _logged.add(expr)
        _env.debug(1, f"{op}: {expr} grid={grid} block={block} smem={smem}")


_fwd_plans: dict = _jit.plan_cache()


@lru_cache(maxsize=None)
def _staged_ok(device: int) -> bool:
    """Bulk copies (cp.async.bulk) exist from compute capability 9.0 (FUSEDKIT_STAGED=0 turns them off)."""
    import cupy
    return _env.STAGED and cupy.cuda.Device(device).compute_capability >= "90"


def check_covers(op: str, cfg, N: int) -> None:
    """The register-mapped kinds must hold a whole row (``_common.check_row_config``; a pair config holds
    ``split`` parts); the looped kernels take any N."""
    if cfg[0] != "looped":
        vec, items, warps = cfg[1:4]
        parts = cfg[8] if cfg[0] == "pair" else 1
        check_row_config(op, cfg, N, vec, parts * 32 * warps * items)


def _fwd_plan(N, x_dt, w_dt, o_dt, rms, device, config, max_vec, plain_w):
    cfg = config or fwd_plain_config(N, ITEMSIZE[x_dt], ITEMSIZE[o_dt], rms, max_vec)
    check_covers("norm forward", cfg, N)
    expr = fwd_expr(cfg, x_dt, w_dt, o_dt, rms, plain_w=plain_w, N=N)
    k = _jit.get_kernel(FILE, expr, device)
    if cfg[0] == "rows":  # one group of rows per block
        warps = cfg[3]
        rpb, block = rows_per_block(warps), (32 * warps, rows_per_block(warps))
    else:                 # looped: one row per block
        rpb, block = 1, (1024, 1)
    _log_config("norm_fwd", expr, f"rows/{rpb}", block)
    return Launcher(k.kernel, "ppppppppqifi", device), block, rpb


def forward(x, res, w, b, y, hsum, mean, rstd, M, N, x_dt, w_dt, o_dt, eps, zero_centered, rms,
            device, stream, config=None):
    """Pointers in (0 = absent); writes y, optional x+res (hsum), mean, rstd."""
    s, ws, os_ = ITEMSIZE[x_dt], ITEMSIZE[w_dt], ITEMSIZE[o_dt]
    max_vec = align_elems(((x, s), (res, s), (hsum, s), (y, os_), (w, ws), (b, ws)))
    plain_w = plain_weights(w, b, rms, zero_centered)
    key = (N, x_dt, w_dt, o_dt, rms, device, config, max_vec, plain_w)
    plan = _fwd_plans.get(key)
    if plan is None:
        plan = _fwd_plans[key] = _fwd_plan(N, x_dt, w_dt, o_dt, rms, device, config, max_vec, plain_w)
    fn, block, rpb = plan
    if M > 0:
        fn(-(-M // rpb), block, 0, stream_ptr(stream), x, res, w, b, y, hsum, mean, rstd, M, N, eps,
           zero_centered)


_fwd_fp8_plans: dict = _jit.plan_cache()


def _fwd_fp8_plan(N, x_dt, w_dt, fmt, rms, device, config, max_vec, plain_w, persistent):
    cfg = config or fwd_fp8_config(N, ITEMSIZE[x_dt], rms, max_vec)
    check_covers("FP8-output norm forward", cfg, N)
    expr = fwd_fp8_expr(cfg, x_dt, w_dt, fmt, rms, plain_w=plain_w, persistent=persistent, N=N)
    k = _jit.get_kernel(FILE, expr, device)
    if cfg[0] == "rows":  # persistent: grid-stride over row groups, at most the resident blocks x waves
        warps = cfg[3]
        rpb, block = rows_per_block(warps), (32 * warps, rows_per_block(warps))
        fit = sm_count(device) * blocks_per_sm(k, expr, device, block[0] * block[1], 0)
        waves = fwd_fp8_waves(N, ITEMSIZE[x_dt], rms)
        grid = f"max(1, min(rows/{rpb}, {fit} x {waves}))" if persistent else f"max(1, rows/{rpb})"
    else:  # norm_fwd_looped_fp8: one block per row
        rpb, block, fit, grid = 1, (1024, 1), None, "max(1, rows)"
    _log_config("norm_fwd_fp8", expr, grid, block)
    return Launcher(k.kernel, "pppppppppppqifi", device), block, rpb, fit


# The FP8 forward walks groups of rows grid-stride: its grid is the resident blocks (occupancy of the
# compiled kernel) times FWD_FP8_WAVES, so each block merges its amax once rather than once per row
# group. None: the non-persistent kernel instead (one group per block, the launch of the plain forward,
# 48 registers where the loop needs 63, the amax merged per warp without a barrier): within 1-2 % of
# 1 / 2 / 4 waves on the H200 (tools/sweep_fp8_grid.py, sweep_fp8_grid_2026-12-04T1630Z.json). H200,
# bf16, sweep_fp8_grid_2026-12-03T0949Z.json (None was then the persistent kernel with one group per
# block and a block merge each): RMSNorm 0.65-0.77 -> 0.76-0.83 of copy, LayerNorm 0.55-0.67 ->
# 0.62-0.70 with 4 waves (1 and 2 waves within 1-2% of it).
# FWD_FP8_MAX_GRID (None: no cap) forces a smaller grid of the persistent kernel (tests: several
# groups per block).
FWD_FP8_WAVES = 4
FWD_FP8_MAX_GRID = None
# Shapes whose sweep chose otherwise: waves per (op, N, itemsize), None = the non-persistent kernel.
# H100 sweep of 2026-12-06 (sweep_fp8_grid_H100_2026-12-06T1056Z.json, bf16, two interleaved rounds,
# fraction of copy, None against 4 waves): LayerNorm 16384 x 8192 0.927 against 0.864 (the persistent
# kernel's prefetch loop holds 64 registers at its 4-block hint, the one-group kernel 48), RMSNorm 8192
# 0.935 / 0.929, RMSNorm 14336 0.973 / 0.957 (H200 2026-12-04 agreed on both RMSNorm shapes, before the
# prefetch: 0.877 / 0.864, 0.861 / 0.860). The config sweeps of both kernels (T1105Z files, TUNED_FP8)
# then: RMSNorm 4096 0.956 / 0.942 (H200 2026-12-04 0.88-0.90 / 0.88-0.89), LayerNorm 14336 with its
# own config (7, 8) 0.971 against the persistent kernel's best 0.905. Left at 4 waves: LayerNorm 4096
# (H100 0.950 / 0.921, but every H200 sweep of 2026-12-04 read it 1-2 points slower: the cards disagree).
# LayerNorm 8192 is back on 4 waves: the H200 benchmark read it 0.86 of copy on 4 waves
# (NVIDIA-H200_2026-12-05T192907Z.json) and 0.81 with None (NVIDIA-H200_2026-12-06T233453Z.json, the
# same kernels otherwise); the H100's 6-point preference for None does not carry over.
# RMSNorm 8192 on 1 wave: the H200 sweep of 2026-12-07 (sweep_fp8_grid_H200_2026-12-07T1300Z.json, two
# rounds) read None 0.878 / 0.876, 1 wave 0.896 / 0.898, 4 waves 0.893 / 0.894; the other shapes kept
# their choice within 0.5 points (LayerNorm 4096 and 8192 on 4 waves 0.876 / 0.865, RMSNorm 4096 None
# 0.891 against 4 waves 0.895, both 14336 on None: 0.880 / 0.925).
TUNED_FP8_WAVES: dict = {("rms", 4096, 2): None, ("rms", 8192, 2): 1,
                         ("ln", 14336, 2): None, ("rms", 14336, 2): None}


def fwd_fp8_waves(N: int, itemsize: int, rms: bool):
    """Waves of resident blocks the FP8 forward's grid-stride kernel is launched with, or None for the
    non-persistent kernel (one row group per block)."""
    return TUNED_FP8_WAVES.get(("rms" if rms else "ln", N, itemsize), FWD_FP8_WAVES)


def forward_fp8(x, res, w, b, y, hsum, mean, rstd, scale, scale_inv, amax, M, N, x_dt, w_dt, fmt, eps,
                zero_centered, rms, device, stream, config=None):
    """Like ``forward`` with FP8 output: y (uint8 bytes) = sat(y32 * scale), scale read from the device
    pointer ``scale``; writes ``scale_inv`` (1 element) and merges the amax of the fp32 y into ``amax``
    (1 element, zeroed by the caller). Launched for M = 0 too (one block writes scale_inv)."""
    s, ws = ITEMSIZE[x_dt], ITEMSIZE[w_dt]
    max_vec = align_elems(((x, s), (res, s), (hsum, s), (y, 1), (w, ws), (b, ws)))
    plain_w = plain_weights(w, b, rms, zero_centered)
    waves = fwd_fp8_waves(N, s, rms)
    persistent = waves is not None or FWD_FP8_MAX_GRID is not None
    key = (N, x_dt, w_dt, fmt, rms, device, config, max_vec, plain_w, persistent)
    plan = _fwd_fp8_plans.get(key)
    if plan is None:
        plan = _fwd_fp8_plans[key] = _fwd_fp8_plan(*key)
    fn, block, rpb, fit = plan
    grid = -(-M // rpb)
    if fit is not None:  # the register kernel
        if grid >= 2**31:  # it counts row groups in 32 bits (and a grid has at most 2^31 - 1 blocks)
            raise ValueError(f"fusedkit: FP8-output norm of {M} rows of {N}: at most {2**31 * rpb - 1} rows "
                             "per call; split the leading dimension into several calls")
        for cap in (None if waves is None else fit * waves, FWD_FP8_MAX_GRID):
            if cap is not None:
                grid = min(grid, cap)
    grid = max(1, grid)
    fn(grid, block, 0, stream_ptr(stream), x, res, w, b, y, hsum, mean, rstd, scale, scale_inv,
       amax, M, N, eps, zero_centered)


_bwd_plans: dict = _jit.plan_cache()


def _bwd_plan(N, x_dt, w_dt, rms, device, config, max_vec=16, plain_w=False):
    """Everything about a backward launch that does not depend on M (cached per shape and dtypes)."""
    key = (N, x_dt, w_dt, rms, device, config, max_vec, plain_w)
    plan = _bwd_plans.get(key)
    if plan is not None:
        return plan
    itemsize = ITEMSIZE[x_dt]
    cfg = config or bwd_config(N, itemsize, rms, _staged_ok(device), max_vec)
    check_covers("norm backward", cfg, N)
    expr = bwd_expr(cfg, x_dt, w_dt, rms, plain_w=plain_w)
    k = _jit.get_kernel(FILE, expr, device)
    extra, ctas, merge = (), 1, 1
    if cfg[0] in ("rows", "staged", "pair"):
        warps = cfg[3]
        rpb = rows_per_block(warps)
        block = (32 * warps, rpb)
        threads = 32 * warps * rpb
        if cfg[0] in ("staged", "pair"):
            extra = (cfg[4],)
        if cfg[0] == "pair":  # clusters of split x merge CTAs, compiled in (__cluster_dims__)
            ctas, merge = cfg[8], cfg[7]
        elif cfg[0] == "staged":  # clusters of merge CTAs: a launch attribute
            merge = cfg[6]
    else:
        rpb, block, threads = 1, (512, 1), 512
    smem = bwd_smem_bytes(cfg, rms, N, itemsize)
    size = ctas * merge
    if size > 1:  # a cluster kernel: the driver's count of resident clusters
        clusters = _resident_clusters(k, device, block, smem, size)
        if clusters < 1:  # this GPU cannot hold one such cluster: the kernel without clusters
            _env.debug(1, f"norm_bwd: {expr} cannot launch clusters of {size} x {block[0]} threads with {smem} B "
                          f"of shared memory on device {device}; falling back")
            plan = _bwd_plan(N, x_dt, w_dt, rms, device, _without_cluster(cfg, N, itemsize, rms), max_vec, plain_w)
            _bwd_plans[key] = plan
            return plan
        fit = size * clusters
    else:
        fit = sm_count(device) * blocks_per_sm(k, expr, device, threads, smem)
    _log_config("norm_bwd", expr, f"{ctas} x min(rows/{rpb}, {fit // ctas}), cluster {size}", block, smem)
    fn = Launcher(k.kernel, "ppppppppqii" + "i" * len(extra), device, cluster=merge if cfg[0] == "staged" else 1)
    plan = _bwd_plans[key] = BwdLaunch(fn, block, smem, rpb, fit, ColumnSum(w_dt, device), extra, ctas, cfg[0],
                                       merge)
    return plan


def _without_cluster(cfg, N, itemsize, rms):
    """The fallback of a cluster config: the staged kernel with cluster 1, a pair without merge; else
    (a pair, quarters) the rule's staged config of N, else the register rows."""
    if cfg[0] == "staged":
        return cfg[:6] + (1,)
    if cfg[0] == "pair" and cfg[7] > 1 and cfg[8] == 2:  # the same half-row config, one pair per cluster
        return cfg[:7] + (1, 2)
    staged = _staged_config(N, itemsize, rms)
    if staged is not None:
        return staged[:6] + (1,)
    return _rows_config(N, itemsize, MAX_ITEMS_BWD, MAX_WARPS_BWD, "bwd", rms)


def _resident_clusters(k, device, block, smem, size) -> int:
    """Clusters of `size` CTAs of kernel k resident at once (cuOccupancyMaxActiveClusters; opts the
    kernel in to more than 48 KB of dynamic shared memory first); 0 when none fits."""
    import cupy
    if smem > 32 * 1024 and k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    with cupy.cuda.Device(device):
        return ExLaunch(k.kernel.ptr, (size, 1, 1)).max_active_clusters(block, smem)


class BwdLaunch:
    """A backward plan: the row kernel's launcher, block, shared memory, rows per block, resident
    blocks (fit), the column_sum, the extra kernel arguments (ring stages), the CTAs per row slot
    (2 for the pair kernel, whose clusters share each row), the kernel kind (the config's first
    field: "rows", "staged", "pair" or "looped") and the row slots (CTAs; pairs of the pair kernel)
    whose partial rows one cluster adds into one (merge, 1 = none)."""

    __slots__ = ("fn", "block", "smem", "rpb", "fit", "colsum", "extra", "ctas", "kind", "merge")

    def __init__(self, fn, block, smem, rpb, fit, colsum, extra, ctas, kind, merge=1):
        self.fn, self.block, self.smem, self.rpb, self.fit = fn, block, smem, rpb, fit
        self.colsum, self.extra, self.ctas, self.kind, self.merge = colsum, extra, ctas, kind, merge

    def grid(self, M: int):
        """(blocks, P) for M rows: P partial rows, one per row slot (the pair's two CTAs share one), or
        one per cluster of `merge` slots (slots: a multiple of merge; spare ones add zeros)."""
        slots = _bwd_blocks(M, self.rpb, self.fit // self.ctas)
        if self.merge > 1:
            slots = max(self.merge, slots - slots % self.merge)
            return slots * self.ctas, slots // self.merge
        return slots * self.ctas, slots * self.rpb


# Each row slot of the persistent backward walks at least this many rows, so the fp32 partial rows of
# dweight / dbias (P = blocks x rows per block, each read back by column_sum) stay at most 1/16 of the
# rows. Binds only when M < 16 x the resident slots. History: with every resident slot launched a
# 4096 x 1024 LayerNorm backward wrote 26 MB of partials against 25 MB of x, dy, dx; 4 rows per slot
# fixed that (fwd+bwd 54 -> 44-49 us); sweep_norm_bwd_small 1813Z (32-lane column_sum) then measured
# 4 / 8 / 16 / 32 rows: 16 was fastest or within 5 % at 4096 x 1024 (LayerNorm 41.2 -> 28.5 us,
# RMSNorm 28.5 -> 25.8 us), 16384 x 1024 and 4096 x 4096, and equal at 131072 x 1024.
MIN_ROWS_PER_SLOT = 16


def _bwd_blocks(M, rpb, fit) -> int:
    return max(1, min(-(-M // rpb), fit, M // (rpb * MIN_ROWS_PER_SLOT)))


def bwd_partial_rows(M, N, x_dt, w_dt, rms, device, config=None) -> int:
    """P: backward scratch is one (P, N) fp32 buffer for dweight and one for dbias (LayerNorm); the
    largest over the aligned (staged) and unaligned plans and both weight forms, for callers that size
    it before the pointers are known."""
    p = 0
    for max_vec in (16, 1):
        for plain_w in (False, True):
            p = max(p, _bwd_plan(N, x_dt, w_dt, rms, device, config, max_vec, plain_w).grid(M)[1])
    return p


def backward(dy, x, w, mean, rstd, dx, dw, db, M, N, x_dt, w_dt, zero_centered, rms, device, stream,
             alloc_f32, config=None):
    """Writes dx and, when their pointers are given, dw / db (through fp32 partial rows).

    ``alloc_f32(n)`` returns (keep-alive object, pointer) of an n-element fp32 scratch buffer.
    """
    s, ws = ITEMSIZE[x_dt], ITEMSIZE[w_dt]
    max_vec = align_elems(((dy, s), (x, s), (dx, s), (w, ws)))
    plain_w = bwd_plain_weights(w, zero_centered)
    plan = _bwd_plan(N, x_dt, w_dt, rms, device, config, max_vec, plain_w)
    nblocks, P = plan.grid(M)
    outs = [o for o in (dw, 0 if rms else db) if o]
    keep, part = (None, 0)
    if outs:  # one buffer: the dweight partial rows, then the dbias ones
        keep, part = alloc_f32(len(outs) * P * N)
    dw_part = part if dw else 0
    db_part = (part + (4 * P * N if dw else 0)) if db and not rms else 0
    sp = stream_ptr(stream)
    if M > 0:
        plan.fn(nblocks, plan.block, plan.smem, sp, dy, x, w, mean, rstd, dx, dw_part, db_part, M, N,
                zero_centered, *plan.extra)
    plan.colsum(sp, part, P if M > 0 else 0, N, outs, dependent=M > 0)
    return keep


def registers_fp8_one_group(N, x_dt, w_dt) -> bool:
    """Whether all_expressions registers the non-persistent FP8 forward (FWD_FP8_WAVES = None, e4m3)
    for this shape: the benchmark's and the GPU tests' rows, weights in the input dtype."""
    return w_dt == x_dt and x_dt in ("bfloat16", "float32") and N in (7, 781, 1024, 4096, 8192, 14336)


def all_expressions():
    """Every instantiation the library can request for the shapes it is tested and benchmarked on:
    the compile-all check builds these for each target."""
    exprs = {FILE: set()}
    Ns = (1, 7, 64, 781, 1024, 2048, 4096, 8192, 14336, 16384, 32768, 65536, 262144)
    for x_dt in ("float32", "float16", "bfloat16"):
        for w_dt in sorted({"float32", x_dt}):
            exprs[FILE].add(colsum_expr(w_dt))
            for rms in (False, True):
                for N in Ns:
                    f8 = fwd_fp8_config(N, ITEMSIZE[x_dt], rms)
                    for plain_w in (False, True):
                        for o_dt in sorted({x_dt, "float32"}):
                            fc = fwd_plain_config(N, ITEMSIZE[x_dt], ITEMSIZE[o_dt], rms)
                            exprs[FILE].add(fwd_expr(fc, x_dt, w_dt, o_dt, rms, plain_w=plain_w, N=N))
                        one_group = fwd_fp8_waves(N, ITEMSIZE[x_dt], rms) is None
                        for fmt in FMT_CXX:
                            exprs[FILE].add(fwd_fp8_expr(f8, x_dt, w_dt, fmt, rms, plain_w=plain_w,
                                                         persistent=not one_group, N=N))
                            if one_group:  # FWD_FP8_MAX_GRID (tests) forces the persistent kernel
                                exprs[FILE].add(fwd_fp8_expr(f8, x_dt, w_dt, fmt, rms, plain_w=plain_w, N=N))
                        if registers_fp8_one_group(N, x_dt, w_dt):  # FWD_FP8_WAVES = None (sweep, tests)
                            exprs[FILE].add(fwd_fp8_expr(f8, x_dt, w_dt, "e4m3", rms, plain_w=plain_w,
                                                         persistent=False, N=N))
                    for pipe, merge, split in ((False, 1, 2), (True, 1, 2), (False, 2, 2), (False, 1, 4)):
                        # pair kernels the tests force
                        pair = (pair_from_half(N, ITEMSIZE[x_dt], rms, pipe, merge, split)
                                if N in (8192, 16384) else None)
                        for plain_w in (False, True) if pair else ():
                            exprs[FILE].add(bwd_expr(pair, x_dt, w_dt, rms, plain_w=plain_w))
                    for staged in (False, True):
                        for plain_w in (False, True):
                            exprs[FILE].add(bwd_expr(bwd_config(N, ITEMSIZE[x_dt], rms, staged), x_dt, w_dt, rms,
                                                     plain_w=plain_w))
                    # the cluster-merge variants of the staged configs (tests force them; bf16 and fp32)
                    staged = _staged_config(N, ITEMSIZE[x_dt], rms) if x_dt != "float16" else None
                    for cluster in CLUSTER_CHOICES if staged else ():
                        for plain_w in (False, True):
                            exprs[FILE].add(bwd_expr(staged[:6] + (cluster,), x_dt, w_dt, rms, plain_w=plain_w))
    return {f: sorted(e) for f, e in exprs.items()}
