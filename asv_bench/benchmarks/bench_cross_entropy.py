"""Fused cross-entropy on the GPU: GB/s from the byte model of fusedkit._registry (cross_entropy_fwdbwd:
read the bf16 logits once, write the gradient once = 4MN) and the fraction of a device copy, measured
once in setup_cache (same harness as bench_norms: CUDA events, L2 flushed, median; torch CUDA tensors,
since CuPy has no bfloat16; skipped without a GPU). Mean reduction, gradient out of place and in place,
no ignored targets (ignored rows are not read, which the byte model would not count)."""
import fusedkit
from fusedkit._registry import OPS

from .bench_norms import _copy_gbps, _median_ms, _Torch

SHAPES = [(16384, 32768), (8192, 131072), (4096, 262144)]  # (tokens, vocab), issue 3


def _measure_all():
    try:
        fw = _Torch()
    except (ImportError, NotImplementedError):
        return None
    torch = fw.t
    out = {"copy_gbps": _copy_gbps(fw), "gbps": {}}
    for (M, N) in SHAPES:
        x = (torch.randn(M, N, device="cuda") * 2).to(torch.bfloat16)
        t = torch.randint(0, N, (M,), device="cuda")
        nbytes = OPS["cross_entropy_fwdbwd"].bytes_moved(M, N, 2)
        out["gbps"][(M, N, "grad")] = nbytes / _median_ms(
            fw, lambda: fusedkit.cross_entropy(x, t, return_grad=True)) / 1e6
        out["gbps"][(M, N, "inplace")] = nbytes / _median_ms(
            fw, lambda: fusedkit.cross_entropy(x, t, return_grad=True, inplace_grad=True)) / 1e6
        del x, t
        torch.cuda.empty_cache()
    return out


class CrossEntropyBandwidth:
    params = ([f"{M}x{N}" for M, N in SHAPES], ["grad", "inplace"])
    param_names = ("shape", "gradient")
    timeout = 600

    def setup_cache(self):
        return _measure_all()

    def setup(self, cache, shape, gradient):
        if cache is None:
            raise NotImplementedError("no CUDA GPU through torch")

    def _key(self, shape, gradient):
        M, N = (int(v) for v in shape.split("x"))
        return (M, N, gradient)

    def track_gbps(self, cache, shape, gradient):
        return cache["gbps"][self._key(shape, gradient)]

    def track_fraction_of_copy(self, cache, shape, gradient):
        return cache["gbps"][self._key(shape, gradient)] / cache["copy_gbps"]

    track_gbps.unit = "GB/s"
    track_fraction_of_copy.unit = "fraction of copy"
