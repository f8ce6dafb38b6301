"""The one dispatch table: every op, written as data.

Each entry says which kernel file serves the op, how to pick its launch config, what it supports,
its byte model (the fewest bytes one call must move, used by benchmarks for GB/s) and its CPU
reference. The API, the tests, the benchmarks and the compile-all check read this table.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from . import reference
from ._dtypes import FLOAT_DTYPES
from .backends import cuda_activations, cuda_fp8, cuda_norms
from .backends import cuda_cross_entropy
from .backends import cuda_softmax


@dataclass(frozen=True)
class Op:
    name: str
    file: str                       # kernel family in cuda/
    config: Callable                # (N, itemsize) -> launch config tuple
    bytes_moved: Callable           # (M, N, itemsize) -> bytes one call must move
    reference: Callable             # CPU implementation with the public signature
    dtypes: tuple = FLOAT_DTYPES
    flops: Callable | None = None   # (M, N, K) -> floating-point operations of one call (GEMMs)

    def supports(self, dtype: str, N: int) -> str | None:
        """None when supported, else the reason."""
        if dtype not in self.dtypes:
            return f"{self.name} supports {', '.join(self.dtypes)}, not {dtype}"
        if not 1 <= N <= 262144:
            return f"{self.name} supports rows of 1..262144 elements, not {N}"
        return None


def _fwd_bytes(M, N, s):   # read x, write y
    return 2 * M * N * s


def _fwdbwd_bytes(M, N, s):  # forward 2MN*s + backward (read x, dy; write dx) 3MN*s
    return 5 * M * N * s


OPS = {
    "layer_norm_fwd": Op("layer_norm_fwd", cuda_norms.FILE, cuda_norms.fwd_config, _fwd_bytes,
                         reference.layer_norm),
    "layer_norm_bwd": Op("layer_norm_bwd", cuda_norms.FILE, cuda_norms.bwd_config,
                         lambda M, N, s: 3 * M * N * s, reference.layer_norm_backward),
    "layer_norm_fwdbwd": Op("layer_norm_fwdbwd", cuda_norms.FILE, cuda_norms.fwd_config, _fwdbwd_bytes,
                            reference.layer_norm),
    "rms_norm_fwd": Op("rms_norm_fwd", cuda_norms.FILE, partial(cuda_norms.fwd_config, rms=True), _fwd_bytes,
                       reference.rms_norm),
    "rms_norm_bwd": Op("rms_norm_bwd", cuda_norms.FILE, partial(cuda_norms.bwd_config, rms=True),
                       lambda M, N, s: 3 * M * N * s, reference.rms_norm_backward),
    "rms_norm_fwdbwd": Op("rms_norm_fwdbwd", cuda_norms.FILE, partial(cuda_norms.fwd_config, rms=True), _fwdbwd_bytes,
                          reference.rms_norm),
}


def _fp8_delayed_bytes(M, N, s):   # read x, write bytes (+ amax, scale_inv: negligible)
    return M * N * (s + 1)


def _fp8_current_bytes(M, N, s):   # amax pass reads x, the cast reads x again and writes bytes
    return M * N * (2 * s + 1)


def _fp8_cast_transpose_bytes(M, N, s):  # read x, write row-wise and transposed bytes
    return M * N * (s + 2)


def _fp8_dact_cast_transpose_bytes(M, N, s):  # read dy and x, write row-wise and transposed bytes
    return M * N * (2 * s + 2)


def _fp8_dgated_cast_transpose_bytes(M, H, s):  # read dy (M x H) and x (M x 2H), write 2 x 2MH bytes
    return M * H * (3 * s + 4)


def _fp8_block_bytes(block_elems, scale_size):
    """Block-scaled cast: read x, write the bytes and one scale of scale_size bytes per block."""
    return lambda M, N, s: M * N * (s + 1) + M * N // block_elems * scale_size


OPS.update({
    "fp8_quantize_delayed": Op("fp8_quantize_delayed", cuda_fp8.FILE, cuda_fp8.vec_width, _fp8_delayed_bytes,
                               reference.fp8.quantize_delayed),
    "fp8_quantize_current": Op("fp8_quantize_current", cuda_fp8.FILE, cuda_fp8.vec_width, _fp8_current_bytes,
                               reference.fp8.quantize_current),
    "fp8_cast_transpose": Op("fp8_cast_transpose", cuda_fp8.FILE, cuda_fp8.vec_width,
                             _fp8_cast_transpose_bytes, reference.fp8.quantize_delayed),
    # + dbias: the same 4MN (the fp32 partial sums, M / 512 x N x 8 bytes, are left out)
    "fp8_cast_transpose_dbias": Op("fp8_cast_transpose_dbias", cuda_fp8.FILE, cuda_fp8.vec_width,
                                   _fp8_cast_transpose_bytes, reference.fp8.cast_transpose_dbias),
    # dgelu (tanh) fused with the cast-transpose of its result: 6MN for 2-byte dy and x
    "fp8_dact_cast_transpose": Op("fp8_dact_cast_transpose", cuda_fp8.FILE, cuda_fp8.vec_width,
                                  _fp8_dact_cast_transpose_bytes, reference.fp8.dact_cast_transpose),
    # dswiglu fused with the cast-transpose of its result (N = H, dy's width; x and g are M x 2H): 10MH
    # for 2-byte dy and x
    "fp8_dswiglu_cast_transpose": Op("fp8_dswiglu_cast_transpose", cuda_fp8.FILE, cuda_fp8.vec_width,
                                     _fp8_dgated_cast_transpose_bytes, reference.fp8.dact_cast_transpose),
    # block scaling (fusedkit.quantize with MXFP8Scaling / BlockScaling): MXFP8 one E8M0 byte per 32
    # elements (along rows, or down columns), 1 x 128 and 128 x 128 one fp32 scale_inv per block
    "fp8_quantize_mxfp8": Op("fp8_quantize_mxfp8", cuda_fp8.FILE, cuda_fp8.vec_width, _fp8_block_bytes(32, 1),
                             reference.fp8.quantize_mxfp8),
    "fp8_quantize_mxfp8_cols": Op("fp8_quantize_mxfp8_cols", cuda_fp8.FILE, cuda_fp8.vec_width,
                                  _fp8_block_bytes(32, 1), reference.fp8.quantize_mxfp8_columnwise),
    "fp8_quantize_block_1x128": Op("fp8_quantize_block_1x128", cuda_fp8.FILE, cuda_fp8.vec_width,
                                   _fp8_block_bytes(128, 4), reference.fp8.quantize_blockwise),
    "fp8_quantize_block_128x128": Op("fp8_quantize_block_128x128", cuda_fp8.FILE, cuda_fp8.vec_width,
                                     _fp8_block_bytes(128 * 128, 4), reference.fp8.quantize_blockwise),
    # FP8 bytes -> the output dtype (s: its item size): read MN bytes, write MN * s
    "fp8_dequantize": Op("fp8_dequantize", cuda_fp8.DEQUANT_FILE, cuda_fp8.vec_width, _fp8_delayed_bytes,
                         reference.fp8.dequantize),
    # norms with FP8 output: read x, write FP8 bytes (3MN for 2-byte x), same byte model as the delayed cast
    "layer_norm_fp8_fwd": Op("layer_norm_fp8_fwd", cuda_norms.FILE, cuda_norms.fwd_fp8_config, _fp8_delayed_bytes,
                             reference.norms.layer_norm_fp8),
    "rms_norm_fp8_fwd": Op("rms_norm_fp8_fwd", cuda_norms.FILE, partial(cuda_norms.fwd_fp8_config, rms=True),
                           _fp8_delayed_bytes, reference.norms.rms_norm_fp8),
})

def _act_bytes(M, N, s):          # read x, write y
    return 2 * M * N * s


def _gated_bytes(M, H, s):        # read a and g (2 x M x H), write y (M x H); shape given as (M, H)
    return 3 * M * H * s


OPS.update({
    "gelu_fwd": Op("gelu_fwd", cuda_activations.FILE, cuda_activations.vec_width, _act_bytes,
                   reference.activations.forward),
    "swiglu_fwd": Op("swiglu_fwd", cuda_activations.FILE, cuda_activations.vec_width, _gated_bytes,
                     reference.activations.forward),
})


def _ce_fwdbwd_bytes(M, N, s):   # read the logits once, write the gradient once (4MN for 2-byte logits)
    return 2 * M * N * s


OPS.update({
    "cross_entropy_fwdbwd": Op("cross_entropy_fwdbwd", cuda_cross_entropy.FILE, cuda_cross_entropy.fwd_config,
                               _ce_fwdbwd_bytes, reference.cross_entropy.cross_entropy),
})


def _softmax_fwd_bytes(M, N, s):     # read x, write y (4MN for 2-byte x; a mask or causal not counted)
    return 2 * M * N * s


def _softmax_fwdbwd_bytes(M, N, s):  # forward 2MN*s + backward (read y, dy; write dx) 3MN*s = 10MN for 2 bytes
    return 5 * M * N * s


OPS.update({
    "softmax_fwd": Op("softmax_fwd", cuda_softmax.FILE, cuda_softmax.fwd_config, _softmax_fwd_bytes,
                      reference.softmax),
    "softmax_fwdbwd": Op("softmax_fwdbwd", cuda_softmax.FILE, cuda_softmax.fwd_config, _softmax_fwdbwd_bytes,
                         reference.softmax),
    # causal / masked forwards: same byte model as the plain one, so their GB/s compare directly with it
    "softmax_causal_fwd": Op("softmax_causal_fwd", cuda_softmax.FILE, cuda_softmax.fwd_config, _softmax_fwd_bytes,
                             reference.softmax),
    "softmax_masked_fwd": Op("softmax_masked_fwd", cuda_softmax.FILE, cuda_softmax.fwd_config, _softmax_fwd_bytes,
                             reference.softmax),
})

# name expressions per kernel file, for the compile-all check
KERNEL_FAMILIES = {cuda_norms.FILE: cuda_norms.all_expressions, cuda_fp8.FILE: cuda_fp8.all_expressions,
                   cuda_activations.FILE: cuda_activations.all_expressions}
KERNEL_FAMILIES[cuda_cross_entropy.FILE] = cuda_cross_entropy.all_expressions
KERNEL_FAMILIES[cuda_softmax.FILE] = cuda_softmax.all_expressions


def all_expressions() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fam in KERNEL_FAMILIES.values():
        for f, exprs in fam().items():
            out.setdefault(f, []).extend(exprs)
    return out


# FP8 GEMM (cuda/fp8_gemm_sm90.cu): shapes are (M, N, K); the byte model reads A and B once and writes a
# bf16 C (2MN); benchmarks report TFLOP/s = 2MNK / t.
from .backends import cuda_gemm  # noqa: E402
from .reference import gemm as _ref_gemm  # noqa: E402

OPS["fp8_gemm"] = Op("fp8_gemm", cuda_gemm.FILE, cuda_gemm.config, lambda M, N, K: M * K + N * K + 2 * M * N,
                     _ref_gemm.fp8_gemm, dtypes=("e4m3", "e5m2"), flops=lambda M, N, K: 2 * M * N * K)
KERNEL_FAMILIES[cuda_gemm.FILE] = cuda_gemm.all_expressions
