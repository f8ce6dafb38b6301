"""FP8 casts and activations on the GPU: GB/s from the byte models of fusedkit._registry and the
fraction of a device copy, measured once per class in setup_cache (same harness as bench_norms:
torch CUDA tensors when torch sees a GPU, else CuPy; skipped without a GPU). bf16 only (torch)."""
import fusedkit
from fusedkit._registry import OPS

from .bench_norms import _copy_gbps, _framework, _median_ms

CASES = {  # op -> (M, N) (N = H, the output width, for swiglu)
    "fp8_quantize_delayed": (16384, 8192),
    "fp8_quantize_current": (16384, 8192),
    "fp8_cast_transpose": (16384, 8192),
    "fp8_dequantize": (16384, 8192),
    "fp8_quantize_mxfp8": (16384, 8192),
    "fp8_quantize_mxfp8_cols": (16384, 8192),
    "fp8_quantize_block_1x128": (16384, 8192),
    "fp8_quantize_block_128x128": (16384, 8192),
    "fp8_cast_transpose_dbias": (16384, 8192),
    "fp8_dact_cast_transpose": (16384, 8192),
    "fp8_dswiglu_cast_transpose": (16384, 8192),
    "gelu_fwd": (16384, 8192),
    "swiglu_fwd": (16384, 8192),
    "layer_norm_fp8_fwd": (16384, 8192),
    "rms_norm_fp8_fwd": (16384, 8192),
}


BLOCK_RECIPES = {  # block-scaled quantize: fusedkit.quantize's keywords
    "fp8_quantize_mxfp8": lambda: dict(recipe=fusedkit.fp8.MXFP8Scaling()),
    "fp8_quantize_mxfp8_cols": lambda: dict(recipe=fusedkit.fp8.MXFP8Scaling(), columnwise=True),
    "fp8_quantize_block_1x128": lambda: dict(recipe=fusedkit.fp8.BlockScaling()),
    "fp8_quantize_block_128x128": lambda: dict(recipe=fusedkit.fp8.BlockScaling(), weight=True),
}


def _call(op, x, scale):
    if op in BLOCK_RECIPES:
        kw = BLOCK_RECIPES[op]()
        return lambda: fusedkit.quantize(x, fmt="e4m3", **kw)
    if op == "fp8_quantize_delayed":
        return lambda: fusedkit.quantize(x, fmt="e4m3", scale=scale)
    if op == "fp8_quantize_current":
        return lambda: fusedkit.quantize(x, fmt="e4m3")
    if op == "fp8_cast_transpose":
        return lambda: fusedkit.cast_transpose(x, fmt="e4m3", scale=scale)
    if op == "fp8_dequantize":   # E4M3 bytes -> bf16
        t = fusedkit.quantize(x, fmt="e4m3", scale=scale)
        return lambda: fusedkit.dequantize(t, "bfloat16")
    if op == "fp8_cast_transpose_dbias":
        return lambda: fusedkit.cast_transpose_dbias(x, fmt="e5m2", scale=scale)
    if op == "fp8_dact_cast_transpose":  # dgelu + dbias; dy a second buffer (no L2 reuse of x)
        dy = x.clone() if hasattr(x, "clone") else x.copy()
        return lambda: fusedkit.dact_cast_transpose(dy, x, activation="gelu", fmt="e5m2", scale=scale, dbias=True)
    if op == "fp8_dswiglu_cast_transpose":  # x = [a | b] (M x 2N), dy a second buffer of M x N
        half = x[:, : x.shape[1] // 2]
        dy = half.clone() if hasattr(half, "clone") else half.copy()
        return lambda: fusedkit.dact_cast_transpose(dy, x, activation="swiglu", fmt="e5m2", scale=scale)
    if op == "gelu_fwd":
        return lambda: fusedkit.gelu(x)
    if op == "layer_norm_fp8_fwd":  # no weights: the byte model counts x and the FP8 bytes only
        return lambda: fusedkit.layer_norm(x, fp8_fmt="e4m3", fp8_scale=scale)
    if op == "rms_norm_fp8_fwd":
        return lambda: fusedkit.rms_norm(x, fp8_fmt="e4m3", fp8_scale=scale)
    return lambda: fusedkit.swiglu(x)


def _measure_all():
    try:
        fw = _framework("bfloat16")
    except NotImplementedError:
        return None
    out = {"copy_gbps": _copy_gbps(fw), "gbps": {}}
    for op, (M, N) in CASES.items():
        x = fw.randn((M, 2 * N if op in ("swiglu_fwd", "fp8_dswiglu_cast_transpose") else N), "bfloat16")
        out["gbps"][op] = OPS[op].bytes_moved(M, N, 2) / _median_ms(fw, _call(op, x, 0.5)) / 1e6
        del x
    return out


class FP8AndActivationBandwidth:
    params = (list(CASES),)
    param_names = ("op",)
    timeout = 600

    def setup_cache(self):
        return _measure_all()

    def setup(self, cache, op):
        if cache is None:
            raise NotImplementedError("no CUDA GPU through torch")

    def track_gbps(self, cache, op):
        return cache["gbps"][op]

    def track_fraction_of_copy(self, cache, op):
        return cache["gbps"][op] / cache["copy_gbps"]

    track_gbps.unit = "GB/s"
    track_fraction_of_copy.unit = "fraction of copy"
