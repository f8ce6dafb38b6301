"""Softmax on the GPU: GB/s from the byte models of fusedkit._registry (4MN forward, 10MN forward +
backward for 2-byte dtypes) and the fraction of a device copy, measured once in setup_cache (same
harness as bench_norms: torch CUDA tensors for bfloat16 when torch sees a GPU, else CuPy for float16 /
float32; every benchmark is skipped without a GPU). Every problem is 2**27 elements; the causal and
masked forwards use the plain forward's byte model, so "within 5% of plain" reads off directly.
"""
import fusedkit
from fusedkit._dtypes import ITEMSIZE
from fusedkit._registry import OPS

from .bench_norms import ELEMENTS, _copy_gbps, _framework, _median_ms

NS = [1024, 4096, 8192, 16384, 65536, 262144]
DTYPES = ["bfloat16", "float16", "float32"]
MASKED = {  # op -> (x shape, mask shape or None); 2**27 elements each
    "softmax_causal_fwd": ((8, 4096, 4096), None),
    "softmax_masked_fwd": ((8, 16, 1024, 1024), (8, 1, 1024, 1024)),
}


def _bool_mask(fw, shape):
    """A random boolean mask (about 10% True) in the framework of fw."""
    if hasattr(fw, "t"):
        return fw.t.rand(shape, device="cuda") < 0.1
    return fw.cp.random.random_sample(shape, dtype="float32") < 0.1


def _measure_all(ns=NS, fwdbwd=True, masked=False):
    """{(N, dtype, "fwd" | "fwdbwd"): GB/s, (op, dtype): GB/s (causal / masked)} and the copy GB/s.
    One process per class (asv's setup_cache), so each class measures only what it reports."""
    out = {"copy_gbps": None, "gbps": {}}
    for dtype in DTYPES:
        try:
            fw = _framework(dtype)
        except NotImplementedError:
            continue
        if out["copy_gbps"] is None:
            out["copy_gbps"] = _copy_gbps(fw)
        s = ITEMSIZE[dtype]
        for N in ns:
            M = ELEMENTS // N
            x, dy = fw.randn((M, N), dtype), fw.randn((M, N), dtype)
            out["gbps"][(N, dtype, "fwd")] = (OPS["softmax_fwd"].bytes_moved(M, N, s)
                                              / _median_ms(fw, lambda: fusedkit.softmax(x)) / 1e6)
            if fwdbwd:
                out["gbps"][(N, dtype, "fwdbwd")] = (
                    OPS["softmax_fwdbwd"].bytes_moved(M, N, s)
                    / _median_ms(fw, lambda: fusedkit.softmax_backward(dy, fusedkit.softmax(x))) / 1e6)
            del x, dy
        for op, (shape, mshape) in (MASKED.items() if masked else ()):
            x = fw.randn(shape, dtype)
            mask = _bool_mask(fw, mshape) if mshape else None
            N, M = shape[-1], ELEMENTS // shape[-1]
            out["gbps"][(op, dtype)] = (OPS[op].bytes_moved(M, N, s)
                                        / _median_ms(fw, lambda: fusedkit.softmax(x, mask=mask, causal=mask is None))
                                        / 1e6)
            del x, mask
    return out


class SoftmaxBandwidth:
    """softmax forward and forward+backward: GB/s and fraction of copy at M x N = 2**27 elements."""

    params = (NS, DTYPES)
    param_names = ("N", "dtype")
    timeout = 600

    def setup_cache(self):
        return _measure_all()

    def setup(self, cache, N, dtype):
        if (N, dtype, "fwd") not in cache["gbps"]:
            raise NotImplementedError(f"{dtype} is not benchmarked here (framework or GPU missing)")

    def track_gbps_fwd(self, cache, N, dtype):
        return cache["gbps"][(N, dtype, "fwd")]

    def track_gbps_fwdbwd(self, cache, N, dtype):
        return cache["gbps"][(N, dtype, "fwdbwd")]

    def track_fraction_of_copy_fwd(self, cache, N, dtype):
        return cache["gbps"][(N, dtype, "fwd")] / cache["copy_gbps"]

    def track_fraction_of_copy_fwdbwd(self, cache, N, dtype):
        return cache["gbps"][(N, dtype, "fwdbwd")] / cache["copy_gbps"]

    track_gbps_fwd.unit = track_gbps_fwdbwd.unit = "GB/s"
    track_fraction_of_copy_fwd.unit = track_fraction_of_copy_fwdbwd.unit = "fraction of copy"


class SoftmaxMaskedBandwidth:
    """Causal (8, 4096, 4096) and masked (8, 16, 1024, 1024) with a (8, 1, 1024, 1024) mask: GB/s, and
    the ratio to the plain forward at the same N measured in the same setup_cache."""

    params = (list(MASKED), DTYPES)
    param_names = ("op", "dtype")
    timeout = 600

    def setup_cache(self):  # the plain forward at the same N, measured in the same process
        return _measure_all(ns=sorted({shape[-1] for shape, _ in MASKED.values()}), fwdbwd=False, masked=True)

    def setup(self, cache, op, dtype):
        if (op, dtype) not in cache["gbps"]:
            raise NotImplementedError(f"{dtype} is not benchmarked here (framework or GPU missing)")

    def track_gbps(self, cache, op, dtype):
        return cache["gbps"][(op, dtype)]

    def track_ratio_to_plain(self, cache, op, dtype):
        N = MASKED[op][0][-1]
        return cache["gbps"][(op, dtype)] / cache["gbps"][(N, dtype, "fwd")]

    track_gbps.unit = "GB/s"
    track_ratio_to_plain.unit = "ratio"


class SoftmaxOverhead:
    """Host time of one call at a tiny shape (4 x 1024): per-call overhead, not bandwidth."""

    # one round (asv's default is two, interleaved): the device calls give asv about 300 s, and the second
    # round of these time_ benchmarks was where run 143401Z's asv hit its timeout at 77 %
    rounds = 1

    params = (DTYPES,)
    param_names = ("dtype",)

    def setup(self, dtype):
        fw = _framework(dtype)
        x, dy = fw.randn((4, 1024), dtype), fw.randn((4, 1024), dtype)
        self.fwd = lambda: fusedkit.softmax(x)
        self.fwdbwd = lambda: fusedkit.softmax_backward(dy, fusedkit.softmax(x))
        self.fwd()  # compile and load the kernels outside the timing
        self.fwdbwd()

    def time_overhead_fwd(self, dtype):
        self.fwd()

    def time_overhead_fwdbwd(self, dtype):
        self.fwdbwd()
