"""CUDA launches for FP8 quantization (kernels in cuda/fp8_cast.cu). Pointers in, no syncs."""
from __future__ import annotations

from functools import lru_cache


from .. import _jit
from .._launch import Launcher, stream_ptr
from .._dtypes import CXX, ITEMSIZE

FILE = "fp8_cast.cu"
SCALING_FILE = "fp8_scaling.cu"
FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}
THREADS = 256


def vec_width(n: int, itemsize: int) -> int:
    v = 16 // itemsize
    while v > 1 and n % v:
        v //= 2
    return v


def quantize_expr(x_dt, fmt, vec, current) -> str:
    return f"fk::fp8_quantize<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {'true' if current else 'false'}>"


def amax_expr(x_dt, vec) -> str:
    return f"fk::fp8_amax<{CXX[x_dt]}, {vec}>"


@lru_cache(maxsize=None)
def _grid_cap(device: int) -> int:
    import cupy
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"] * 8


def quantize(x, out, scale, amax_in, scale_out, scale_inv, amax_out, n, x_dt, fmt, current, eps, pow2,
             device, stream):
    """Delayed (scale = device pointer) or current scaling (amax_in: a zeroed fp32 the amax pass fills).
    ``amax_out`` must be zeroed by the caller (the kernels merge with atomicMax)."""
    vec = vec_width(n, ITEMSIZE[x_dt])
    grid = max(1, min(-(-(n // vec) // THREADS), _grid_cap(device)))
    sp = stream_ptr(stream)
    if current:
        _launcher(amax_expr(x_dt, vec), "ppq", device)(grid, (THREADS, 1), 0, sp, x, amax_in, n)
    _launcher(quantize_expr(x_dt, fmt, vec, current), "pppppppqfi", device)(
        grid, (THREADS, 1), 0, sp, x, out, scale, amax_in, scale_out, scale_inv, amax_out, n, eps, pow2)


def cast_transpose_expr(x_dt, fmt, vec, vt, current) -> str:
    return (f"fk::fp8_cast_transpose<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}, {vt}, "
            f"{'true' if current else 'false'}>")


CT_TILE = 64  # kCtTile in cuda/fp8_cast.cu


def cast_transpose(x, out, out_t, scale, amax_in, scale_out, scale_inv, amax_out, M, N, x_dt, fmt, current,
                   eps, pow2, device, stream):
    """x (M x N) -> out (M x N) and out_t (N x M) FP8 bytes; the scale arguments as in quantize."""
    n = M * N
    vec = vec_width(N, ITEMSIZE[x_dt])
    vt = 8 if M % 8 == 0 else 1
    sp = stream_ptr(stream)
    if current:
        avec = vec_width(n, ITEMSIZE[x_dt])
        grid = max(1, min(-(-(n // avec) // THREADS), _grid_cap(device)))
        _launcher(amax_expr(x_dt, avec), "ppq", device)(grid, (THREADS, 1), 0, sp, x, amax_in, n)
    fn = _launcher(cast_transpose_expr(x_dt, fmt, vec, vt, current), "ppppppppqifi", device)
    gx, gy = max(1, -(-N // CT_TILE)), max(1, -(-M // CT_TILE))
    fn((gx, gy), (THREADS, 1), 0, sp, x, out, out_t, scale, amax_in, scale_out, scale_inv,
                amax_out, M, N, eps, pow2)


def blocks_expr(x_dt, fmt, mx, vec) -> str:
    return (f"fk::fp8_quantize_blocks<{CXX[x_dt]}, {FMT_CXX[fmt]}, {32 if mx else 128}, {vec}, "
            f"{'true' if mx else 'false'}>")


def quantize_blocks(x, out, scales, M, K, x_dt, fmt, mx, device, stream):
    """Block scaling along the last dim (MXFP8 when ``mx``, else 1 x 128): bytes and per-block scales."""
    size = ITEMSIZE[x_dt]
    vec = 8 if K % 8 == 0 and x % (8 * size) == 0 else 1
    lanes = (32 if mx else 128) // 8
    threads = M * -(-K // (32 if mx else 128)) * lanes
    grid = max(1, min(-(-threads // THREADS), _grid_cap(device)))
    _launcher(blocks_expr(x_dt, fmt, mx, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                               x, out, scales, M, K)


def update_scales(history, scale, scale_inv, L, n, fp8_max, margin, most_recent, device, stream):
    """Delayed-scaling update of n tensors' (L x n) amax history, scale and scale_inv, in place."""
    key = ("fk::fp8_update_scales", device)
    fn = _launchers.get(key)
    if fn is None:
        fn = _launchers[key] = Launcher(_jit.get_kernel(SCALING_FILE, key[0], device).kernel, "pppiiffi",
                                        device)
    fn(max(1, -(-n // THREADS)), (THREADS, 1), 0, stream_ptr(stream), history, scale, scale_inv, L, n,
       fp8_max, 2.0 ** margin, int(most_recent))


def blocks_2d_expr(x_dt, fmt, vec) -> str:
    return f"fk::fp8_quantize_blocks_2d<{CXX[x_dt]}, {FMT_CXX[fmt]}, {vec}>"


def quantize_blocks_2d(x, out, scale_inv, M, K, x_dt, fmt, device, stream):
    """128 x 128 block scaling of x (M x K): bytes and one fp32 scale_inv per tile (row-major tiles)."""
    vec = 8 if K % 8 == 0 and x % (8 * ITEMSIZE[x_dt]) == 0 else 1
    grid = (-(-K // 128), -(-M // 128))
    _launcher(blocks_2d_expr(x_dt, fmt, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                              x, out, scale_inv, M, K)


_launchers: dict = {}


def _launcher(expr, codes, device) -> Launcher:
    key = (expr, device)
    fn = _launchers.get(key)
    if fn is None:
        fn = _launchers[key] = Launcher(_jit.get_kernel(FILE, expr, device).kernel, codes, device)
    return fn


def all_expressions():
    exprs = set()
    for x_dt in ("float32", "float16", "bfloat16"):
        for vec in sorted({1, vec_width(1 << 20, ITEMSIZE[x_dt])}):
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
