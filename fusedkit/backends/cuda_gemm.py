"""CUDA launches for the FP8 GEMM (cuda/fp8_gemm_sm90.cu): tensor maps, tile table, launch. No syncs.

The kernel takes its two TMA tensor maps by value (``const __grid_constant__``, 128 bytes, 64-byte
aligned): they are encoded on the host by ``cuda.bindings.driver.cuTensorMapEncodeTiled`` and copied into
the launch's parameter buffer, so this module launches through ``cuLaunchKernel`` with its own
parameter layout instead of ``fusedkit._launch.Launcher`` (whose codes are scalars and pointers).

Tile table (``config``): 128 x BN x 128 tiles, the ring depth filling ~192 KB of shared memory.
  * per-tensor scales, fast accumulation (use_split_accumulator=False): BN = 256 (4 stages) when that
    still gives every SM a tile, else BN = 128 (6 stages);
  * per-tensor scales with promotion every 128 K (use_split_accumulator=True) and block scaling:
    BN = 128 (6 stages): three fp32 accumulator sets per thread leave no room for BN = 256.
  * CLUSTER = 1: two-CTA clusters sharing B by TMA multicast are built and tested but ran slower at
    every issue-5 shape on the H200 (benchmarks/results/sweep_gemm_2026-12-03T0814Z.json).
  * STORE (TABLE_STORE): bf16 / FP8 outputs through shared memory and TMA tensor stores that drain
    under the next tile's main loop ("staged": rounds of 16 KB per warpgroup, split and block scaling;
    "whole": the 64 x BN slab at once with one stage fewer at BN = 256, fast accumulation); fp32 outputs
    and the other choices store column pairs per thread ("direct").
  * SCHED (TABLE_SCHED): data-parallel, except split accumulation with a last wave at most half full:
    its last one to two waves' K blocks split evenly over the grid ("sk", stream-K; a tile's two halves
    joined through global memory; ``sched``). H100 sweeps 2026-12-05: +6-18 % at the four larger
    issue-5 shapes (31.03 to 108.6 waves), -9 % at 4096^3 (7.76 waves); fast accumulation and block
    scaling tied or lost.
The kernel needs sm_90a; ``supported(device)`` says when it applies (fusedkit/fp8/gemm.py falls back to
dequantize + matmul elsewhere).
"""
from __future__ import annotations

import contextlib
import ctypes
from functools import lru_cache

from .. import _jit
from .._launch import cupy_stream
from ._common import sm_count

FILE = "fp8_gemm_sm90.cu"
BM, BK = 128, 128
THREADS = 384
FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}
OUT_CXX = {"bfloat16": "fk::bf16", "float32": "float", "e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}
MODES = {"fast": 0, "split": 1, "block": 2}
STAGES = {128: 6, 256: 4}
STORES = {"direct": 0, "staged": 1, "whole": 2}
STAGE_OUT_MAX = 16384             # cuda/fp8_gemm_sm90.cu kGemmStageOutMax: bytes per warpgroup and round
SMEM_LIMIT = 232448               # the H100 / H200 opt-in shared memory per block
OUT_BYTES = {"bfloat16": 2, "float32": 4, "e4m3": 1, "e5m2": 1}
BIAS_KIND = {None: 0, "float32": 1, "bfloat16": 2}
# operand format pairs with kernels (the others run on the fallback)
PAIRS = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"))


def out_stage_bytes(bn: int, out: str, store: str) -> int:
    """Shared memory of one consumer warpgroup's output stage (the kernel's GemmStaging::wg_bytes)."""
    if store == "direct":
        return 0
    slab = 64 * bn * OUT_BYTES[out]
    return slab if store == "whole" or slab <= STAGE_OUT_MAX else STAGE_OUT_MAX


def stages_for(bn: int, out: str = "bfloat16", store: str = "direct") -> int:
    """The ring depth: STAGES[bn], less where the output stages would not fit beside it."""
    st = STAGES[bn]
    while smem_bytes(bn, st, out, store) > SMEM_LIMIT:
        st -= 1
    return st


def smem_bytes(bn: int, stages: int, out: str = "bfloat16", store: str = "direct") -> int:
    """Dynamic shared memory of one CTA: alignment slack + the stage ring + the two consumer warpgroups'
    output stages + 2 mbarriers per stage."""
    return 1024 + stages * (BM + bn) * BK + 2 * out_stage_bytes(bn, out, store) + 2 * stages * 8


# the output store the tile table picks per mode for bf16 / FP8 outputs (fp32 outputs: always direct).
# tools/sweep_gemm.py on the H200, 2026-12-05 (sweep_gemm_stores_2026-12-05T0251Z.json), bf16 out, ratio
# to cuBLASLt at the five issue-5 shapes: fast direct 0.76-0.94 -> whole 0.96-1.03 (staged 0.91-0.98;
# whole wins at four shapes, staged by 2 % at 4096^3); split direct 0.84-0.87 -> staged 0.89-0.99; the
# fused bias + GeLU + E4M3 epilogue 0.68-0.86 -> 0.80-0.91 of plain split cuBLASLt. Block scaling
# (sweep_gemm_block_epi_stores_2026-12-05T0528Z.json): direct 0.66-0.68 -> staged 0.68-0.75 of plain
# split cuBLASLt, ahead at all five shapes.
TABLE_STORE = {"fast": "whole", "split": "staged", "block": "staged"}
# The tile walk per mode: "dp" (data-parallel, the tiles dealt round-robin to the persistent grid) or
# "sk" (the stream-K kernel: its last one to two waves split by K blocks, cuda/fp8_gemm_sm90.cu
# gemm_sk_share, where the last wave is at most SK_MAX_TAIL_FILL full; elsewhere the same kernel walks
# every tile data-parallel, "sk_notail"). With 128 x 128 tiles on 132 SMs the issue-5 shapes hold 1024
# tiles (4096^3: 7.76 waves, the last one 76 % full), 4096 (8192^3 and 16384 x 14336 x 4096: 31.03
# waves), 8192 (16384 x 8192 x 8192: 62.06) and 14336 (16384 x 4096 x 14336: 108.6, the last wave 61 %
# full). H200 sweep 1011Z: fast +1-3 %, split -7-11 % (its walker's loop had left the uniform datapath;
# fixed in GemmWalk since).
TABLE_SCHED = {"fast": "dp", "split": "sk", "block": "dp"}
# The tail is split only where the last wave is at most this full. H100 sweeps 2026-12-05 12:11Z-12:27Z
# (six runs, median ratio to cuBLASLt, split accumulation, staged bf16 stores): 8192^3 0.895 -> 0.978,
# 16384 x 14336 x 4096 0.823 -> 0.925, 16384 x 4096 x 14336 0.797 -> 0.854, 16384 x 8192 x 8192 0.824 ->
# 0.975; 4096^3 1.004 -> 0.913, so a fuller tail is not split. At 62 and 108 waves a tail is worth under
# 2 %: most of the gain was the kernel's. The H100 sweep of 17:03Z (sweep_gemm_sk_notail_H100_
# 2026-12-05T1703Z.json, staged bf16 stores, ratio to cuBLASLt) timed the stream-K kernel with no tail
# against the data-parallel one: 4096^3 0.924 -> 0.959, 8192^3 0.906 -> 1.019, 16384 x 4096 x 14336
# 0.815 -> 0.965, 16384 x 14336 x 4096 0.853 -> 0.996, 16384 x 8192 x 8192 0.845 -> 0.840 (with its tail
# 0.863); so split accumulation always launches the stream-K kernel. The fused bias + GeLU + E4M3
# epilogue tied (0.80-0.89 of plain cuBLASLt, either walk, either kernel). Fast accumulation and block
# scaling lost or tied (fast whole-tile 8192^3 1.016 -> 0.999; block 0.69 -> 0.64-0.69): "dp".
# benchmarks/results/sweep_gemm_stream_k_H100_2026-12-05T1227Z.json; not yet confirmed on the H200.
SK_MAX_TAIL_FILL = 0.5
SCHEDS = {"dp": 0, "sk": 1}

_forced: dict | None = None  # {mode: (BN, CLUSTER[, STORE[, SCHED]])} while forced_tiles() is active


@contextlib.contextmanager
def forced_tiles(fast=(256, 1), split=(128, 1), block=(128, 1)):
    """Within the block, every launch uses these (BN, CLUSTER), (BN, CLUSTER, STORE) or (BN, CLUSTER, STORE,
    SCHED) per mode instead of the tile table (tests, tools/sanitize_gemm.py and tools/sweep_gemm.py reach
    the variants the table does not pick). A STORE other than "direct" applies to bf16 and FP8 outputs;
    fp32 stays direct. SCHED "sk" applies where ``sk_split`` finds a tail to split; "sk_notail" launches
    the stream-K kernel with every tile walked data-parallel (no tail: the same arithmetic as "dp", the
    other walker's code), to tell the tail's gain from the kernel's."""
    global _forced
    saved, _forced = _forced, {"fast": fast, "split": split, "block": block}
    try:
        yield
    finally:
        _forced = saved


def config(M: int, N: int, mode: str, sms: int = 132, out: str = "bfloat16") -> tuple[int, int, int, str]:
    """(BN, STAGES, CLUSTER, STORE) for a problem: the tile table above (tools/sweep_gemm.py times every
    built variant against cuBLASLt)."""
    if _forced is not None:
        bn, cluster, *rest = _forced[mode]
        store = rest[0] if rest else "direct"
    else:
        bn = 256 if mode == "fast" and -(-M // BM) * -(-N // 256) >= sms else 128
        cluster, store = 1, TABLE_STORE[mode]
    store = _built_store(bn, out, store)
    return bn, stages_for(bn, out, store), cluster, store


def sched(mode: str, cluster: int, units: int | None = None, grid: int | None = None) -> str:
    """The tile walk of a launch: "dp", "sk" (a stream-K tail) or "sk_notail" (the stream-K kernel, every
    tile walked data-parallel), from TABLE_SCHED or the forced one; stream-K needs CLUSTER = 1. Given the
    launch's units and grid, the table splits a tail only where the last wave is at most SK_MAX_TAIL_FILL
    full, and otherwise still launches the stream-K kernel, without a tail (a forced "sk" splits wherever
    sk_split finds a tail)."""
    if _forced is not None:
        rest = _forced[mode][2:]
        want = rest[1] if len(rest) > 1 else "dp"
    else:
        want = TABLE_SCHED[mode]
        if want == "sk" and units is not None and units % grid > SK_MAX_TAIL_FILL * grid:
            want = "sk_notail"
    return want if cluster == 1 else "dp"


def sk_split(units: int, grid: int) -> int:
    """Tiles walked data-parallel before the stream-K tail: all of them (no tail) when they fill whole
    waves or no more than one; else all but the last full wave and the partial one, so the tail's R
    tiles satisfy grid < R < 2 grid (every CTA's share is at least one tile's K blocks long: a tile is
    split at most once)."""
    if units <= grid or units % grid == 0:
        return units
    return (units // grid - 1) * grid


def sk_segments(units: int, k_blocks: int, grid: int, dp_tiles: int) -> list:
    """CTA b's work, as the kernel walks it (GemmWalk in cuda/fp8_gemm_sm90.cu): its data-parallel tiles
    b, b + grid, ... below dp_tiles, then its share of the tail's flattened K blocks, as (tile, kb0, kb1)
    per CTA. For tests and for reading the schedule; the launch does not need it."""
    total = (units - dp_tiles) * k_blocks
    out = []
    for b in range(grid):
        segs = [(t, 0, k_blocks) for t in range(b, dp_tiles, grid)]
        lo, hi = b * total // grid, (b + 1) * total // grid
        u = lo
        while u < hi:
            t, kb0 = dp_tiles + u // k_blocks, u % k_blocks
            kb1 = min(k_blocks, kb0 + hi - u)
            segs.append((t, kb0, kb1))
            u += kb1 - kb0
        out.append(segs)
    return out


def _built_store(bn: int, out: str, store: str) -> str:
    """The store a kernel is built with: fp32 outputs store directly; "whole" where one round of "staged"
    already holds the slab is that same kernel."""
    if OUT_BYTES[out] > 2:
        return "direct"
    if store == "whole" and 64 * bn * OUT_BYTES[out] <= STAGE_OUT_MAX:
        return "staged"
    return store


def expr(fa: str, fb: str, bn: int, mode: str, out: str, stages: int, cluster: int = 1,
         store: str = "direct", sched: str = "dp") -> str:
    tail = f", {SCHEDS[sched]}" if sched != "dp" else ""  # SCHED defaults to GEMM_SCHED_DP
    return (f"fk::fp8_gemm_sm90<{FMT_CXX[fa]}, {FMT_CXX[fb]}, {bn}, {MODES[mode]}, {OUT_CXX[out]}, {stages}, "
            f"{cluster}, {STORES[store]}{tail}>")


# (mode, BN, CLUSTER, STORE) instantiated for every format pair and output type (staged stores: for the
# bf16 and FP8 outputs)
VARIANTS = (("fast", 256, 1, "direct"), ("fast", 128, 1, "direct"), ("split", 128, 1, "direct"),
            ("block", 128, 1, "direct"), ("fast", 256, 2, "direct"), ("split", 128, 2, "direct"),
            ("block", 128, 2, "direct"),
            ("fast", 256, 1, "staged"), ("fast", 256, 1, "whole"), ("fast", 128, 1, "staged"),
            ("split", 128, 1, "staged"), ("block", 128, 1, "staged"))


def variant_outputs(bn: int, store: str) -> tuple:
    """The output kinds a variant is built for: all with direct stores, bf16 and FP8 with staged ones,
    and with "whole" only those whose slab takes more than one round of "staged"."""
    return tuple(o for o in OUT_CXX if _built_store(bn, o, store) == store)


# The stream-K variants (E4M3 x E4M3; the table's tiles and stores per mode), built for the compile-all
# check, the tests and the sweep (sk_expressions adds the table's own stream-K kernels). Fast
# accumulation also with staged stores: in the H200 sweep 1011Z stream-K with whole-tile stores beat the
# data-parallel staged store at 16384 x 14336 x 4096 (1.028x against 1.005x cuBLASLt) but not at 8192^3
# (0.897x against 0.916x).
SK_VARIANTS = (("fast", 256, 1, "whole"), ("fast", 256, 1, "staged"), ("split", 128, 1, "staged"),
               ("block", 128, 1, "staged"), ("split", 128, 1, "direct"))


def sk_expressions() -> list:
    """The stream-K instantiations: SK_VARIANTS (E4M3 x E4M3) for every output type they are built for,
    and the table's tiles of every mode TABLE_SCHED walks stream-K, for every format pair and output."""
    exprs = [expr("e4m3", "e4m3", bn, mode, out, stages_for(bn, out, store), cluster, store, "sk")
             for mode, bn, cluster, store in SK_VARIANTS for out in variant_outputs(bn, store)]
    for mode in (m for m, walk in TABLE_SCHED.items() if walk == "sk"):
        bn = 256 if mode == "fast" else 128
        for fa, fb in PAIRS:
            for out in OUT_CXX:
                store = _built_store(bn, out, TABLE_STORE[mode])
                exprs.append(expr(fa, fb, bn, mode, out, stages_for(bn, out, store), 1, store, "sk"))
    return list(dict.fromkeys(exprs))


def all_expressions():
    exprs = []
    for fa, fb in PAIRS:
        for mode, bn, cluster, store in VARIANTS:
            for out in variant_outputs(bn, store):
                exprs.append(expr(fa, fb, bn, mode, out, stages_for(bn, out, store), cluster, store))
    return {FILE: exprs + sk_expressions()}


@lru_cache(maxsize=None)
def supported(device: int) -> bool:
    """The kernel runs on compute capability 9.0 (sm_90a: wgmma, setmaxnreg, TMA)."""
    import cupy
    return int(cupy.cuda.Device(device).compute_capability) == 90


# ----------------------------------------------------------------------------------------------------
# tensor maps

_MAP_CACHE: dict = {}
_MAP_CACHE_MAX = 256


def tensor_map(ptr: int, rows: int, K: int, box_rows: int) -> bytes:
    """The 128-byte CUtensorMap of a row-major (rows x K) uint8 operand at ``ptr``, box {128 (K), box_rows},
    128-byte swizzle, zero fill out of bounds (memoized: it only encodes address and geometry)."""
    return _tensor_map(ptr, rows, K, 1, BK, box_rows)


def out_tensor_map(ptr: int, M: int, N: int, out: str) -> bytes:
    """The CUtensorMap of the (M x N) output for staged stores: 16-bit (bf16) or 8-bit (FP8) elements, box
    {128 bytes of columns, 64 rows} (one warpgroup's rows), 128-byte swizzle; stores past the edges are
    clipped."""
    eb = OUT_BYTES[out]
    return _tensor_map(ptr, M, N, eb, 128 // eb, 64)


def _tensor_map(ptr, rows, cols, elem_bytes, box_cols, box_rows) -> bytes:
    key = (ptr, rows, cols, elem_bytes, box_cols, box_rows)
    m = _MAP_CACHE.get(key)
    if m is not None:
        return m
    try:
        m = _encode_bindings(ptr, rows, cols, box_rows, elem_bytes, box_cols)
    except ImportError:  # no cuda-bindings: the same driver call through ctypes
        m = _encode_ctypes(ptr, rows, cols, box_rows, elem_bytes, box_cols)
    if len(_MAP_CACHE) >= _MAP_CACHE_MAX:
        _MAP_CACHE.clear()
    _MAP_CACHE[key] = m
    return m


def _encode_bindings(ptr, rows, K, box_rows, elem_bytes=1, box_cols=BK) -> bytes:
    from cuda.bindings import driver as drv
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    dtype = (drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8 if elem_bytes == 1
             else drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16)
    err, tmap = drv.cuTensorMapEncodeTiled(
        dtype, 2, ptr, [u64(K), u64(rows)], [u64(K * elem_bytes)], [u32(box_cols), u32(box_rows)],
        [u32(1), u32(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"fusedkit.fp8_gemm: cuTensorMapEncodeTiled failed ({err}) for a {rows} x {K} "
                           f"matrix of {elem_bytes}-byte elements at 0x{ptr:x}")
    return ctypes.string_at(tmap.getPtr(), 128)


# cuda.h enum values (CUDA 12 / 13): UINT8 = 0, INTERLEAVE_NONE = 0, SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3,
# FLOAT_OOB_FILL_NONE = 0 (the same numbers cuda.bindings' enums carry); UINT16 = 1
_ENC = (0, 0, 3, 3, 0)
_ENC_UINT16 = 1


def _encode_ctypes(ptr, rows, K, box_rows, elem_bytes=1, box_cols=BK) -> bytes:
    from .._launch import _check, _libcuda
    lib = _libcuda()
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(K, rows)
    strides = (ctypes.c_uint64 * 1)(K * elem_bytes)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    est = (ctypes.c_uint32 * 2)(1, 1)
    dt, il, sw, l2, oob = _ENC
    if elem_bytes == 2:
        dt = _ENC_UINT16
    _check(fn(addr, dt, 2, ptr, dims, strides, box, est, il, sw, l2, oob), "cuTensorMapEncodeTiled")
    return ctypes.string_at(addr, 128)


# ----------------------------------------------------------------------------------------------------
# launch

class _Params(ctypes.Structure):
    """The kernel's parameters in declaration order (the maps 64-byte aligned, as in the kernel)."""
    _pack_ = 8
    _fields_ = [("map_a", ctypes.c_ubyte * 128), ("map_b", ctypes.c_ubyte * 128), ("map_d", ctypes.c_ubyte * 128),
                ("out", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("scale_a", ctypes.c_void_p),
                ("scale_b", ctypes.c_void_p), ("out_scale", ctypes.c_void_p), ("amax", ctypes.c_void_p),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int), ("bias_kind", ctypes.c_int),
                ("act", ctypes.c_int), ("accumulate", ctypes.c_int),
                ("dp_tiles", ctypes.c_int), ("sk_part", ctypes.c_void_p), ("sk_flag", ctypes.c_void_p),
                ("sk_epoch", ctypes.c_int)]


_ARG_OFFSETS = tuple(getattr(_Params, f[0]).offset for f in _Params._fields_)
_kernels: dict = _jit.plan_cache()


def _kernel(e: str, device: int, smem: int):
    k = _kernels.get((e, device))
    if k is None:
        k = _jit.get_kernel(FILE, e, device)
        if k.max_dynamic_shared_size_bytes < smem:  # opt in past 48 KB
            k.max_dynamic_shared_size_bytes = smem
        _kernels[(e, device)] = k
    return k


class GemmLaunch:
    """Everything a launch needs that the problem's signature decides (M, N, K, formats, mode, output,
    bias type, activation, accumulate, device): the kernel, its grid and shared memory, the tile walk,
    and the kernel parameters that are not pointers (``template``). fusedkit/_callcache.py keeps one per
    call signature; ``launch`` fills in the pointers. ``spare``: parameter blocks with their argument
    arrays, reused launch after launch (cuLaunchKernel copies the parameters before it returns; a block
    is taken off the list while it is filled, so two threads never share one)."""

    __slots__ = ("kernel", "device", "grid", "smem", "cluster", "bn", "store", "out_kind", "units", "dp_tiles",
                 "template", "spare")


def plan(M, N, K, fa, fb, mode, out_kind, bias_dtype, act, accumulate, device) -> GemmLaunch:
    """The launch of one problem through the tile table (or the forced tiles), kernel compiled and
    loaded."""
    bn, stages, cluster, store = config(M, N, mode, sm_count(device), out_kind)
    smem = smem_bytes(bn, stages, out_kind, store)
    units = -(-M // (BM * cluster)) * -(-N // bn)          # cluster work units (cluster x 1 tiles)
    grid = max(1, min(units, sm_count(device)))
    walk = sched(mode, cluster, units, grid)
    kernel_walk = "dp" if walk == "dp" else "sk"   # "sk_notail": the stream-K kernel, no tail
    k = _kernel(expr(fa, fb, bn, mode, out_kind, stages, cluster, store, kernel_walk), device, smem)
    pl = GemmLaunch()
    pl.kernel, pl.device, pl.smem, pl.cluster = k, device, smem, cluster
    pl.bn, pl.store, pl.out_kind = bn, store, out_kind
    pl.units, pl.dp_tiles = units, sk_split(units, grid) if walk == "sk" else units
    t = pl.template = _Params()
    t.M, t.N, t.K = M, N, K
    t.bias_kind, t.act, t.accumulate = BIAS_KIND[bias_dtype], act, int(bool(accumulate))
    pl.spare = []
    if cluster == 1:
        pl.grid = grid
    else:
        launch_, resident = _cluster_launch(k, cluster, smem)
        pl.grid = (launch_, cluster * max(1, min(units, resident)))
    return pl


def launch(pl: GemmLaunch, a, b, out, bias, scale_a, scale_b, out_scale, amax, stream) -> None:
    """One launch of a planned problem: ``a`` (M x K) and ``b`` (N x K) FP8 byte pointers (16-byte
    aligned), ``out`` (M x N of the plan's output type), ``scale_a`` / ``scale_b`` device fp32 pointers
    (per tensor, or the block-scale arrays in mode "block"), ``out_scale`` (FP8 outputs), ``amax`` (0 or
    a zeroed fp32), ``bias`` (0 or N values of the planned bias type), on ``stream``. The kernel's
    device must be current."""
    from cupy_backends.cuda.api import driver
    try:
        p, args = pl.spare.pop()
    except IndexError:
        p = _Params.from_buffer_copy(pl.template)
        base = ctypes.addressof(p)
        args = (ctypes.c_void_p * len(_ARG_OFFSETS))(*[base + o for o in _ARG_OFFSETS])
    t = pl.template
    ctypes.memmove(p.map_a, tensor_map(a, t.M, t.K, BM), 128)
    ctypes.memmove(p.map_b, tensor_map(b, t.N, t.K, pl.bn // pl.cluster), 128)  # a cluster's CTAs: a share each
    if pl.store != "direct":
        ctypes.memmove(p.map_d, out_tensor_map(out, t.M, t.N, pl.out_kind), 128)
    p.out, p.bias, p.scale_a, p.scale_b = out, bias or None, scale_a, scale_b
    p.out_scale, p.amax = out_scale or None, amax or None
    p.dp_tiles = pl.dp_tiles
    if pl.dp_tiles < pl.units:
        if _capturing(stream):  # a tail's workspace: outside graphs (see _capturing)
            p.dp_tiles = pl.units
        else:
            p.sk_part, p.sk_flag, p.sk_epoch = _sk_workspace(pl.device, stream, pl.grid, pl.bn)
    try:
        if pl.cluster == 1:
            driver.launchKernel(pl.kernel.kernel.ptr, pl.grid, 1, 1, THREADS, 1, 1, pl.smem, stream,
                                ctypes.addressof(args), 0)
        else:
            cl, grid = pl.grid
            cl.launch(grid, 1, (THREADS, 1, 1), pl.smem, stream, ctypes.addressof(args))
    finally:
        pl.spare.append((p, args))


def _capturing(stream: int) -> bool:
    """Whether the stream is capturing a CUDA graph (torch.cuda.graph, torch.compile's reduce-overhead
    mode, CuPy's Stream.begin_capture). A stream-K launch then splits no tail (its kernel walks every
    tile data-parallel): a tail's workspace (_sk_workspace) is a CuPy allocation made on first use,
    which a capture may forbid, and a graph replayed on two streams at once would share it. Asked only
    for launches with a tail."""
    from cupy_backends.cuda.api import runtime
    return bool(runtime.streamIsCapturing(stream))


_sk_spaces: dict = {}


def _sk_workspace(device: int, stream: int, grid: int, bn: int):
    """(partials, flags, epoch) for a stream-K launch: grid x 2 x (bn / 2) x 128 fp32 of parked tails and
    grid x 2 int flags, zeroed once and kept per (device, stream) (launches on one stream run in order;
    two streams must not share flags); the epoch counts launches (1 .. 2^31 - 1), so a flag left by a
    launch that never finished is not taken for this launch's."""
    import cupy
    key = (device, stream)
    ws = _sk_spaces.get(key)
    part_floats = grid * 2 * (bn // 2) * 128
    if ws is None or ws["part"].size < part_floats or ws["flag"].size < 2 * grid:
        with cupy.cuda.Device(device), cupy_stream(stream):  # zeroed in order before the launch
            ws = _sk_spaces[key] = {"part": cupy.empty(part_floats, cupy.float32),
                                    "flag": cupy.zeros(2 * grid, cupy.int32), "epoch": 0}
    ws["epoch"] = ws["epoch"] % (2**31 - 1) + 1
    return ws["part"].data.ptr, ws["flag"].data.ptr, ws["epoch"]


_cluster_launches: dict = _jit.plan_cache()


def _cluster_launch(k, cluster: int, smem: int):
    """(the kernel's cuLaunchKernelEx config for (cluster, 1, 1) clusters, how many such clusters fit on
    the GPU at once: the persistent grid)."""
    key = (k.kernel.ptr, cluster)
    c = _cluster_launches.get(key)
    if c is None:
        from .._launch import ExLaunch
        launch = ExLaunch(k.kernel.ptr, (cluster, 1, 1))
        resident = launch.max_active_clusters((THREADS, 1, 1), smem)
        if resident < 1:
            raise RuntimeError(f"fusedkit.fp8_gemm: no cluster of {cluster} CTAs with {smem} B of shared memory "
                               f"fits on this GPU")
        c = _cluster_launches[key] = (launch, resident)
    return c
