"""LayerNorm / RMSNorm on the GPU: GB/s from the byte model, fraction of a device copy, host overhead.

Inputs are torch CUDA tensors (bfloat16) when torch sees a GPU, else CuPy arrays (float16, float32;
CuPy has no bfloat16). Parameter combinations the available framework cannot run, and every
benchmark on a machine without a GPU, raise NotImplementedError in setup, which asv reports as
skipped. Times come from CUDA events on the stream fusedkit launches on: warm-up, L2 flushed
before every repetition (outside the timed span), median. Every problem is 2**27 elements
(>= 256 MiB); GB/s use the byte models of fusedkit._registry (4MN forward, 10MN forward+backward
for 2-byte dtypes) and the copy counts its bytes read + written.
"""
import statistics

import fusedkit
from fusedkit._dtypes import ITEMSIZE
from fusedkit._registry import OPS

NS = [1024, 4096, 8192, 16384]
DTYPES = ["bfloat16", "float16", "float32"]
ELEMENTS = 2**27
COPY_BYTES = 2**30
WARMUP, REPEATS = 3, 20
FLUSH_BYTES = 2**28  # more than any GPU's L2


class _Torch:
    dtypes = ("bfloat16",)

    def __init__(self):
        import torch
        if not torch.cuda.is_available():
            raise NotImplementedError("torch sees no CUDA device")
        self.t = torch

    def randn(self, shape, dtype):  # mean-shifted, as in the tests
        return (self.t.randn(shape, device="cuda") * 0.5 - 2.3).to(getattr(self.t, dtype))

    def ones(self, n, dtype):
        return self.t.ones(n, device="cuda", dtype=getattr(self.t, dtype))

    def bytes_buffer(self, n):
        return self.t.empty(n, dtype=self.t.uint8, device="cuda")

    def copy(self, dst, src):
        dst.copy_(src)

    def zero(self, buf):
        buf.zero_()

    def elapsed_ms(self, fn):
        start, end = self.t.cuda.Event(enable_timing=True), self.t.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


class _CuPy:
    dtypes = ("float16", "float32")

    def __init__(self):
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no device")
        except Exception as e:  # no CuPy, no driver or no device
            raise NotImplementedError(f"no CUDA GPU through CuPy ({e})") from None
        self.cp = cupy

    def randn(self, shape, dtype):
        return (self.cp.random.standard_normal(shape, dtype="float32") * 0.5 - 2.3).astype(dtype)

    def ones(self, n, dtype):
        return self.cp.ones(n, dtype=dtype)

    def bytes_buffer(self, n):
        return self.cp.empty(n, dtype=self.cp.uint8)

    def copy(self, dst, src):
        self.cp.copyto(dst, src)

    def zero(self, buf):
        buf.fill(0)

    def elapsed_ms(self, fn):
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(start, end)


def _framework(dtype):
    """The framework that runs ``dtype`` here: torch if it has CUDA, else CuPy."""
    try:
        fw = _Torch()
    except (ImportError, NotImplementedError):
        fw = _CuPy()
    if dtype not in fw.dtypes:
        raise NotImplementedError(f"{dtype} is not benchmarked with {type(fw).__name__[1:]}")
    return fw


def _median_ms(fw, fn):
    for _ in range(WARMUP):
        fn()
    flush, times = fw.bytes_buffer(FLUSH_BYTES), []
    for _ in range(REPEATS):
        fw.zero(flush)
        times.append(fw.elapsed_ms(fn))
    return statistics.median(times)


def _copy_gbps(fw):
    """GB/s of a device-to-device copy of COPY_BYTES: the ceiling every track_ fraction divides by."""
    src, dst = fw.bytes_buffer(COPY_BYTES), fw.bytes_buffer(COPY_BYTES)
    return 2 * COPY_BYTES / _median_ms(fw, lambda: fw.copy(dst, src)) / 1e6


def _calls(op, x, w, b, dy):
    """(forward, forward+backward) closures for ``op`` ('layer_norm' or 'rms_norm')."""
    if op == "layer_norm":
        def fwd():
            return fusedkit.layer_norm(x, w, b)

        def fwdbwd():
            _, mean, rstd = fusedkit.layer_norm(x, w, b, return_stats=True)
            return fusedkit.layer_norm_backward(dy, x, w, mean, rstd)
    else:
        def fwd():
            return fusedkit.rms_norm(x, w)

        def fwdbwd():
            _, rstd = fusedkit.rms_norm(x, w, return_stats=True)
            return fusedkit.rms_norm_backward(dy, x, w, rstd)
    return fwd, fwdbwd


def _measure_all():
    """Every (op, N, dtype) -> {"fwd": GB/s, "fwdbwd": GB/s} plus the copy's GB/s, measured in one
    process (asv's setup_cache), so the suite costs one set of imports and allocations, not one per
    benchmark (the per-benchmark version ran past 300 s on the H200)."""
    out = {"copy_gbps": None, "gbps": {}}
    for dtype in DTYPES:
        try:
            fw = _framework(dtype)
        except NotImplementedError:
            continue
        if out["copy_gbps"] is None:
            out["copy_gbps"] = _copy_gbps(fw)
        for N in NS:
            M, itemsize = ELEMENTS // N, ITEMSIZE[dtype]
            x, dy = fw.randn((M, N), dtype), fw.randn((M, N), dtype)
            w, b = fw.ones(N, dtype), fw.ones(N, dtype)
            for op in ("layer_norm", "rms_norm"):
                fwd, fwdbwd = _calls(op, x, w, b, dy)
                for which, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                    nbytes = OPS[f"{op}_{which}"].bytes_moved(M, N, itemsize)
                    out["gbps"][(op, N, dtype, which)] = nbytes / _median_ms(fw, fn) / 1e6
            del x, dy
    return out


class NormBandwidth:
    """GB/s and fraction of copy at M x N = 2**27 elements (measured once, in setup_cache)."""

    params = (["layer_norm", "rms_norm"], NS, DTYPES)
    param_names = ("op", "N", "dtype")
    timeout = 600

    def setup_cache(self):
        return _measure_all()

    def setup(self, cache, op, N, dtype):
        if (op, N, dtype, "fwd") not in cache["gbps"]:
            raise NotImplementedError(f"{dtype} is not benchmarked here (framework or GPU missing)")

    def track_gbps_fwd(self, cache, op, N, dtype):
        return cache["gbps"][(op, N, dtype, "fwd")]

    def track_gbps_fwdbwd(self, cache, op, N, dtype):
        return cache["gbps"][(op, N, dtype, "fwdbwd")]

    def track_fraction_of_copy_fwd(self, cache, op, N, dtype):
        return cache["gbps"][(op, N, dtype, "fwd")] / cache["copy_gbps"]

    def track_fraction_of_copy_fwdbwd(self, cache, op, N, dtype):
        return cache["gbps"][(op, N, dtype, "fwdbwd")] / cache["copy_gbps"]

    track_gbps_fwd.unit = track_gbps_fwdbwd.unit = "GB/s"
    track_fraction_of_copy_fwd.unit = track_fraction_of_copy_fwdbwd.unit = "fraction of copy"


class NormOverhead:
    """Host time of one call at a tiny shape (4 x 1024): per-call overhead, not bandwidth."""

    # one round (asv's default is two, interleaved): the device calls give asv about 300 s, and the second
    # round of these time_ benchmarks was where run 143401Z's asv hit its timeout at 77 %
    rounds = 1

    params = (["layer_norm", "rms_norm"], DTYPES)
    param_names = ("op", "dtype")

    def setup(self, op, dtype):
        fw = _framework(dtype)
        x, dy = fw.randn((4, 1024), dtype), fw.randn((4, 1024), dtype)
        w, b = fw.ones(1024, dtype), fw.ones(1024, dtype)
        self.fwd, self.fwdbwd = _calls(op, x, w, b, dy)
        self.fwd()  # compile and load the kernels outside the timing
        self.fwdbwd()

    def time_overhead_fwd(self, op, dtype):
        self.fwd()

    def time_overhead_fwdbwd(self, op, dtype):
        self.fwdbwd()
