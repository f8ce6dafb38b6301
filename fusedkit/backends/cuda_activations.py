"""CUDA launches for the activations (kernels in cuda/activations.cu). Pointers in, no syncs."""
from __future__ import annotations

import os

from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import align_elems, launcher, vec_width  # noqa: F401 (vec_width: registry)

FILE = "activations.cu"
THREADS = 256
# Vectors per thread, all loads issued before the first use (cuda/activations.cu). The grid covers the
# tensor once. FUSEDKIT_ACT_UNROLL overrides it (tools/sweep_activations.py measures the choices).
UNROLL = int(os.environ.get("FUSEDKIT_ACT_UNROLL", "4"))
UNROLLS = (1, 2, 4, 8)  # the instantiations the compile-all check builds
ACT_ID = {"gelu_tanh": 0, "gelu_erf": 1, "silu": 2, "relu": 3, "squared_relu": 4}
GATED = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_erf": "gelu_erf", "reglu": "relu"}


def _act(kind):
    gated = kind in GATED
    return ACT_ID[GATED[kind] if gated else kind], gated


def fwd_expr(x_dt, o_dt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return f"fk::act_fwd<{CXX[x_dt]}, {CXX[o_dt]}, {a}, {'true' if g else 'false'}, {vec}, {unroll or UNROLL}>"


FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}


def fwd_fp8_expr(x_dt, fmt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return f"fk::act_fwd_fp8<{CXX[x_dt]}, {FMT_CXX[fmt]}, {a}, {'true' if g else 'false'}, {vec}, {unroll or UNROLL}>"


def bwd_expr(x_dt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return f"fk::act_bwd<{CXX[x_dt]}, {a}, {'true' if g else 'false'}, {vec}, {unroll or UNROLL}>"


def _blocks(M, H, vec, unroll=None) -> int:
    """One pass over the tensor: each block covers THREADS * unroll vectors."""
    return max(1, -(-(M * (H // vec)) // (THREADS * (unroll or UNROLL))))


def _vec(H, x_dt, ptrs_sizes):
    return vec_width(H, ITEMSIZE[x_dt], align_elems(ptrs_sizes))


def forward(x, bias, y, M, H, x_dt, o_dt, kind, device, stream):
    """y (M x H) = act(x + bias), or act(a) * g for gated kinds (x is M x 2H)."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, ITEMSIZE[o_dt])))
    launcher(FILE, fwd_expr(x_dt, o_dt, kind, vec), "pppqi", device)(
        _blocks(M, H, vec), (THREADS, 1), 0, stream_ptr(stream), x, bias, y, M, H)


def forward_fp8(x, bias, y, scale, scale_inv, amax, M, H, x_dt, fmt, kind, device, stream):
    """FP8 bytes y (M x H) = sat(act(...) * scale); amax (zeroed by the caller) and scale_inv written."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, 1)))
    launcher(FILE, fwd_fp8_expr(x_dt, fmt, kind, vec), "ppppppqi", device)(
        _blocks(M, H, vec), (THREADS, 1), 0, stream_ptr(stream), x, bias, y, scale, scale_inv, amax, M, H)


def backward(dy, x, bias, dx, M, H, x_dt, kind, device, stream):
    s = ITEMSIZE[x_dt]
    vec = _vec(H, x_dt, ((x, s), (bias, s), (dy, s), (dx, s)))
    launcher(FILE, bwd_expr(x_dt, kind, vec), "ppppqi", device)(
        _blocks(M, H, vec), (THREADS, 1), 0, stream_ptr(stream), dy, x, bias, dx, M, H)


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
    for unroll in UNROLLS:  # the sweep's alternatives, for the 16-byte bf16 forward
        for kind in ("gelu_tanh", "swiglu"):
            exprs.add(fwd_expr("bfloat16", "bfloat16", kind, 8, unroll))
    return {FILE: sorted(exprs)}
