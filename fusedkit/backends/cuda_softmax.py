"""CUDA launches for softmax / log-softmax, forward and backward (kernels in cuda/softmax.cu).

Launch configs are a small table plus one rule (``fwd_config`` / ``bwd_config``):

* ``("rows", vec, items, warps)``: a row in the registers of ``32 * warps`` threads, ``items`` vectors
  of ``vec`` elements each (several rows per block when ``warps < 4``), as the norm forward.
* ``("cluster", vec, items, warps, C)``: sm_90+, a thread-block cluster of C CTAs per row (launched with
  a cluster attribute; C = 16 is the non-portable size, opted in per kernel), each CTA holding a
  contiguous chunk in registers; statistics merged through distributed shared memory.
* ``("staged", vec, items, warps, C[, stages])``: sm_90, unmasked forward only: the register mapping of
  ``cluster`` (C = 1: a CTA per row) in a persistent grid, each CTA's chunk of the next row arriving by a
  bulk copy into shared memory while it works on the current one (TUNED_STAGED_FWD names the shapes);
  ``stages`` (default 1, up to 4): a ring of that many buffers, so that many rows are loaded ahead.
  The backward has the same kind for y and dy (two bulk copies per row; TUNED_STAGED_BWD names the
  shapes).
* ``("looped", vec)``: one row per 512-thread block, two passes over global memory (any N).

The rule: the fewest warps (up to 16) that keep at most 2 vectors per thread, at 16 warps up to
``max_items`` vectors; if a row does not fit one block that way, the smallest cluster (2, 4, 8) that
fits it; then 32 warps per CTA; then the looped kernel. ``max_items`` is 8 for the 2-byte forward (64
elements per thread = 32 registers), 6 for the fp32 forward and 4 for the backward (y and dy). Every kernel is capped at
64 registers per thread (two 512-thread CTAs per SM) and compiles without spills (tests/test_compile_all).
"""
from __future__ import annotations

from functools import lru_cache

from .. import _env, _jit
from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import (LaunchPlan, align_elems, blocks_per_sm, check_row_config, launcher, ring_stages,
                      sm_count, stages_arg, vec_width)
from ._common import resident_clusters as _resident_clusters  # module-level: tests replace it

FILE = "softmax.cu"
MAX_ITEMS_FWD = {2: 8, 4: 6}  # by itemsize: 8 x 16 B of bf16/fp16; fp32 rows of 8 x 16 B spilled (masked, 64 regs)
MAX_ITEMS_BWD = 4
MAX_WARPS = 16
CLUSTERS = (2, 4, 8)       # portable cluster sizes (the rule's; TUNED_FWD may name 16)
LOOPED_THREADS = 512       # kSoftmaxLoopedThreads in cuda/softmax.cu

# Tuned configs (without vec) per (N, itemsize): ("rows", items, warps) or ("cluster", items, warps, C);
# tools/sweep_softmax.py on the H200, bf16, fraction of copy. sweep_softmax_2026-12-03T1448Z.json: at
# 4096 two warps x 8 vectors read 0.949 against 0.889 for the rule's 8 warps x 2 (4 x 4: 0.942); at 8192
# 4 x 8 (0.940) and 8 x 4 (0.945) are within noise; at 1024 and 16384 the rule's configs won.
# sweep_softmax_clusters16_2026-12-04T1147Z.json: at 65536 one 1024-thread CTA per row (8 vectors a
# thread, one CTA per SM) 0.866 against 0.824 for the rule's cluster of two 512-thread CTAs; at 262144
# a cluster of 16 CTAs of 256 threads 0.777 against 0.736 for 8 x 512. The backward's rule won.
TUNED_FWD: dict = {(4096, 2): ("rows", 8, 2), (8192, 2): ("rows", 4, 8), (65536, 2): ("rows", 8, 32),
                   (262144, 2): ("cluster", 8, 8, 16)}
TUNED_BWD: dict = {}
# The masked forwards' own (causal, tensor mask or both): a mask costs per-row work (the row's mask
# offset, three multiply-highs) that more elements per thread amortize. sweep_softmax_masked_2026-12-04T1207Z
# .json (bf16, (8, 16, 1024, 1024) scores, (8, 1, 1024, 1024) mask): one warp x 4 vectors per row 0.952 of
# copy (plain softmax: 0.964 in the same run's benchmark), the plain forward's 2 warps x 2 vectors 0.703.
TUNED_MASKED_FWD: dict = {(1024, 2): ("rows", 4, 1)}
# The staged forward (unmasked, sm_90, 16-byte vectors): (items, warps, C) per (N, itemsize); takes
# precedence over TUNED_FWD where it applies. STAGED_MAX_GRID (tests) caps its grid in clusters, so a
# cluster walks several rows. sweep_softmax_staged_2026-12-04T1201Z.json (bf16, fraction of copy): at
# 262144 a cluster of 8 x 512 threads reads 0.821 (the same split without staging 0.736, the best
# register config 0.777); at 65536 the best staged split, 2 x 512 threads, 0.825, lost to one
# register CTA per row (0.866), so 65536 keeps that.
TUNED_STAGED_FWD: dict = {(262144, 2): (8, 16, 8)}
# The staged backward: (items, warps, C) per (N, itemsize). The backward at 262144 read 0.82 of copy with
# any cluster split (a non-persistent grid of clusters of 8, each waiting for 8 free SMs of one GPC)
# against 0.95 at 65536; the persistent staged kernel makes its clusters resident once. Sweep
# sweep_softmax_bwd_staged_2026-12-05T1012Z.json (512 x 262144 bf16, fraction of copy): (4, 16, 16)
# 0.942 against 0.826 for the cluster kernel of the same split; (8, 16, 8) 0.926, (4, 32, 8) 0.922.
# STAGED_BWD_CANDIDATES are the configs the compile-all check builds and the sweep times first.
TUNED_STAGED_BWD: dict = {(262144, 2): (4, 16, 16)}
# Candidates of the staged forward with a deeper ring (two or three rows loaded ahead: 32 KB chunks,
# 2 x 32 KB or 3 x 32 KB of shared memory a CTA; at 65536 also 2 x 64 KB); the compile-all check builds
# them and tools/ab_staged_ring.py times them beside the shipped config.
STAGED_FWD_CANDIDATES = {262144: (("staged", 8, 8, 8, 16, 2), ("staged", 8, 4, 16, 16, 2),
                                  ("staged", 8, 4, 16, 16, 3), ("staged", 8, 8, 16, 8, 2),
                                  ("staged", 8, 4, 32, 8, 2)),
                         65536: (("staged", 8, 4, 16, 4, 2), ("staged", 8, 4, 16, 4, 3),
                                 ("staged", 8, 8, 16, 2, 2))}
STAGED_BWD_CANDIDATES = {262144: (("staged", 8, 4, 32, 8), ("staged", 8, 4, 16, 16), ("staged", 8, 8, 16, 8))}
STAGED_MAX_GRID = None

# MASKING template values (cuda/softmax.cu)
MASK_NONE, MASK_CAUSAL, MASK_TENSOR, MASK_BOTH = 0, 1, 2, 3


def _rule(N, itemsize, max_items, clusters, max_vec, tuned):
    vec = vec_width(N, itemsize, max_vec)
    t = tuned.get((N, itemsize))
    if t is not None and vec == vec_width(N, itemsize) and (t[0] == "rows" or clusters):
        return (t[0], vec) + tuple(t[1:])
    nv = N // vec
    sizes = (1,) + tuple(clusters)

    def make(c, items, warps):
        return ("rows", vec, items, warps) if c == 1 else ("cluster", vec, items, warps, c)

    for c in sizes:
        nvc = -(-nv // c)
        for warps in (1, 2, 4, 8, 16):
            items = -(-nvc // (32 * warps))
            if items <= 2 or (warps == MAX_WARPS and items <= max_items):
                return make(c, items, warps)
    for c in sizes:  # 1024-thread CTAs
        nvc = -(-nv // c)
        items = -(-nvc // 1024)
        if items <= max_items:
            return make(c, items, 32)
    return ("looped", vec)


def fwd_config(N: int, itemsize: int, clusters: bool = True, max_vec: int = 16, staged: bool = False,
               masked: bool = False):
    """Forward launch config for rows of N elements; ``clusters``: the device has thread-block
    clusters (sm_90+); ``max_vec``: the pointers' alignment in elements (align_elems); ``staged``: the
    call may take the staged kernel (unmasked, sm_90); ``masked``: a causal or tensor mask applies."""
    t = TUNED_STAGED_FWD.get((N, itemsize))
    vec = vec_width(N, itemsize, max_vec)
    if staged and not masked and clusters and t is not None and vec * itemsize == 16:
        return ("staged", vec) + tuple(t)
    tuned = {**TUNED_FWD, **TUNED_MASKED_FWD} if masked else TUNED_FWD
    return _rule(N, itemsize, MAX_ITEMS_FWD[itemsize], CLUSTERS if clusters else (), max_vec, tuned)


def bwd_config(N: int, itemsize: int, clusters: bool = True, max_vec: int = 16, staged: bool = False):
    """Backward launch config (reads y and dy: half the vectors per thread of the forward); ``staged``:
    the call may take the staged kernel (sm_90, 16-byte vectors) where TUNED_STAGED_BWD names N."""
    t = TUNED_STAGED_BWD.get((N, itemsize))
    if staged and clusters and t is not None and vec_width(N, itemsize, max_vec) * itemsize == 16:
        return ("staged", vec_width(N, itemsize, max_vec)) + tuple(t)
    return _rule(N, itemsize, MAX_ITEMS_BWD, CLUSTERS if clusters else (), max_vec, TUNED_BWD)


def rows_per_block(warps: int) -> int:
    return 4 // warps if warps < 4 else 1


def _b(v: bool) -> str:
    return "true" if v else "false"


def full_rows(cfg, N, masking) -> bool:
    """The register forward's FULL flag: an unmasked row of N fills every vector slot of the config
    (N == vec x items x 32 x warps), so the kernel may drop its per-vector bounds tests (honoured when
    cuda/softmax.cu is built with FK_SOFTMAX_FULL=1; off until measured)."""
    return (N is not None and cfg[0] == "rows" and masking == MASK_NONE
            and N == cfg[1] * cfg[2] * 32 * cfg[3])


def fwd_expr(cfg, x_dt, o_dt, log, masking, N=None) -> str:
    """N: the row length the kernel serves (the FULL flag where it fills the config; None: the general
    kernel)."""
    T, O = CXX[x_dt], CXX[o_dt]
    if cfg[0] == "rows":
        vec, items, warps = cfg[1:4]
        full = ", true" if full_rows(cfg, N, masking) else ""
        return f"fk::softmax_fwd<{T}, {O}, {vec}, {items}, {warps}, {_b(log)}, {masking}{full}>"
    if cfg[0] == "cluster":
        vec, items, warps, c = cfg[1:5]
        return f"fk::softmax_fwd_cluster<{T}, {O}, {vec}, {items}, {warps}, {c}, {_b(log)}, {masking}>"
    if cfg[0] == "staged":
        assert masking == MASK_NONE, "the staged forward has no masks"
        vec, items, warps, c = cfg[1:5]
        return (f"fk::softmax_fwd_staged<{T}, {O}, {vec}, {items}, {warps}, {c}, {_b(log)}"
                f"{stages_arg(ring_stages(cfg))}>")
    return f"fk::softmax_fwd_looped<{T}, {O}, {cfg[1]}, {_b(log)}, {masking}>"


def bwd_expr(cfg, dt, log) -> str:
    T = CXX[dt]
    if cfg[0] == "rows":
        vec, items, warps = cfg[1:4]
        return f"fk::softmax_bwd<{T}, {vec}, {items}, {warps}, {_b(log)}>"
    if cfg[0] == "cluster":
        vec, items, warps, c = cfg[1:5]
        return f"fk::softmax_bwd_cluster<{T}, {vec}, {items}, {warps}, {c}, {_b(log)}>"
    if cfg[0] == "staged":
        vec, items, warps, c = cfg[1:5]
        return (f"fk::softmax_bwd_staged<{T}, {vec}, {items}, {warps}, {c}, {_b(log)}"
                f"{stages_arg(ring_stages(cfg))}>")
    return f"fk::softmax_bwd_looped<{T}, {cfg[1]}, {_b(log)}>"


def _geometry(cfg):
    """(block, rows per block, blocks per row) of a config."""
    if cfg[0] == "rows":
        warps = cfg[3]
        rpb = rows_per_block(warps)
        return (32 * warps, rpb), rpb, 1
    if cfg[0] in ("cluster", "staged"):
        return (32 * cfg[3], 1), 1, cfg[4]
    return (LOOPED_THREADS, 1), 1, 1


def check_covers(op: str, cfg, N: int) -> None:
    """The register and staged kinds must hold a whole row (``_common.check_row_config``); the looped
    kernel takes any N."""
    if cfg[0] != "looped":
        vec, items, warps = cfg[1:4]
        c = cfg[4] if cfg[0] in ("cluster", "staged") else 1
        check_row_config(op, cfg, N, vec, c * 32 * warps * items)


def staged_smem(cfg, N, tensors: int = 1) -> int:
    """Dynamic shared memory of a staged config: a CTA's chunk of the row for each of ``tensors`` inputs
    (the forward's x; the backward's y and dy), whole 16-byte vectors, per buffer of its ring."""
    return ring_stages(cfg) * tensors * -(-(N // cfg[1]) // cfg[4]) * 16


def _grid(M, rpb, per_row) -> int:
    return -(-M // rpb) * per_row


# ----------------------------------------------------------------------------------------------------
# masks

def mask_layout(x_shape, mask_shape):
    """How the kernels read a boolean mask broadcast to ``x_shape`` (the mask C-contiguous with its own
    shape ``mask_shape``): ``(n1, n2, n3, s0, s1, s2, s3, mcol)``.

    x's leading dims (all but the last) are collapsed into at most four row-major dims n0..n3 (n0
    implicit), dims of size 1 dropped and neighbours merged whenever the mask's strides allow; s0..s3
    are the mask's strides over them in bytes (0 where the mask broadcasts). ``mcol`` is 1 when the mask
    has one byte per column, 0 when it broadcasts over the last dim. Raises ValueError when the pattern
    needs more than four dims (five or more alternations of broadcast and non-broadcast dims).
    """
    nd = len(x_shape)
    ms = (1,) * (nd - len(mask_shape)) + tuple(mask_shape)
    strides, acc = [0] * nd, 1
    for d in reversed(range(nd)):
        strides[d] = acc if ms[d] != 1 else 0
        acc *= ms[d]
    mcol = 1 if ms[-1] != 1 else 0
    dims: list = []
    for d in range(nd - 1):
        size, st = x_shape[d], strides[d]
        if size == 1:
            continue
        if dims and dims[-1][1] == st * size:   # previous dim is contiguous over this one (or both 0)
            dims[-1] = (dims[-1][0] * size, st)
        else:
            dims.append((size, st))
    if len(dims) > 4:
        raise ValueError(f"fusedkit: the mask of shape {tuple(mask_shape)} broadcasts to {tuple(x_shape)} in a "
                         f"pattern of {len(dims)} alternating dims; at most 4 are supported. Expand the mask "
                         f"over some dims (e.g. mask.expand(...).contiguous()) or reshape x")
    dims = [(1, 0)] * (4 - len(dims)) + dims
    (_, s0), (n1, s1), (n2, s2), (n3, s3) = dims
    return n1, n2, n3, s0, s1, s2, s3, mcol


def mask_offset(row, layout) -> int:
    """The byte offset of a row's mask in the kernels' arithmetic (row_mask in cuda/softmax.cu); for
    tests."""
    n1, n2, n3, s0, s1, s2, s3, _ = layout
    off, r = 0, row
    for n, s in ((n3, s3), (n2, s2), (n1, s1)):
        if n > 1:
            off += (r % n) * s
            r //= n
    return off + r * s0


NO_MASK = (1, 1, 1, 1, 0, 0, 0, 0, 0)  # (sq, n1, n2, n3, s0, s1, s2, s3, mcol)


def fast_div(d: int) -> int:
    """The kernels' parameter for dividing by ``d`` (FastDiv in cuda/common/fastdiv.cuh): ``m | l << 32``
    with ``l = ceil(log2 d)`` and ``m = floor(2**32 * (2**l - d) / d) + 1``, so that
    ``n // d == (((n * m) >> 32) + n) >> l`` for every ``0 <= n < 2**32`` (Granlund and Montgomery's
    round-up multiplier; the sum has 33 bits). ``d >= 2**32`` gives ``m = 0, l = 32`` (quotient 0, exact
    for such n). Fits the signed 64-bit parameter code ``q``."""
    d = int(d)
    if d < 1:
        raise ValueError(f"fusedkit: fast_div needs a divisor >= 1, got {d}")
    if d >= 2**32:
        return 32 << 32
    l = (d - 1).bit_length()
    m = (2**32 * (2**l - d)) // d + 1
    assert 0 < m < 2**32 and l <= 32
    return m | l << 32


@lru_cache(maxsize=256)
def _fwd_mask_args(mask_args: tuple) -> tuple:
    """``mask_args`` as the forward kernels take them: followed by fast_div of sq, n1, n2, n3."""
    return tuple(mask_args) + tuple(fast_div(d) for d in mask_args[:4])


# ----------------------------------------------------------------------------------------------------
# launches

@lru_cache(maxsize=None)
def clusters_ok(device: int) -> bool:
    """Thread-block clusters exist from compute capability 9.0."""
    import cupy
    return int(cupy.cuda.Device(device).compute_capability) >= 90


_logged: set = set()


def _log_config(op, expr, grid, block):
    if _env.DEBUG >= 1 and expr not in _logged:
        _logged.add(expr)
        _env.debug(1, f"{op}: {expr} grid={grid} block={block}")


FWD_CODES = "pppqifqqqqqqqqiqqqq"  # x, mask, y, M, N, scale, mask args (sq .. mcol), fast_div(sq, n1, n2, n3)
BWD_CODES = "pppqif"
STAGED_CODES = "ppqif"  # x, y, M, N, scale (the staged backward takes BWD_CODES)


def _launch_plan(op, cfg, expr_of, codes, device, rule, N, staged_codes=STAGED_CODES, staged_tensors=1):
    """The LaunchPlan of ``cfg``; its grid cap (resident clusters) only for the persistent staged kernels,
    else None. A config that cannot be resident here (16 CTAs need the non-portable cluster size; a
    partitioned GPU may hold fewer; the staged chunk needs its shared memory) gives way to the untuned
    rule's config with portable clusters (``rule(CLUSTERS)``), then to the one without clusters
    (``rule(())``). ``staged_codes`` / ``staged_tensors``: the staged kernel's parameter codes and staged
    inputs (forward: x; backward: y, dy)."""
    check_covers(op, cfg, N)
    for c in (cfg, rule(CLUSTERS), rule(())):
        block, rpb, per_row = _geometry(c)
        expr = expr_of(c)
        if c[0] == "staged":
            smem = staged_smem(c, N, staged_tensors)
            try:
                # (also opts the kernel in to more than 48 KB of shared memory)
                per_sm = blocks_per_sm(_jit.get_kernel(FILE, expr, device), expr, device, block[0], smem)
            except RuntimeError:
                per_sm = 0
            fn = launcher(FILE, expr, staged_codes, device, per_row)
            if per_row == 1 or not per_sm:
                cap = per_sm * sm_count(device) // per_row
            else:
                cap = _resident_clusters(fn, block, device, smem)
            if cap > 0:
                _log_config(op, expr, f"min(rows, {cap})*{per_row} (persistent)", block)
                return LaunchPlan(fn, block, rpb, per_row, smem, cap)
        else:
            fn = launcher(FILE, expr, codes, device, per_row)
            if per_row == 1 or _resident_clusters(fn, block, device) > 0:
                _log_config(op, expr, f"rows/{rpb}*{per_row}", block)
                return LaunchPlan(fn, block, rpb, per_row, 0, None)
        _env.debug(1, f"{op}: {expr} cannot be resident here; trying the next config")
    raise AssertionError("unreachable: the last config has no cluster")


_fwd_plans: dict = _jit.plan_cache()


def forward(x, mask, y, M, N, x_dt, o_dt, scale, log, masking, mask_args, device, stream, config=None):
    """y = softmax(x * scale) (log-softmax with ``log``) over rows of N; pointers in (mask 0 = none).

    ``masking``: MASK_* above; ``mask_args`` = (sq, n1, n2, n3, s0, s1, s2, s3, mcol) (NO_MASK without a
    mask; sq = the causal score matrix's rows); the kernels also get the fast_div of sq, n1, n2, n3."""
    s, os_ = ITEMSIZE[x_dt], ITEMSIZE[o_dt]
    mcol = mask_args[-1]
    max_vec = align_elems(((x, s), (y, os_), (mask if mcol else 0, 1)))
    key = (N, x_dt, o_dt, log, masking, device, config, max_vec)
    plan = _fwd_plans.get(key)
    if plan is None:
        cfg = config or fwd_config(N, s, clusters_ok(device), max_vec, staged=True, masked=masking != MASK_NONE)
        plan = _fwd_plans[key] = _launch_plan(
            "softmax_fwd", cfg, lambda c: fwd_expr(c, x_dt, o_dt, log, masking, N), FWD_CODES, device,
            lambda clusters: _rule(N, s, MAX_ITEMS_FWD[s], clusters, max_vec, {}), N)
    fn, block, rpb, per_row, smem, cap = plan
    if M > 0 and N > 0:
        sp = stream_ptr(stream)
        if cap is None:
            fn(_grid(M, rpb, per_row), block, 0, sp, x, mask, y, M, N, scale, *_fwd_mask_args(mask_args))
        else:  # the persistent staged kernels: at most one cluster per row
            fn(min(M, cap, STAGED_MAX_GRID or cap) * per_row, block, smem, sp, x, y, M, N, scale)


_bwd_plans: dict = _jit.plan_cache()


def backward(dy, y, dx, M, N, dt, scale, log, device, stream, config=None):
    """dx from dy and the forward's output y (all of dtype dt)."""
    s = ITEMSIZE[dt]
    max_vec = align_elems(((dy, s), (y, s), (dx, s)))
    key = (N, dt, log, device, config, max_vec)
    plan = _bwd_plans.get(key)
    if plan is None:
        cfg = config or bwd_config(N, s, clusters_ok(device), max_vec, staged=True)
        plan = _bwd_plans[key] = _launch_plan(
            "softmax_bwd", cfg, lambda c: bwd_expr(c, dt, log), BWD_CODES, device,
            lambda clusters: _rule(N, s, MAX_ITEMS_BWD, clusters, max_vec, {}), N,
            staged_codes=BWD_CODES, staged_tensors=2)
    fn, block, rpb, per_row, smem, cap = plan
    if M > 0 and N > 0:  # the persistent staged kernel (cap): at most the resident clusters, one per row
        grid = _grid(M, rpb, per_row) if cap is None else min(M, cap, STAGED_MAX_GRID or cap) * per_row
        fn(grid, block, smem, stream_ptr(stream), dy, y, dx, M, N, scale)


def all_expressions():
    """The instantiations the compile-all check builds for each target: every config of the tested and
    benchmarked N (with and without clusters) for the plain softmax, log-softmax and both backwards in
    each dtype; the mask variants and fp32 output at a representative subset (each name is one more
    kernel to compile on three targets, and CI has two cores)."""
    exprs = set()
    Ns = (1, 7, 781, 1024, 4096, 8192, 16384, 65536, 262144)
    for dt in ("float32", "float16", "bfloat16"):
        s = ITEMSIZE[dt]
        for N in Ns:
            for clusters in (True, False):
                fc = fwd_config(N, s, clusters)
                for log in (False, True):
                    if log and N not in (7, 1024, 4096, 65536, 262144):
                        continue
                    exprs.add(fwd_expr(fc, dt, dt, log, MASK_NONE, N))
                    exprs.add(fwd_expr(fwd_config(N, s, clusters, staged=True), dt, dt, log, MASK_NONE, N))
                    exprs.add(bwd_expr(bwd_config(N, s, clusters), dt, log))
                    exprs.add(bwd_expr(bwd_config(N, s, clusters, staged=True), dt, log))
                    if clusters and dt == "bfloat16":
                        exprs.update(bwd_expr(c, dt, log) for c in STAGED_BWD_CANDIDATES.get(N, ()))
                        exprs.update(fwd_expr(c, dt, dt, log, MASK_NONE) for c in STAGED_FWD_CANDIDATES.get(N, ()))
                if N in (7, 1024, 4096, 65536, 262144):
                    for masking in (MASK_CAUSAL, MASK_TENSOR, MASK_BOTH):
                        exprs.add(fwd_expr(fwd_config(N, s, clusters, masked=True), dt, dt, False, masking))
                if N in (781, 4096, 65536) and dt != "float32":
                    exprs.add(fwd_expr(fc, dt, "float32", False, MASK_NONE, N))
                    exprs.add(fwd_expr(fwd_config(N, s, clusters, staged=True), dt, "float32", False, MASK_NONE, N))
    return {FILE: sorted(exprs)}
