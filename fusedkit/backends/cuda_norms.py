"""CUDA launches for LayerNorm / RMSNorm (kernels in cuda/norms.cu).

Launch configs are small tables, not formulas scattered around: ``fwd_config`` / ``bwd_config`` pick
the vector width (16-byte accesses when N allows), the warps per row and the vectors per thread, so
that a row of up to 32 warps x 4 vectors lives in registers; longer rows take the looped kernels.
Grid sizes of the persistent backward come from the compiled kernel's occupancy.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import _env, _jit
from .._dtypes import CXX, ITEMSIZE

FILE = "norms.cu"
MAX_ITEMS_FWD = 4   # vectors of 16 B per thread (4 registers each, raw, double-buffered); 8 spills
MAX_ITEMS_BWD = 4
MAX_WARPS_FWD = 16  # 1024 threads cap registers at 64: the double-buffered row would spill
MAX_WARPS_BWD = 16  # dweight/dbias accumulators live in registers: 512 threads keep 128 regs/thread

# Tuned (items, warps) per (op, N, itemsize, direction): the winners of tools/sweep_norms.py on the H200
# for the shipped kernels (benchmarks/results/sweep_NVIDIA-H200_2026-12-02T1406Z.json, bf16). Other
# shapes use the rule in _rows_config.
TUNED: dict = {
    ("ln", 1024, 2, "fwd"): (1, 4), ("ln", 4096, 2, "fwd"): (2, 8), ("ln", 8192, 2, "fwd"): (4, 8),
    ("ln", 16384, 2, "fwd"): (4, 16),
    ("ln", 1024, 2, "bwd"): (2, 2), ("ln", 4096, 2, "bwd"): (2, 8), ("ln", 8192, 2, "bwd"): (2, 16),
    ("ln", 16384, 2, "bwd"): (4, 16),
    ("rms", 1024, 2, "fwd"): (1, 4), ("rms", 4096, 2, "fwd"): (1, 16), ("rms", 8192, 2, "fwd"): (2, 16),
    ("rms", 16384, 2, "fwd"): (4, 16),
    ("rms", 1024, 2, "bwd"): (4, 1), ("rms", 4096, 2, "bwd"): (4, 4), ("rms", 8192, 2, "bwd"): (4, 8),
    ("rms", 16384, 2, "bwd"): (4, 16),
}


def vec_width(N: int, itemsize: int) -> int:
    v = 16 // itemsize
    while N % v:
        v //= 2
    return v


def _rows_config(N, itemsize, max_items, max_warps, direction, rms):
    """Fewest warps per row that keep at most 2 vectors per thread (the sweeps in benchmarks/results
    favour more threads with less register state); at max_warps, up to max_items vectors."""
    vec = vec_width(N, itemsize)
    t = TUNED.get(("rms" if rms else "ln", N, itemsize, direction))
    if t is not None:
        return ("rows", vec) + t
    nv = N // vec
    for warps in (1, 2, 4, 8, 16, 32):
        if warps > max_warps:
            break
        items = -(-nv // (32 * warps))
        if items <= 2 or (warps == max_warps and items <= max_items):
            return ("rows", vec, items, warps)
    return ("looped", vec)


def fwd_config(N: int, itemsize: int, rms: bool = False):
    return _rows_config(N, itemsize, MAX_ITEMS_FWD, MAX_WARPS_FWD, "fwd", rms)


def bwd_config(N: int, itemsize: int, rms: bool = False):
    return _rows_config(N, itemsize, MAX_ITEMS_BWD, MAX_WARPS_BWD, "bwd", rms)


def rows_per_block(warps: int) -> int:
    return 4 // warps if warps < 4 else 1


def _b(v: bool) -> str:
    return "true" if v else "false"


def fwd_expr(cfg, x_dt, w_dt, o_dt, rms) -> str:
    if cfg[0] == "rows":
        _, vec, items, warps = cfg
        return f"fk::norm_fwd<{CXX[x_dt]}, {CXX[w_dt]}, {CXX[o_dt]}, {vec}, {items}, {warps}, {_b(rms)}>"
    return f"fk::norm_fwd_looped<{CXX[x_dt]}, {CXX[w_dt]}, {CXX[o_dt]}, {cfg[1]}, {_b(rms)}>"


def bwd_expr(cfg, x_dt, w_dt, rms) -> str:
    if cfg[0] == "rows":
        _, vec, items, warps = cfg
        return f"fk::norm_bwd<{CXX[x_dt]}, {CXX[w_dt]}, {vec}, {items}, {warps}, {_b(rms)}>"
    return f"fk::norm_bwd_looped<{CXX[x_dt]}, {CXX[w_dt]}, {cfg[1]}, {_b(rms)}>"


def bwd_smem_bytes(cfg, rms: bool) -> int:
    """Dynamic shared memory of norm_bwd: dbias accumulators when a thread owns 32+ columns
    (mirrors DB_SMEM in cuda/norms.cu)."""
    if cfg[0] != "rows" or rms:
        return 0
    _, vec, items, warps = cfg
    return rows_per_block(warps) * items * vec * 32 * warps * 4 if items * vec >= 32 else 0


def colsum_expr(w_dt) -> str:
    return f"fk::column_sum<{CXX[w_dt]}>"


@lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


_occ: dict = {}


def _blocks_per_sm(kernel, expr, device, threads, smem) -> int:
    key = (device, expr, smem)
    n = _occ.get(key)
    if n is None:
        import cupy
        if smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
        n = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, smem)
        if n < 1:
            raise RuntimeError(f"fusedkit: {expr} cannot launch {threads} threads with {smem} B of "
                               f"shared memory on device {device}")
        _occ[key] = n
    return n


_logged: set = set()


def _log_config(op, expr, grid, block):
    if _env.DEBUG >= 1 and expr not in _logged:
        _logged.add(expr)
        _env.debug(1, f"{op}: {expr} grid={grid} block={block}")


_fwd_plans: dict = {}


def _fwd_plan(N, x_dt, w_dt, o_dt, rms, device, config):
    cfg = config or fwd_config(N, ITEMSIZE[x_dt], rms)
    expr = fwd_expr(cfg, x_dt, w_dt, o_dt, rms)
    k = _jit.get_kernel(FILE, expr, device)
    if cfg[0] == "rows":  # persistent: as many blocks as fit on the GPU at once
        warps = cfg[3]
        rpb = rows_per_block(warps)
        block = (32 * warps, rpb)
        fit = _sm_count(device) * _blocks_per_sm(k, expr, device, 32 * warps * rpb, 0)
    else:
        rpb, block, fit = 0, (1024,), 0
    _log_config("norm_fwd", expr, f"min(rows/{rpb}, {fit})" if rpb else "rows", block)
    return k.kernel, block, rpb, fit


def forward(x, res, w, b, y, hsum, mean, rstd, M, N, x_dt, w_dt, o_dt, eps, zero_centered, rms,
            device, stream, config=None):
    """Pointers in (0 = absent); writes y, optional x+res (hsum), mean, rstd."""
    key = (N, x_dt, w_dt, o_dt, rms, device, config)
    plan = _fwd_plans.get(key)
    if plan is None:
        plan = _fwd_plans[key] = _fwd_plan(N, x_dt, w_dt, o_dt, rms, device, config)
    fn, block, rpb, fit = plan
    grid = (min(-(-M // rpb), fit),) if rpb else (M,)
    fn(grid, block, (x, res, w, b, y, hsum, mean, rstd, np.int64(M), np.int32(N), np.float32(eps),
                     np.int32(zero_centered)), 0, stream)


_bwd_plans: dict = {}


def _bwd_plan(N, x_dt, w_dt, rms, device, config):
    """Everything about a backward launch that does not depend on M (cached per shape and dtypes)."""
    key = (N, x_dt, w_dt, rms, device, config)
    plan = _bwd_plans.get(key)
    if plan is not None:
        return plan
    cfg = config or bwd_config(N, ITEMSIZE[x_dt], rms)
    expr = bwd_expr(cfg, x_dt, w_dt, rms)
    k = _jit.get_kernel(FILE, expr, device)
    if cfg[0] == "rows":
        warps = cfg[3]
        rpb = rows_per_block(warps)
        block = (32 * warps, rpb)
        threads = 32 * warps * rpb
    else:
        rpb, block, threads = 1, (512,), 512
    smem = bwd_smem_bytes(cfg, rms)
    fit = _sm_count(device) * _blocks_per_sm(k, expr, device, threads, smem)
    colsum = _jit.get_kernel(FILE, colsum_expr(w_dt), device).kernel
    _log_config("norm_bwd", expr, f"min(rows/{rpb}, {fit})", block)
    plan = _bwd_plans[key] = (k.kernel, block, smem, rpb, fit, colsum)
    return plan


def _bwd_blocks(M, rpb, fit) -> int:
    return min(max(1, -(-M // rpb)), fit)


def bwd_partial_rows(M, N, x_dt, w_dt, rms, device, config=None) -> int:
    """P: backward scratch is one (P, N) fp32 buffer for dweight and one for dbias (LayerNorm)."""
    _, _, _, rpb, fit, _ = _bwd_plan(N, x_dt, w_dt, rms, device, config)
    return _bwd_blocks(M, rpb, fit) * rpb


def backward(dy, x, w, mean, rstd, dx, dw, db, M, N, x_dt, w_dt, zero_centered, rms, device, stream,
             alloc_f32, config=None):
    """Writes dx and, when their pointers are given, dw / db (through fp32 partial rows).

    ``alloc_f32(n)`` returns (keep-alive object, pointer) of an n-element fp32 scratch buffer.
    """
    fn, block, smem, rpb, fit, colsum = _bwd_plan(N, x_dt, w_dt, rms, device, config)
    nblocks = _bwd_blocks(M, rpb, fit)
    P = nblocks * rpb
    keep = []
    dw_part = db_part = 0
    if dw:
        o, dw_part = alloc_f32(P * N)
        keep.append(o)
    if db and not rms:
        o, db_part = alloc_f32(P * N)
        keep.append(o)
    if M > 0:
        fn((nblocks,), block, (dy, x, w, mean, rstd, dx, dw_part, db_part, np.int64(M), np.int32(N),
                               np.int32(zero_centered)), smem, stream)
    rows = P if M > 0 else 0
    for part, out in ((dw_part, dw), (db_part, db)):
        if out:
            colsum((-(-N // 32),), (32, 8), (part, np.int64(rows), np.int32(N), out), 0, stream)
    return keep


def all_expressions():
    """Every instantiation the library can request for the shapes it is tested and benchmarked on:
    the compile-all check builds these for each target."""
    exprs = {FILE: set()}
    Ns = (1, 7, 64, 781, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144)
    for x_dt in ("float32", "float16", "bfloat16"):
        for w_dt in sorted({"float32", x_dt}):
            exprs[FILE].add(colsum_expr(w_dt))
            for rms in (False, True):
                for N in Ns:
                    fc = fwd_config(N, ITEMSIZE[x_dt], rms)
                    for o_dt in sorted({x_dt, "float32"}):
                        exprs[FILE].add(fwd_expr(fc, x_dt, w_dt, o_dt, rms))
                    exprs[FILE].add(bwd_expr(bwd_config(N, ITEMSIZE[x_dt], rms), x_dt, w_dt, rms))
    return {f: sorted(e) for f, e in exprs.items()}
