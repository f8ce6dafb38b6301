"""CUDA launches for the activations (kernels in cuda/activations.cu). Pointers in, no syncs."""
from __future__ import annotations

from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import align_elems, grid_stride_blocks, launcher, vec_width  # noqa: F401 (vec_width: registry)

FILE = "activations.cu"
THREADS = 256
ACT_ID = {"gelu_tanh": 0, "gelu_erf": 1, "silu": 2, "relu": 3, "squared_relu": 4}
GATED = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_erf": "gelu_erf", "reglu": "relu"}


def _act(kind):
    gated = kind in GATED
    return ACT_ID[GATED[kind] if gated else kind], gated


def fwd_expr(x_dt, o_dt, kind, vec) -> str:
    a, g = _act(kind)
    return f"fk::act_fwd<{CXX[x_dt]}, {CXX[o_dt]}, {a}, {'true' if g else 'false'}, {vec}>"


FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}


def fwd_fp8_expr(x_dt, fmt, kind, vec) -> str:
    a, g = _act(kind)
    return f"fk::act_fwd_fp8<{CXX[x_dt]}, {FMT_CXX[fmt]}, {a}, {'true' if g else 'false'}, {vec}>"


def bwd_expr(x_dt, kind, vec) -> str:
    a, g = _act(kind)
    return f"fk::act_bwd<{CXX[x_dt]}, {a}, {'true' if g else 'false'}, {vec}>"


def _vec(H, x_dt, ptrs_sizes):
    return vec_width(H, ITEMSIZE[x_dt], align_elems(ptrs_sizes))


def forward(x, bias, y, M, H, x_dt, o_dt, kind, device, stream):
    """y (M x H) = act(x + bias), or act(a) * g for gated kinds (x is M x 2H)."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, ITEMSIZE[o_dt])))
    grid = grid_stride_blocks(M * (H // vec), THREADS, device)
    launcher(FILE, fwd_expr(x_dt, o_dt, kind, vec), "pppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                                x, bias, y, M, H)


def forward_fp8(x, bias, y, scale, scale_inv, amax, M, H, x_dt, fmt, kind, device, stream):
    """FP8 bytes y (M x H) = sat(act(...) * scale); amax (zeroed by the caller) and scale_inv written."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, 1)))
    grid = grid_stride_blocks(M * (H // vec), THREADS, device)
    launcher(FILE, fwd_fp8_expr(x_dt, fmt, kind, vec), "ppppppqi", device)(
        grid, (THREADS, 1), 0, stream_ptr(stream), x, bias, y, scale, scale_inv, amax, M, H)


def backward(dy, x, bias, dx, M, H, x_dt, kind, device, stream):
    s = ITEMSIZE[x_dt]
    vec = _vec(H, x_dt, ((x, s), (bias, s), (dy, s), (dx, s)))
    grid = grid_stride_blocks(M * (H // vec), THREADS, device)
    launcher(FILE, bwd_expr(x_dt, kind, vec), "ppppqi", device)(grid, (THREADS, 1), 0, stream_ptr(stream),
                                                            dy, x, bias, dx, M, H)


def all_expressions():
    exprs = set()
    for x_dt in ("float32", "float16", "bfloat16"):
        for kind in (*ACT_ID, *GATED):
            for vec in sorted({1, 16 // ITEMSIZE[x_dt]}):
                for o_dt in sorted({x_dt, "float32"}):
                    exprs.add(fwd_expr(x_dt, o_dt, kind, vec))
                for fmt in FMT_CXX:
                    exprs.add(fwd_fp8_expr(x_dt, fmt, kind, vec))
                exprs.add(bwd_expr(x_dt, kind, vec))
    return {FILE: sorted(exprs)}
