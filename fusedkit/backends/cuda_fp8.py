"""CUDA launches for FP8 quantization and dequantization (kernels in cuda/fp8_cast.cu, cuda/fp8_scaling.cu,
cuda/fp8_dequantize.cu). Pointers in, no syncs."""
from __future__ import annotations

import os

from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import align_elems, grid_stride_blocks, launcher, vec_width
from .cuda_activations import ACT_ID

FILE = "fp8_cast.cu"
SCALING_FILE = "fp8_scaling.cu"
DEQUANT_FILE = "fp8_dequantize.cu"
FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}
THREADS = 256
# Vectors per thread of fp8_quantize / fp8_amax's one-pass walk (cuda/fp8_cast.cu). tools/ab_unroll.py on
# an H100 (2026-12-06, benchmarks/results/ab_unroll_2026-12-06T0210Z.json, bf16, fraction of copy), the
# grid-stride loop it replaced -> 2: delayed 0.905 -> 0.957 (32768 x 4096), 0.929 -> 0.986 (16384 x 14336);
# current 0.947 -> 0.987, 0.965 -> 1.009; 4 within 0.005 of 2. FUSEDKIT_QUANT_UNROLL overrides it (A/B).
QUANT_UNROLL = int(os.environ.get("FUSEDKIT_QUANT_UNROLL") or "2")
if QUANT_UNROLL < 1:
    raise ValueError(f"FUSEDKIT_QUANT_UNROLL is the vectors per thread of the FP8 casts' walk, a positive "
                     f"integer (default 2), not {QUANT_UNROLL}: unset it or pass e.g. 2 or 4")


def quantize_expr(x_dt, fmt, vec, current) -> str:
    cur = "true" if current else "false"
    return f"fk::fp8_quantize<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {cur}, {QUANT_UNROLL}>"


def amax_expr(x_dt, vec) -> str:
    return f"fk::fp8_amax<{CXX[x_dt]}, {vec}, {QUANT_UNROLL}>"


def onepass_blocks(nvec: int, unroll: int = None) -> int:
    """Grid of a one-pass walk over nvec vectors (fp8_quantize / fp8_amax with QUANT_UNROLL, the flat
    dequantize and block-scaled walks with theirs): one chunk of unroll x THREADS vectors per block, at
    least one block (block 0 of fp8_quantize also writes scale_inv)."""
    return max(1, -(-nvec // (THREADS * (QUANT_UNROLL if unroll is None else unroll))))


def _vec(n, x, x_dt, out=0, out_size=1) -> int:
    """Vector width for n elements per row under the alignment of x (and of the FP8 output)."""
    return vec_width(n, ITEMSIZE[x_dt], align_elems(((x, ITEMSIZE[x_dt]), (out, out_size))))


def _eight_or_one(K, x, x_dt, out) -> int:
    """The block kernels' access width: 8 elements (one vector load per thread; two for fp32) when K
    and both pointers allow, else scalars."""
    return 8 if K % 8 == 0 and align_elems(((x, ITEMSIZE[x_dt]), (out, 1))) >= 8 else 1


def quantize(x, out, scale, amax_in, scale_out, scale_inv, amax_out, n, x_dt, fmt, current, eps, pow2,
             device, stream):
    """Delayed (scale = device pointer) or current scaling (amax_in: a zeroed fp32 the amax pass fills).
    ``amax_out`` must be zeroed by the caller (the kernels merge with atomicMax)."""
    vec = _vec(n, x, x_dt, out)
    grid = onepass_blocks(n // vec)
    sp = stream_ptr(stream)
    if current:
        launcher(FILE, amax_expr(x_dt, vec), "ppq", device)(grid, (THREADS, 1), 0, sp, x, amax_in, n)
    launcher(FILE, quantize_expr(x_dt, fmt, vec, current), "pppppppqfi", device)(
        grid, (THREADS, 1), 0, sp, x, out, scale, amax_in, scale_out, scale_inv, amax_out, n, eps, pow2,
        dependent=current)  # the cast waits for the amax inside (fusedkit/_launch.py)


def quantize_plan(n, x_dt, fmt, current, device):
    """The launches ``quantize`` makes for n elements of 16-byte aligned x and out: (the amax launcher
    or None, the cast launcher, the grid), for fusedkit/_callcache.py (launch_current with quantize's
    arguments)."""
    vec = _vec(n, 0, x_dt)  # aligned pointers: the widest vector n allows
    grid = onepass_blocks(n // vec)
    amax_fn = launcher(FILE, amax_expr(x_dt, vec), "ppq", device) if current else None
    return amax_fn, launcher(FILE, quantize_expr(x_dt, fmt, vec, current), "pppppppqfi", device), grid


def cast_transpose_expr(x_dt, fmt, vec, vt, current) -> str:
    return (f"fk::fp8_cast_transpose<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {vt}, "
            f"{'true' if current else 'false'}>")


CT_TILE = 64  # kCtTile in cuda/fp8_cast.cu (the fallback kernel)
FT_TILE = 128  # kFtTile: the fast kernel's block tile (fp8_ct_tile)
# Row tiles per block when fp8_ct_tile reduces dbias (partials: M / 1024 rows). 8 since the H100 A/B
# of 2026-12-06 (tools/ab_unroll.py, 3 rounds; ab_dbias_tiles_H100_2026-12-06T0837Z / T0838Z.json):
# fewer blocks, each summing more rows before its partial row and ticket, read 1 < 2 < 4 < 8 at every
# shape (0.76 / 0.81 / 0.86 / 0.87 of copy at 32768 x 4096); 16 and 32 gained 0.2-0.8 points more at
# 4096 / 8192 but lost 2-4 at 16384 x 14336 (a partial last wave of blocks). cast_transpose_dbias
# 0.855 / 0.863 / 0.882 -> 0.872 / 0.877 / 0.890, dgelu + dbias 0.848 / 0.846 / 0.857 -> 0.864 /
# 0.856 / 0.867.
DBIAS_TILES = 8
GRID_Y_MAX = 65535
# activation name -> ACT of cuda/common/act.cuh (cuda_activations.ACT_ID); "gelu" is the tanh form, as
# Transformer Engine's dgelu. Gated kinds: GATED + the inner activation's ACT (kGated in fp8_cast.cu);
# "geglu" is GeGLU with the tanh GeLU, as Transformer Engine's dgeglu.
GATED = 16
DACT_ID = {"gelu": ACT_ID["gelu_tanh"], **ACT_ID,
           "swiglu": GATED + ACT_ID["silu"], "geglu": GATED + ACT_ID["gelu_tanh"],
           "geglu_tanh": GATED + ACT_ID["gelu_tanh"], "geglu_erf": GATED + ACT_ID["gelu_erf"],
           "reglu": GATED + ACT_ID["relu"]}


def is_gated(act) -> bool:
    return act >= GATED


# The gated cast-transposes without dbias go through fp8_ct_tile's paired blocks (ACT = GATED_PAIRED +
# inner: a block covers 128 columns of dy and writes both output halves, so a, b and dy are read once,
# 6MH for 2-byte input; the per-half blocks, which dbias keeps, read a and dy twice): 0.80 -> 0.95 of
# copy (H100, 2026-12-06, tools/ab_unroll.py before the switch).
GATED_PAIRED = 32


def ct_tile_expr(x_dt, fmt, act, sums, vec) -> str:
    return (f"fk::fp8_ct_tile<{CXX[x_dt]}, {FMT_CXX[fmt]}, {act}, {'true' if sums else 'false'}, {vec}>")


def dact_values_expr(x_dt, act, vec) -> str:
    kernel = "fp8_dgated_values" if is_gated(act) else "fp8_dact_values"
    return f"fk::{kernel}<{CXX[x_dt]}, {act}, {vec}>"


def ct_fast_vec(N, ins, outs, gated=False) -> int:
    """fp8_ct_tile's load width: 8 (16-byte row loads) when N % 8 == 0 (gated: each half, N / 2), every
    input pointer is 16-byte aligned and every FP8 output 8-byte aligned; else 1 (scalar loads)."""
    ok = ((N // 2 if gated else N) % 8 == 0 and all(p % 16 == 0 for p in ins if p)
          and all(p % 8 == 0 for p in outs if p))
    return 8 if ok else 1


def ct_grid(M, N, dbias) -> tuple[int, int]:
    """fp8_ct_tile's grid: (128-column strips, blocks down the rows). With dbias the second number is
    also the row count of the fp32 partial-sum scratch, and the first the number of ticket counters."""
    m_tiles = -(-M // FT_TILE)
    gy = -(-m_tiles // DBIAS_TILES) if dbias else m_tiles
    return max(1, -(-N // FT_TILE)), max(1, min(gy, GRID_Y_MAX))


def _current_amax(x, amax_in, n, x_dt, sp, device):
    """First pass of current scaling of a plain cast: amax of x into amax_in (zeroed)."""
    avec = _vec(n, x, x_dt)
    launcher(FILE, amax_expr(x_dt, avec), "ppq", device)(
        onepass_blocks(n // avec), (THREADS, 1), 0, sp, x, amax_in, n)


def _dact_values(x, dy, amax, g, M, N, x_dt, act, sp, device):
    """g = dy * act'(x) (M x N; gated: x M x N, dy M x N / 2, g = [dy * b * act'(a) | dy * act(a)]): its
    amax into ``amax`` (zeroed) and / or g in fp32 into ``g`` (0 = not wanted)."""
    s = ITEMSIZE[x_dt]
    full = 16 // s  # the registered widths: 16-byte vectors or scalars
    n = M * N // 2 if is_gated(act) else M * N  # elements of dy: one per step and lane
    row = N // 2 if is_gated(act) else n  # a gated vector stays inside a half row
    avec = full if vec_width(row, s, align_elems(((x, s), (dy, s), (g, 4)))) == full else 1
    grid = grid_stride_blocks(n // avec, THREADS, device)
    if is_gated(act):
        launcher(FILE, dact_values_expr(x_dt, act, avec), "ppppqi", device)(
            grid, (THREADS, 1), 0, sp, x, dy, amax, g, M, N // 2)
    else:
        launcher(FILE, dact_values_expr(x_dt, act, avec), "ppppq", device)(grid, (THREADS, 1), 0, sp, x, dy, amax,
                                                                           g, n)


def cast_transpose(x, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, M, N, x_dt, fmt, current,
                   eps, pow2, device, stream):
    """x (M x N) -> out (M x N) and out_t (N x M) FP8 bytes; the scale arguments as in quantize.
    fp8_ct_tile when N % 8 == 0 and the pointers are aligned (any M), else the 64 x 64 kernel."""
    if ct_fast_vec(N, (x,), (out, out_t)) == 8:
        return cast_transpose_fused(x, 0, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, 0, 0, 0,
                                    M, N, x_dt, fmt, -1, current, eps, pow2, device, stream)
    n = M * N
    vec = _vec(N, x, x_dt, out)
    vt = 8 if M % 8 == 0 and out_t % 8 == 0 else 1
    sp = stream_ptr(stream)
    if current:
        _current_amax(x, amax_in, n, x_dt, sp, device)
    fn = launcher(FILE, cast_transpose_expr(x_dt, fmt, vec, vt, current), "ppppppppqifi", device)
    gx, gy = max(1, -(-N // CT_TILE)), max(1, -(-M // CT_TILE))
    fn((gx, gy), (THREADS, 1), 0, sp, x, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, M, N,
       eps, pow2, dependent=current)


def cast_transpose_fused(x, dy, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, dbias_part,
                         dbias_count, dbias, M, N, x_dt, fmt, act, current, eps, pow2, device, stream, g=0):
    """fp8_ct_tile: the cast of x (act = -1) or of g = dy * act'(x) (act = DACT_ID[...]), row-wise and
    transposed, optionally with dbias (column sums of the cast values). With dbias (``dbias_count``
    not 0): ``dbias_part`` an fp32 scratch of ct_grid(M, N, True)[1] x N, ``dbias_count``
    ct_grid(...)[0] zeroed uint32 ticket counters (left zeroed), ``dbias`` N values in x's dtype.
    Current scaling: amax_in (zeroed) gets the amax first. out_t must be 8-byte aligned (a fresh
    allocation). For act >= 0 where ct_fast_vec is 1, ``g`` must be an M x N fp32 scratch: g is written
    there first and cast by the fp32 kernel, whose dbias is fp32 (``dbias`` then an fp32 buffer).
    Gated kinds (is_gated(act)): M x N is the output and x's shape, dy is M x N / 2."""
    sp = stream_ptr(stream)
    with_dbias = bool(dbias_count)  # never null when dbias is asked for (part / dbias are when N = 0)
    vec = ct_fast_vec(N, (x, dy), (out, out_t), act >= 0 and is_gated(act))
    if act >= 0 and vec == 1:
        if not g and M * N:
            raise ValueError("fusedkit: this dact_cast_transpose needs an fp32 scratch for g (internal error)")
        _dact_values(x, dy, amax_in if current else 0, g, M, N, x_dt, act, sp, device)
        x, dy, x_dt, act = g, 0, "float32", -1
        vec = ct_fast_vec(N, (g,), (out, out_t))  # 8 when only the caller's views were misaligned
        sums = True
    else:
        if current:
            if act < 0:
                _current_amax(x, amax_in, M * N, x_dt, sp, device)
            else:
                _dact_values(x, dy, amax_in, 0, M, N, x_dt, act, sp, device)
        sums = with_dbias or act >= 0
    grid = ct_grid(M, N, with_dbias)
    if act >= 0 and is_gated(act) and not with_dbias:  # vec 8 here (else g went to fp32)
        act, grid = act - GATED + GATED_PAIRED, ct_grid(M, N // 2, False)
    fn = launcher(FILE, ct_tile_expr(x_dt, fmt, act, sums, vec), "ppppppppppppqifi", device)
    fn(grid, (THREADS, 1), 0, sp, x, dy, out, out_t, scale, amax_in if current else 0,
       scale_out, scale_inv, amax_out, dbias_part if with_dbias else 0, dbias_count, dbias, M, N, eps, pow2,
       dependent=current)  # after the amax pass or fp8_dact_values, whose output it waits for


# Vectors per thread of fp8_quantize_blocks' flat one-pass walk (rows of whole blocks, 8-element vectors;
# cuda/fp8_cast.cu), 0 = the grid-stride walk over whole warps that serves every other shape. 2 since the
# H100 A/B of 2026-12-06 (tools/ab_unroll.py): MXFP8 0.77 -> 0.99 of copy, 1 x 128 0.91 -> 0.99 at
# 16384 x 14336; FUSEDKIT_BLOCKS_UNROLL sets it (0 forces the grid-stride walk everywhere).
BLOCKS_UNROLL = int(os.environ.get("FUSEDKIT_BLOCKS_UNROLL") or "2")
BLOCKS_UNROLLS = (2,)   # the flat walks the compile-all check builds beside the shipped one


def blocks_expr(x_dt, fmt, mx, vec, unroll=0) -> str:
    return (f"fk::fp8_quantize_blocks<{CXX[x_dt]}, {FMT_CXX[fmt]}, {32 if mx else 128}, {vec}, "
            f"{'true' if mx else 'false'}{f', {unroll}' if unroll else ''}>")


def quantize_blocks(x, out, scales, M, K, x_dt, fmt, mx, device, stream):
    """Block scaling along the last dim (MXFP8 when ``mx``, else 1 x 128): bytes and per-block scales."""
    vec = _eight_or_one(K, x, x_dt, out)
    block = 32 if mx else 128
    unroll = BLOCKS_UNROLL if vec == 8 and K % block == 0 else 0
    if unroll:
        grid = onepass_blocks(M * K // 8, unroll)
    else:
        grid = grid_stride_blocks(M * -(-K // block) * (block // 8), THREADS, device)
    launcher(FILE, blocks_expr(x_dt, fmt, mx, vec, unroll), "pppqi", device)(
        grid, (THREADS, 1), 0, stream_ptr(stream), x, out, scales, M, K)


def mx_cols_expr(x_dt, fmt, vec) -> str:
    return f"fk::fp8_quantize_mx_cols<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}>"


def quantize_mx_columnwise(x, out, scales, M, N, x_dt, fmt, device, stream):
    """Column-wise MXFP8 of x (M x N): bytes (M x N) and E8M0 scales (ceil(M / 32) x N), each of 32 rows
    of one column."""
    c = 8 // ITEMSIZE[x_dt]  # columns per 8-byte row load
    ok = N % c == 0 and x % 8 == 0 and out % c == 0 and scales % c == 0
    vec = c if ok else 1
    grid = grid_stride_blocks(-(-M // 32) * (N // vec), THREADS, device)
    launcher(FILE, mx_cols_expr(x_dt, fmt, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                                 x, out, scales, M, N)


def update_scales(history, scale, scale_inv, L, n, fp8_max, margin, most_recent, device, stream):
    """Delayed-scaling update of n tensors' (L x n) amax history, scale and scale_inv, in place."""
    fn = launcher(SCALING_FILE, "fk::fp8_update_scales", "pppiiffi", device)
    fn(max(1, -(-n // THREADS)), (THREADS, 1), 0, stream_ptr(stream), history, scale, scale_inv, L, n,
       fp8_max, 2.0 ** margin, int(most_recent))


def blocks_2d_expr(x_dt, fmt, vec) -> str:
    return f"fk::fp8_quantize_blocks_2d<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}>"


def quantize_blocks_2d(x, out, scale_inv, M, K, x_dt, fmt, device, stream):
    """128 x 128 block scaling of x (M x K): bytes and one fp32 scale_inv per tile (row-major tiles)."""
    vec = _eight_or_one(K, x, x_dt, out)
    grid = (-(-K // 128), -(-M // 128))
    launcher(FILE, blocks_2d_expr(x_dt, fmt, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                                   x, out, scale_inv, M, K)


# An FP8Tensor's scaling -> (BR, BC, E8M0) of cuda/fp8_dequantize.cu: the scale of element (r, c) is
# scale[(r / BR) * scale_cols + c / BC] (a term left out where BR or BC is 0); E8M0 bytes or fp32.
DEQUANT_MODES = {"tensor": (0, 0, False), "mxfp8": (1, 32, True), "mxfp8_cols": (32, 1, True),
                 "block_1x128": (1, 128, False), "block_128x128": (128, 128, False)}


# Vectors per thread of the flat one-pass dequantize walk (per-tensor scale, 8-byte vectors; 0: the
# row walk, cuda/fp8_dequantize.cu, which the block-scaled modes keep). Same H100 A/B, 0 -> 2: 0.894 ->
# 0.955 of copy (32768 x 4096), 0.899 -> 0.968 (16384 x 14336), torch.compile 0.956 / 0.970 in those
# rounds (4: 0.003 below 2). FUSEDKIT_DEQUANT_UNROLL overrides it (A/B runs; 0 = the row walk).
DEQUANT_UNROLL = int(os.environ.get("FUSEDKIT_DEQUANT_UNROLL") or "2")


def dequant_unroll(vec, mode) -> int:
    """The dequantize walk of a launch: DEQUANT_UNROLL's flat walk for 8-byte vectors under a per-tensor
    scale, else the row walk (0)."""
    return DEQUANT_UNROLL if vec == 8 and mode == "tensor" else 0


def dequantize_expr(fmt, out_dt, vec, mode) -> str:
    br, bc, e8m0 = DEQUANT_MODES[mode]
    unroll = dequant_unroll(vec, mode)
    return (f"fk::fp8_dequantize<{FMT_CXX[fmt]}, {CXX[out_dt]}, {vec}, {br}, {bc}, "
            f"{'true' if e8m0 else 'false'}{f', {unroll}' if unroll else ''}>")


def dequantize(x, scale, out, rows, cols, scale_cols, fmt, out_dt, mode, device, stream):
    """FP8 bytes ``x`` (rows x cols) to ``out`` (rows x cols of out_dt): out = value x the element's scale
    (DEQUANT_MODES: a per-tensor fp32 scale_inv, MXFP8 E8M0 bytes row- or column-wise, 1 x 128 or 128 x
    128 fp32 block scales; ``scale_cols``: the scale array's row length)."""
    if rows * cols == 0:
        return
    vec = 8 if cols % 8 == 0 and x % 8 == 0 and out % 16 == 0 else 1
    unroll = dequant_unroll(vec, mode)
    if unroll:
        gx, gy = onepass_blocks(rows * cols // 8, unroll), 1
    else:
        cap = grid_stride_blocks(rows * -(-cols // vec), THREADS, device)   # resident blocks, at most
        gx = min(-(-cols // (vec * THREADS)), cap)
        gy = max(1, min(rows, 65535, cap // gx))
    launcher(DEQUANT_FILE, dequantize_expr(fmt, out_dt, vec, mode), "pppqqq", device)(
        (gx, gy), (THREADS, 1), 0, stream_ptr(stream), x, scale, out, rows, cols, scale_cols)


def all_expressions():
    exprs = set()
    for x_dt in ("float32", "float16", "bfloat16"):
        for vec in sorted({1, 16 // ITEMSIZE[x_dt]}):
            exprs.add(amax_expr(x_dt, vec))
            for act in sorted(set(DACT_ID.values())):
                exprs.add(dact_values_expr(x_dt, act, vec))
            for fmt in FMT_CXX:
                for current in (False, True):
                    exprs.add(quantize_expr(x_dt, fmt, vec, current))
                    for vt in (1, 8):
                        exprs.add(cast_transpose_expr(x_dt, fmt, vec, vt, current))
        for fmt in FMT_CXX:
            exprs.add(ct_tile_expr(x_dt, fmt, -1, False, 8))  # cast_transpose (others: the 64 x 64 kernel)
            for vec in (1, 8):  # cast_transpose_dbias (float, 1: also dact_cast_transpose's fallback)
                exprs.add(ct_tile_expr(x_dt, fmt, -1, True, vec))
            for act in sorted(set(DACT_ID.values())):
                exprs.add(ct_tile_expr(x_dt, fmt, act, True, 8))  # dact_cast_transpose (+ dbias)
                if is_gated(act):  # without dbias: the paired blocks
                    exprs.add(ct_tile_expr(x_dt, fmt, act - GATED + GATED_PAIRED, True, 8))
            for cvec in (1, 8 // ITEMSIZE[x_dt]):
                exprs.add(mx_cols_expr(x_dt, fmt, cvec))
            for bvec in (1, 8):
                exprs.add(blocks_2d_expr(x_dt, fmt, bvec))
                for mx in (False, True):
                    for unroll in (0,) + (BLOCKS_UNROLLS if bvec == 8 else ()):
                        exprs.add(blocks_expr(x_dt, fmt, mx, bvec, unroll))
    dequant = sorted({dequantize_expr(fmt, out_dt, vec, mode) for fmt in FMT_CXX for vec in (1, 8)
                      for out_dt in ("float32", "float16", "bfloat16") for mode in DEQUANT_MODES})
    return {FILE: sorted(exprs), SCALING_FILE: ["fk::fp8_update_scales"], DEQUANT_FILE: dequant}
