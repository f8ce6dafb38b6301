"""CUDA launches for the activations (kernels in cuda/activations.cu). Pointers in, no syncs."""
from __future__ import annotations

import os

from .._dtypes import CXX, ITEMSIZE
from .._launch import stream_ptr
from ._common import align_elems, launcher, vec_width  # noqa: F401 (vec_width: registry)

FILE = "activations.cu"
THREADS = 256
# Vectors per thread, all loads issued before the first use (cuda/activations.cu); the grid covers the
# tensor once. From tools/sweep_activations.py on the H200 (benchmarks/results/sweep_act_*1914Z.json,
# fraction of copy for UNROLL 1 / 2 / 4 / 8): gelu fwd 0.941 / 0.947 / 0.943 / 0.743 (32768 x 4096),
# swiglu fwd 1.022 / 0.916 / 0.683 / 0.399, swiglu bwd 0.981 / 0.881 / 0.807 / 0.545 (more registers,
# fewer resident warps). FUSEDKIT_ACT_UNROLL (or setting UNROLL) overrides the table.
UNROLL_TABLE = {("fwd", False): 2, ("fwd", True): 1, ("bwd", False): 1, ("bwd", True): 1}  # (dir, gated)
UNROLL = int(os.environ["FUSEDKIT_ACT_UNROLL"]) if os.environ.get("FUSEDKIT_ACT_UNROLL") else None
UNROLLS = (1, 2, 4, 8)  # the sweep's alternatives (the compile-all check builds them)


def unroll_for(direction: str, kind: str) -> int:
    return UNROLL or UNROLL_TABLE[(direction, kind in GATED)]
ACT_ID = {"gelu_tanh": 0, "gelu_erf": 1, "silu": 2, "relu": 3, "squared_relu": 4}
GATED = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_erf": "gelu_erf", "reglu": "relu"}


def _act(kind):
    gated = kind in GATED
    return ACT_ID[GATED[kind] if gated else kind], gated


def fwd_expr(x_dt, o_dt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return f"fk::act_fwd<{CXX[x_dt]}, {CXX[o_dt]}, {a}, {'true' if g else 'false'}, {vec}, {unroll or unroll_for('fwd', kind)}>"


FMT_CXX = {"e4m3": "fk::E4M3", "e5m2": "fk::E5M2"}


def fwd_fp8_expr(x_dt, fmt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return (f"fk::act_fwd_fp8<{CXX[x_dt]}, {FMT_CXX[fmt]}, {a}, {'true' if g else 'false'}, {vec}, "
            f"{unroll or unroll_for('fwd', kind)}>")


def bwd_expr(x_dt, kind, vec, unroll=None) -> str:
    a, g = _act(kind)
    return f"fk::act_bwd<{CXX[x_dt]}, {a}, {'true' if g else 'false'}, {vec}, {unroll or unroll_for('bwd', kind)}>"


def _blocks(M, H, vec, unroll) -> int:
    """One pass over the tensor: each block covers THREADS * unroll vectors."""
    return max(1, -(-(M * (H // vec)) // (THREADS * unroll)))


def _vec(H, x_dt, ptrs_sizes):
    return vec_width(H, ITEMSIZE[x_dt], align_elems(ptrs_sizes))


def forward(x, bias, y, M, H, x_dt, o_dt, kind, device, stream):
    """y (M x H) = act(x + bias), or act(a) * g for gated kinds (x is M x 2H)."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, ITEMSIZE[o_dt])))
    u = unroll_for("fwd", kind)
    launcher(FILE, fwd_expr(x_dt, o_dt, kind, vec, u), "pppqi", device)(
        _blocks(M, H, vec, u), (THREADS, 1), 0, stream_ptr(stream), x, bias, y, M, H)


def forward_fp8(x, bias, y, scale, scale_inv, amax, M, H, x_dt, fmt, kind, device, stream):
    """FP8 bytes y (M x H) = sat(act(...) * scale); amax (zeroed by the caller) and scale_inv written."""
    vec = _vec(H, x_dt, ((x, ITEMSIZE[x_dt]), (bias, ITEMSIZE[x_dt]), (y, 1)))
    u = unroll_for("fwd", kind)
    launcher(FILE, fwd_fp8_expr(x_dt, fmt, kind, vec, u), "ppppppqi", device)(
        _blocks(M, H, vec, u), (THREADS, 1), 0, stream_ptr(stream), x, bias, y, scale, scale_inv, amax, M, H)


def backward(dy, x, bias, dx, M, H, x_dt, kind, device, stream):
    s = ITEMSIZE[x_dt]
    vec = _vec(H, x_dt, ((x, s), (bias, s), (dy, s), (dx, s)))
    u = unroll_for("bwd", kind)
    launcher(FILE, bwd_expr(x_dt, kind, vec, u), "ppppqi", device)(
        _blocks(M, H, vec, u), (THREADS, 1), 0, stream_ptr(stream), dy, x, bias, dx, M, H)


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
    for unroll in UNROLLS:  # the sweep's alternatives, for the 16-byte bf16 kernels it times
        for kind in ("gelu_tanh", "swiglu"):
            exprs.add(fwd_expr("bfloat16", "bfloat16", kind, 8, unroll))
        exprs.add(bwd_expr("bfloat16", "swiglu", 8, unroll))
    return {FILE: sorted(exprs)}
