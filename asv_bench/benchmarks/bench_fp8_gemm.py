"""FP8 GEMM (fusedkit.fp8_gemm, cuda/fp8_gemm_sm90.cu) on the GPU: TFLOP/s (2MNK / t) and the ratio to
cuBLASLt (torch._scaled_mm) with the same scaling and accumulation, measured once per class in
setup_cache. E4M3 x E4M3, bf16 output, torch CUDA tensors; skipped without a GPU or torch. Shapes are
(M, K, N) from issue 5 (the two smallest, to keep a run short; ``python -m fusedkit bench --only gemm``
times all five). Mode "epilogue": bias + GeLU(tanh) + E4M3 output + amax fused into the split GEMM,
against cuBLASLt (bias fused, bf16 out) followed by that epilogue as torch eager kernels."""
from .bench_norms import _framework, _median_ms

try:  # asv >= 0.6: skips one parameter combination from inside the benchmark (a plain raise there fails it)
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # outside asv (imports in tests)
    SkipNotImplemented = NotImplementedError

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
MODES = ["split", "fast", "block", "epilogue"]


def _measure_all():
    try:
        fw = _framework("bfloat16")  # torch (bf16 output needs it)
    except NotImplementedError:
        return None
    import torch

    import fusedkit
    from fusedkit import fp8
    out = {"tflops": {}, "ratio": {}}
    for (M, K, N) in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        a, b = fusedkit.quantize(x, fmt="e4m3"), fusedkit.quantize(w, fmt="e4m3")
        ab = fusedkit.quantize(x, fmt="e4m3", recipe=fp8.BlockScaling())
        bb = fusedkit.quantize(w, fmt="e4m3", recipe=fp8.BlockScaling(), weight=True)
        a8, b8t = a.data.view(torch.float8_e4m3fn), b.data.view(torch.float8_e4m3fn).t()
        sa, sb = a.scale_inv.reshape(()), b.scale_inv.reshape(())
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        out_scale = torch.full((1,), 0.5, device="cuda", dtype=torch.float32)

        def lt_then_epilogue():
            y = torch._scaled_mm(a8, b8t, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16)
            z = torch.nn.functional.gelu(y.float(), approximate="tanh")
            return (z * out_scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), z.abs().amax()

        flops = 2.0 * M * N * K
        for mode in MODES:
            if mode == "epilogue":
                ours = lambda: fusedkit.fp8_gemm(a, b, bias=bias, activation="gelu", out_dtype="e4m3",  # noqa: E731
                                                 out_scale=out_scale)
                peer = lt_then_epilogue
            elif mode == "block":
                ours = lambda: fusedkit.fp8_gemm(ab, bb)  # noqa: E731
                peer = None  # no same-scaling cuBLASLt peer through torch here
            else:
                split = mode == "split"
                ours = lambda s=split: fusedkit.fp8_gemm(a, b, use_split_accumulator=s)  # noqa: E731
                peer = lambda s=split: torch._scaled_mm(a8, b8t, scale_a=sa, scale_b=sb,  # noqa: E731
                                                        out_dtype=torch.bfloat16, use_fast_accum=not s)
            ms = _median_ms(fw, ours)
            key = f"{M}x{K}x{N}/{mode}"
            out["tflops"][key] = flops / ms / 1e9
            if peer is not None:
                out["ratio"][key] = _median_ms(fw, peer) / ms
        del x, w, a, b, ab, bb, a8, b8t, bias
        torch.cuda.empty_cache()
    return out


class FP8Gemm:
    params = ([f"{M}x{K}x{N}" for (M, K, N) in SHAPES], MODES)
    param_names = ("shape", "mode")
    timeout = 900

    def setup_cache(self):
        return _measure_all()

    def setup(self, cache, shape, mode):
        if cache is None:
            raise NotImplementedError("no CUDA GPU through torch")

    def track_tflops(self, cache, shape, mode):
        return cache["tflops"][f"{shape}/{mode}"]

    def track_speedup_over_cublaslt(self, cache, shape, mode):
        key = f"{shape}/{mode}"
        if key not in cache["ratio"]:  # block scaling: no same-scaling cuBLASLt peer through torch
            raise SkipNotImplemented("no cuBLASLt peer for this scaling")
        return cache["ratio"][key]

    track_tflops.unit = "TFLOP/s"
    track_speedup_over_cublaslt.unit = "x cuBLASLt"


class FP8GemmOverhead:
    """Host time of one fp8_gemm call at 256^3 (a few microseconds of device work): the call cache's
    path (fusedkit/_callcache.py) after the first call of the signature; plain bf16 output and the fused
    bias + GeLU + E4M3 output with amax."""

    rounds = 1  # as NormOverhead: asv's device budget
    params = (["plain", "epilogue"],)
    param_names = ("mode",)

    def setup(self, mode):
        try:
            _framework("bfloat16")
        except NotImplementedError:
            raise NotImplementedError("no CUDA GPU through torch")
        import torch

        import fusedkit
        x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        a = b = fusedkit.quantize(x, fmt="e4m3")
        bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
        out_scale = torch.full((1,), 0.5, device="cuda", dtype=torch.float32)
        if mode == "plain":
            self.call = lambda: fusedkit.fp8_gemm(a, b)
        else:
            self.call = lambda: fusedkit.fp8_gemm(a, b, bias=bias, activation="gelu", out_dtype="e4m3",
                                                  out_scale=out_scale)
        self.call()  # compile, load and plan outside the timing
        torch.cuda.synchronize()

    def time_overhead(self, mode):
        self.call()
