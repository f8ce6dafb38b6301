"""CUDA launches for FP8 quantization (kernels in cuda/fp8_cast.cu). Pointers in, no syncs."""
from __future__ import annotations

from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import align_elems, grid_stride_blocks, launcher, vec_width

FILE = "fp8_cast.cu"
SCALING_FILE = "fp8_scaling.cu"
FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}
THREADS = 256


def quantize_expr(x_dt, fmt, vec, current) -> str:
    return f"fk::fp8_quantize<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {'true' if current else 'false'}>"


def amax_expr(x_dt, vec) -> str:
    return f"fk::fp8_amax<{CXX[x_dt]}, {vec}>"


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
    grid = grid_stride_blocks(n // vec, THREADS, device)
    sp = stream_ptr(stream)
    if current:
        launcher(FILE, amax_expr(x_dt, vec), "ppq", device)(grid, (THREADS, 1), 0, sp, x, amax_in, n)
    launcher(FILE, quantize_expr(x_dt, fmt, vec, current), "pppppppqfi", device)(
        grid, (THREADS, 1), 0, sp, x, out, scale, amax_in, scale_out, scale_inv, amax_out, n, eps, pow2)


def cast_transpose_expr(x_dt, fmt, vec, vt, current) -> str:
    return (f"fk::fp8_cast_transpose<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {vt}, "
            f"{'true' if current else 'false'}>")


CT_TILE = 64  # kCtTile in cuda/fp8_cast.cu


def cast_transpose(x, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, M, N, x_dt, fmt, current,
                   eps, pow2, device, stream):
    """x (M x N) -> out (M x N) and out_t (N x M) FP8 bytes; the scale arguments as in quantize."""
    n = M * N
    vec = _vec(N, x, x_dt, out)
    vt = 8 if M % 8 == 0 and out_t % 8 == 0 else 1
    sp = stream_ptr(stream)
    if current:
        avec = _vec(n, x, x_dt)
        launcher(FILE, amax_expr(x_dt, avec), "ppq", device)(
            grid_stride_blocks(n // avec, THREADS, device), (THREADS, 1), 0, sp, x, amax_in, n)
    fn = launcher(FILE, cast_transpose_expr(x_dt, fmt, vec, vt, current), "ppppppppqifi", device)
    gx, gy = max(1, -(-N // CT_TILE)), max(1, -(-M // CT_TILE))
    fn((gx, gy), (THREADS, 1), 0, sp, x, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, M, N,
       eps, pow2)


def blocks_expr(x_dt, fmt, mx, vec) -> str:
    return (f"fk::fp8_quantize_blocks<{CXX[x_dt]}, {FMT_CXX[fmt]}, {32 if mx else 128}, {vec}, "
            f"{'true' if mx else 'false'}>")


def quantize_blocks(x, out, scales, M, K, x_dt, fmt, mx, device, stream):
    """Block scaling along the last dim (MXFP8 when ``mx``, else 1 x 128): bytes and per-block scales."""
    vec = _eight_or_one(K, x, x_dt, out)
    lanes = (32 if mx else 128) // 8
    grid = grid_stride_blocks(M * -(-K // (32 if mx else 128)) * lanes, THREADS, device)
    launcher(FILE, blocks_expr(x_dt, fmt, mx, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                                    x, out, scales, M, K)


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


def all_expressions():
    exprs = set()
    for x_dt in ("float32", "float16", "bfloat16"):
        for vec in sorted({1, 16 // ITEMSIZE[x_dt]}):
            exprs.add(amax_expr(x_dt, vec))
            for fmt in FMT_CXX:
                for current in (False, True):
                    exprs.add(quantize_expr(x_dt, fmt, vec, current))
                    for vt in (1, 8):
                        exprs.add(cast_transpose_expr(x_dt, fmt, vec, vt, current))
        for fmt in FMT_CXX:
            for bvec in (1, 8):
                exprs.add(blocks_2d_expr(x_dt, fmt, bvec))
                for mx in (False, True):
                    exprs.add(blocks_expr(x_dt, fmt, mx, bvec))
    return {FILE: sorted(exprs), SCALING_FILE: ["fk::fp8_update_scales"]}
