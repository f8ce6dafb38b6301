"""``python -m fusedkit bench``: fusedkit against every installed peer, in one run, as ratios.

On a GPU: the norms at M x N = 2^27 (bf16) plus a small shape, timed with CUDA events (warm-up, L2
flushed before every repetition, repetitions queued back to back as triton's do_bench, median), against
torch eager, torch.compile, Liger and a hand-written CuPy version where available, and a device-to-device
copy timed in the same run. GB/s come from the op's byte model (fusedkit._registry); "of copy" is GB/s
over the copy's GB/s. Writes the results JSON of shared/DESIGN.md and a PNG chart. Without a GPU it
times the CPU backend against NumPy by hand.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import statistics
import sys
import time

import numpy as np

from . import _registry
from ._version import __version__

GPU_SHAPES = [(131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 1024)]
OPS = ["layer_norm_fwd", "layer_norm_fwdbwd", "rms_norm_fwd", "rms_norm_fwdbwd"]
FP8_SHAPES = [(32768, 4096), (16384, 8192), (16384, 14336)]
FP8_OPS = ["fp8_quantize_delayed", "fp8_quantize_current", "fp8_cast_transpose", "fp8_dequantize"]
NORM_FP8_OPS = ["layer_norm_fp8_fwd", "rms_norm_fp8_fwd"]  # at FP8_SHAPES
# at FP8_SHAPES, bf16 -> e5m2 (fp8_dswiglu_cast_transpose: (M, N) is dy's shape, x is M x 2N)
FP8_GRAD_OPS = ["fp8_cast_transpose_dbias", "fp8_dact_cast_transpose", "fp8_dswiglu_cast_transpose"]
FP8_BLOCK_OPS = ["fp8_quantize_mxfp8", "fp8_quantize_mxfp8_cols", "fp8_quantize_block_1x128",
                 "fp8_quantize_block_128x128"]  # at FP8_SHAPES, bf16 -> e4m3 with per-block scales
ACT_WORK = [("gelu_fwd", 32768, 4096), ("gelu_fwd", 16384, 14336), ("swiglu_fwd", 32768, 14336)]  # (op, M, H)
CE_WORK = [("cross_entropy_fwdbwd", 16384, 32768), ("cross_entropy_fwdbwd", 8192, 131072),
           ("cross_entropy_fwdbwd", 4096, 262144)]  # (op, M tokens, N vocab)
SOFTMAX_WORK = ([(op, 2**27 // N, N) for N in (1024, 4096, 8192, 16384, 65536)
                 for op in ("softmax_fwd", "softmax_fwdbwd")]
                + [("softmax_fwd", 512, 262144), ("softmax_fwdbwd", 512, 262144),
                   ("softmax_causal_fwd", 32768, 4096),     # scores (8, 4096, 4096), causal
                   ("softmax_masked_fwd", 131072, 1024)])   # scores (8, 16, 1024, 1024), mask (8, 1, 1024, 1024)
GEMM_WORK = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096),
             (16384, 8192, 8192)]  # fp8_gemm (M, K, N), issue 5


def _progress(total, desc):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        class _P:
            n = 0

            def update(self, k=1):
                self.n += k
                print(f"\r{desc} {self.n}/{total}", end="", file=sys.stderr, flush=True)

            def close(self):
                print(file=sys.stderr)
        return _P()


# ----------------------------------------------------------------------------------------------------
# GPU timing (torch events; torch is the harness's allocator for every impl, so bf16 works)

class GpuTimer:
    """Median of CUDA-event times, L2 flushed before each call. ``flush_mode``: "zero" (the benchmark's,
    as triton.testing.do_bench: a 256 MiB buffer zeroed, so each call starts with L2 full of dirty lines
    to write back), "read" (the buffer read: L2 full of clean lines) or "none" (tools/ab_flush.py).

    The timed calls are queued back to back, `rep` at a time, and read after one synchronize (as
    do_bench): the host runs ahead of the device, so a call's host cost stays outside its events. With a
    synchronize after every call (``sync_each=True``, the harness until 2026-12-05) the queue was empty
    at each call: whatever host time a call took beyond the flush (about 60 us on the H200, 85 us on the
    H100) fell between its events. The FP8 GEMM at 4096^3 (about 100 us of kernel, a heavier Python
    path than a norm's) read 130-195 us in the H100 runs of 2026-12-05, its peers too (cuBLASLt plus
    torch.compile's epilogue: 160-198 us): two modes, likely the host's time falling either side of the
    flush's."""

    def __init__(self, torch, flush_mib=256, flush_mode="zero", sync_each=False):
        self.torch = torch
        self.flush = torch.empty(flush_mib * 2**20, dtype=torch.uint8, device="cuda")
        self.flush_mode = flush_mode
        self.sync_each = sync_each

    def _flush_l2(self):
        if self.flush_mode == "zero":
            self.flush.zero_()
        elif self.flush_mode == "read":
            self.flush.max()

    def ms(self, fn, warmup=5, rep=30, min_time_ms=150.0, warmup_ms=25.0):
        torch = self.torch
        # warm up for at least `warmup` calls and `warmup_ms` of wall time (queued calls, then a sync):
        # after a host-heavy phase (a peer's torch.compile, the previous op's setup) the SM clock idles
        # down, and a few calls of a 100 us kernel did not bring it back: the first FP8 op of a run
        # read 0.76-0.80 of copy where the same kernel on the same bytes at the next shape read 0.90
        t_end = time.perf_counter() + warmup_ms / 1e3
        n = 0
        while n < warmup or time.perf_counter() < t_end:
            fn()
            n += 1
            if n % 64 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        times = []
        t_end = time.perf_counter() + min_time_ms / 1e3
        while len(times) < rep or (time.perf_counter() < t_end and len(times) < 10 * rep):
            pairs = []
            for _ in range(1 if self.sync_each else rep):
                self._flush_l2()
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                pairs.append((a, b))
            pairs[-1][1].synchronize()
            times += [a.elapsed_time(b) for a, b in pairs]
        return statistics.median(times)


def _reset_dynamo(torch) -> None:
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - a torch without dynamo has no torch.compile peer to reset
        pass


def precompile(file, exprs, arch="sm_90a"):
    """Fills the kernel cache with ``exprs`` of ``file`` through a process pool (NVRTC is single-threaded;
    the tools/sweep_*.py scripts then time candidates without waiting on compiles). A failure is
    printed, and the sweep reports it again when it reaches that candidate."""
    from concurrent.futures import ProcessPoolExecutor
    exprs = sorted(set(exprs))
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        for e, err in zip(exprs, pool.map(_compile_one, [file] * len(exprs), exprs, [arch] * len(exprs))):
            if err:
                print(f"compile failed: {e}: {err}", flush=True)


def _compile_one(file, expr, arch):
    from . import _jit
    try:
        _jit.cached_cubin(file, expr, arch)
        return None
    except Exception as e:  # noqa: BLE001 - returned to precompile, which prints it
        return f"{type(e).__name__} {str(e)[:200]}"


def sweep_configs(timer, copy, label, configs, make_fn, nbytes, results, **tags):
    """Times ``make_fn(cfg)`` for each launch config (the tools/sweep_*.py scripts): appends a row per
    config to ``results`` (tags, config, ms, GB/s, fraction of ``copy``), prints it, reports a config
    that fails and goes on, prints and returns the fastest row (None if none ran)."""
    best = None
    for cfg in configs:
        try:
            ms = timer.ms(make_fn(cfg), rep=20, min_time_ms=60.0)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{label} {cfg}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        gbps = nbytes / ms / 1e6
        row = dict(tags, config=list(cfg), ms=ms, GBps=gbps, of_copy=gbps / copy)
        results.append(row)
        print(f"{label} {str(cfg):40s} {ms:8.4f} ms {gbps:7.0f} GB/s {gbps / copy:.3f}", flush=True)
        if best is None or ms < best["ms"]:
            best = row
    if best:
        print(f"BEST {label}: {best['config']} {best['of_copy']:.3f} of copy", flush=True)
    return best


def copy_gbps(torch, timer, nbytes=2 * 2**30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = timer.ms(lambda: dst.copy_(src), rep=20)
    del src, dst
    return 2 * nbytes / ms / 1e6


def _impls(torch, op, M, N, dtype):
    """{impl name: zero-argument callable} for one op and shape."""
    import fusedkit as fk
    F = torch.nn.functional
    rms = op.startswith("rms")
    bwd = op.endswith("fwdbwd")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.randn(M, N, device=dev, generator=g) * 0.5 - 2.3).to(dtype)
    w = (torch.randn(N, device=dev, generator=g) * 0.3 + 1).to(dtype)
    b = (torch.randn(N, device=dev, generator=g) * 0.3).to(dtype)
    dy = torch.randn(M, N, device=dev, generator=g).to(dtype)
    eps = 1e-5
    out = {}

    if not bwd:
        out["fusedkit"] = (lambda: fk.rms_norm(x, w, eps=eps)) if rms else (lambda: fk.layer_norm(x, w, b, eps=eps))
    elif rms:
        def fk_rms():
            _, r = fk.rms_norm(x, w, eps=eps, return_stats=True)
            return fk.rms_norm_backward(dy, x, w, r)
        out["fusedkit"] = fk_rms
    else:
        def fk_ln():
            _, m, r = fk.layer_norm(x, w, b, eps=eps, return_stats=True)
            return fk.layer_norm_backward(dy, x, w, m, r)
        out["fusedkit"] = fk_ln

    def torch_fn(x_, w_, b_):
        if rms:
            return F.rms_norm(x_, (N,), w_, eps)
        return F.layer_norm(x_, (N,), w_, b_, eps)

    xg, wg, bg = (t.detach().clone().requires_grad_(bwd) for t in (x, w, b))

    def make(fn, params=None):
        if not bwd:
            return lambda: fn(x, w, b)
        wrt = (xg, *params) if params is not None else ((xg, wg) if rms else (xg, wg, bg))

        def step():
            y = fn(xg, wg, bg)
            return torch.autograd.grad(y, wrt, dy)
        return step

    out["torch_eager"] = make(torch_fn)
    try:
        compiled = torch.compile(torch_fn, dynamic=False)
        out["torch_compile"] = make(compiled)
    except Exception:  # noqa: BLE001 - a peer that cannot run is left out, never faked
        pass
    try:
        from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm
        if rms:
            mod = LigerRMSNorm(N, eps=eps).to(dev, dtype)
            mod.weight.data.copy_(w)
            out["liger"] = make(lambda x_, w_, b_: mod(x_), [mod.weight])
        else:
            mod = LigerLayerNorm(N, eps=eps).to(dev, dtype)
            mod.weight.data.copy_(w)
            mod.bias.data.copy_(b)
            out["liger"] = make(lambda x_, w_, b_: mod(x_), [mod.weight, mod.bias])
    except Exception:  # noqa: BLE001
        pass
    return out


def _with_compiled_peer(torch, out, peer, *args):
    """``out`` with ``out["torch_compile"]``: ``peer(*args)`` under torch.compile (dynamic=False), left out
    where torch.compile refuses it (a peer that cannot run is left out, never faked; one that fails when
    first called is reported and dropped by time_rounds)."""
    try:
        compiled = torch.compile(peer, dynamic=False)
    except Exception:  # noqa: BLE001
        return out
    out["torch_compile"] = lambda: compiled(*args)
    return out


def _fp8_impls(torch, op, M, N, dtype):
    """FP8 E4M3 casts of bf16 x: fusedkit against torch eager / torch.compile doing the same math
    (fp32 multiply, saturate, cast, amax; the transpose as a contiguous copy); and the way back
    (dequantize: decode, fp32 multiply by scale_inv, round to bf16)."""
    import fusedkit as fk
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 100).to(dtype)
    scale = torch.full((1,), 0.37, device="cuda")
    fmax = 448.0
    e4m3 = torch.float8_e4m3fn

    if op == "fp8_quantize_delayed":
        def ours():
            return fk.quantize(x, fmt="e4m3", scale=scale)

        def peer(x_, s_):
            return (x_.float() * s_).clamp(-fmax, fmax).to(e4m3), x_.abs().amax().float(), 1.0 / s_
    elif op == "fp8_quantize_current":
        def ours():
            return fk.quantize(x, fmt="e4m3")

        def peer(x_, s_):
            a = x_.abs().amax().float()
            s = torch.where(a > 0, fmax / a, torch.ones_like(a))
            return (x_.float() * s).clamp(-fmax, fmax).to(e4m3), a, 1.0 / s
    elif op == "fp8_dequantize":   # E4M3 bytes -> bf16 (x's dtype): value x scale_inv, one rounding
        t = fk.quantize(x, fmt="e4m3", scale=scale)
        q, sinv = t.data.view(e4m3), t.scale_inv

        def ours():
            return fk.dequantize(t, x.dtype)

        def peer(x_, s_):
            return (q.float() * sinv).to(x_.dtype)
    else:
        def ours():
            return fk.cast_transpose(x, fmt="e4m3", scale=scale)

        def peer(x_, s_):
            q = (x_.float() * s_).clamp(-fmax, fmax).to(e4m3)
            return q, q.t().contiguous(), x_.abs().amax().float(), 1.0 / s_
    out = {"fusedkit": ours, "torch_eager": lambda: peer(x, scale)}
    return _with_compiled_peer(torch, out, peer, x, scale)


def _fp8_grad_impls(torch, op, M, N, dtype):
    """Gradient casts to E5M2 (delayed scale): cast_transpose_dbias of dy, dgelu (tanh) of (dy, x)
    cast-transposed with dbias (Transformer Engine's dgelu_cast_transpose_dbias), and dswiglu of (dy, x
    = [a | b], M x 2N) cast-transposed (TE's dswiglu_cast_transpose, no bias); torch eager /
    torch.compile do the same math: fp32 activation backward, multiply, saturate, cast,
    transpose().contiguous(), sum(0) where there is a dbias, amax."""
    import math

    import fusedkit as fk
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(M, N, device="cuda", generator=g).to(dtype)
    gated = op == "fp8_dswiglu_cast_transpose"
    x = (torch.randn(M, 2 * N if gated else N, device="cuda", generator=g) * 2).to(dtype)
    scale = torch.full((1,), 57344.0 / 8.0, device="cuda")
    fmax, e5m2, k0, k1 = 57344.0, torch.float8_e5m2, math.sqrt(2.0 / math.pi), 0.044715

    def cast_t(v, s_, dbias=True):
        q = (v * s_).clamp(-fmax, fmax).to(e5m2)
        return q, q.t().contiguous(), v.sum(0).to(dy.dtype) if dbias else None, v.abs().amax(), 1.0 / s_

    if gated:
        def ours():
            return fk.dact_cast_transpose(dy, x, activation="swiglu", fmt="e5m2", scale=scale)

        def peer(dy_, x_, s_):
            a, b = x_.float().chunk(2, dim=-1)
            d, sg = dy_.float(), torch.sigmoid(a)
            return cast_t(torch.cat([d * b * (sg * (1 + a * (1 - sg))), d * (a * sg)], dim=-1), s_, dbias=False)
    elif op == "fp8_cast_transpose_dbias":
        def ours():
            return fk.cast_transpose_dbias(dy, fmt="e5m2", scale=scale)

        def peer(dy_, x_, s_):
            return cast_t(dy_.float(), s_)
    else:
        def ours():
            return fk.dact_cast_transpose(dy, x, activation="gelu", fmt="e5m2", scale=scale, dbias=True)

        def peer(dy_, x_, s_):
            xf = x_.float()
            t = torch.tanh(k0 * (xf + k1 * xf * xf * xf))
            d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * k0 * (1 + 3 * k1 * xf * xf)
            return cast_t(dy_.float() * d, s_)
    out = {"fusedkit": ours, "torch_eager": lambda: peer(dy, x, scale)}
    return _with_compiled_peer(torch, out, peer, dy, x, scale)


def block_scale_peer(torch, x, op):
    """The block-scaled E4M3 casts of a 2-D x written in torch ops, as a user of torch would write them
    (also the torch.compile peer): per block amax, its power-of-two scale from the exponent torch.frexp
    gives (exact, as the reference's bit arithmetic), saturate, cast. Returns (bytes, scales) laid out
    as fusedkit's: MXFP8 E8M0 bytes (M, N / 32) or, column-wise, (M / 32, N); fp32 scale_inv (M, N /
    128) or (M / 128, N / 128). Equal to the reference for finite x (tests/test_bench_tools.py); blocks
    holding inf or NaN, which the reference treats by Transformer Engine's rules, are left out. Needs M
    and N multiples of the block (the benchmark's shapes are)."""
    M, N = x.shape
    fmax = 448.0
    if op in ("fp8_quantize_mxfp8", "fp8_quantize_mxfp8_cols"):
        # MXFP8: scale 2^-e, e = ceil(log2(amax / fmax)) clamped to [-127, 127] (an all-zero block: -127)
        b = x.float().view(M, N // 32, 32) if op == "fp8_quantize_mxfp8" else x.float().view(M // 32, 32, N)
        am = b.abs().amax(-1 if op == "fp8_quantize_mxfp8" else 1)
        m, ex = torch.frexp(am / fmax)                        # am / fmax = m 2^ex, m in [0.5, 1)
        e = torch.where(am > 0, torch.where(m == 0.5, ex - 1, ex), -127).clamp(-127, 127)
        s = torch.ldexp(torch.ones_like(am), -e)
        s = s[..., None] if op == "fp8_quantize_mxfp8" else s[:, None, :]
        q = (b * s).clamp(-fmax, fmax).to(torch.float8_e4m3fn).view(M, N)
        return q, (e + 127).to(torch.uint8)
    bm = 1 if op == "fp8_quantize_block_1x128" else 128
    # 1 x 128 / 128 x 128: scale = 2^floor(log2(fmax / amax)), 1 for an all-zero block
    b = x.float().view(M // bm, bm, N // 128, 128)
    am = b.abs().amax(dim=(1, 3))
    _, ex = torch.frexp(fmax / torch.where(am > 0, am, fmax))
    s = torch.ldexp(torch.ones_like(am), ex - 1)            # 2^floor(log2 v) for v = m 2^ex
    q = (b * s[:, None, :, None]).clamp(-fmax, fmax).to(torch.float8_e4m3fn).view(M, N)
    return q, 1.0 / s


def _fp8_block_impls(torch, op, M, N, dtype):
    """Block-scaled E4M3 casts of bf16 x (MXFP8 rows / columns, 1 x 128, 128 x 128): fusedkit.quantize
    with the recipe against block_scale_peer in torch eager and torch.compile."""
    import fusedkit as fk
    from fusedkit import fp8
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 100).to(dtype)
    kw = {"fp8_quantize_mxfp8": dict(recipe=fp8.MXFP8Scaling()),
          "fp8_quantize_mxfp8_cols": dict(recipe=fp8.MXFP8Scaling(), columnwise=True),
          "fp8_quantize_block_1x128": dict(recipe=fp8.BlockScaling()),
          "fp8_quantize_block_128x128": dict(recipe=fp8.BlockScaling(), weight=True)}[op]

    def peer(x_):
        return block_scale_peer(torch, x_, op)

    out = {"fusedkit": lambda: fk.quantize(x, fmt="e4m3", **kw), "torch_eager": lambda: peer(x)}
    return _with_compiled_peer(torch, out, peer, x)


def norm_fp8_inputs(torch, M, N, dtype):
    """The FP8-output norms' benchmark inputs (x mean-shifted, gamma near 1, beta, E4M3 delayed scale),
    shared by the benchmark and the tools' A/B scripts so their figures compare."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 0.5 - 2.3).to(dtype)
    w = (torch.randn(N, device="cuda", generator=g) * 0.3 + 1).to(dtype)
    b = (torch.randn(N, device="cuda", generator=g) * 0.3).to(dtype)
    return x, w, b, torch.full((1,), 448.0 / 6.0, device="cuda")


def _norm_fp8_impls(torch, op, M, N, dtype):
    """LayerNorm / RMSNorm with FP8 E4M3 output (delayed scale, amax of y): fusedkit against torch eager /
    torch.compile computing the norm, then the fp32 multiply, saturation, cast and amax."""
    import fusedkit as fk
    F = torch.nn.functional
    rms = op.startswith("rms")
    x, w, b, scale = norm_fp8_inputs(torch, M, N, dtype)
    eps = 1e-5
    e4m3 = torch.float8_e4m3fn

    if rms:
        def ours():
            return fk.rms_norm(x, w, eps=eps, fp8_fmt="e4m3", fp8_scale=scale)
    else:
        def ours():
            return fk.layer_norm(x, w, b, eps=eps, fp8_fmt="e4m3", fp8_scale=scale)

    def peer(x_, w_, b_, s_):
        y = F.rms_norm(x_, (N,), w_, eps) if rms else F.layer_norm(x_, (N,), w_, b_, eps)
        return (y.float() * s_).clamp(-448.0, 448.0).to(e4m3), y.abs().amax().float(), 1.0 / s_
    out = {"fusedkit": ours, "torch_eager": lambda: peer(x, w, b, scale)}
    return _with_compiled_peer(torch, out, peer, x, w, b, scale)


def _act_impls(torch, op, M, H, dtype):
    """GeLU (tanh) of an (M, H) tensor, SwiGLU of an (M, 2H) one: fusedkit, torch eager, torch.compile
    and Liger's SwiGLU where installed."""
    import fusedkit as fk
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(0)
    if op == "gelu_fwd":
        x = torch.randn(M, H, device="cuda", generator=g).to(dtype)

        def peer(x_):
            return F.gelu(x_, approximate="tanh")
        out = {"fusedkit": lambda: fk.gelu(x), "torch_eager": lambda: peer(x)}
    else:
        x = torch.randn(M, 2 * H, device="cuda", generator=g).to(dtype)

        def peer(x_):
            a, b = x_.chunk(2, dim=-1)
            return F.silu(a) * b
        out = {"fusedkit": lambda: fk.swiglu(x), "torch_eager": lambda: peer(x)}
        try:
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction
            a, b = (t.contiguous() for t in x.chunk(2, dim=-1))
            out["liger"] = lambda: LigerSiLUMulFunction.apply(a, b)
        except Exception:  # noqa: BLE001
            pass
    return _with_compiled_peer(torch, out, peer, x)


def _ce_impls(torch, op, M, N, dtype):
    """Cross-entropy loss (mean) and its gradient with respect to bf16 logits (M tokens x N vocab; no
    ignored targets, since fusedkit skips reading ignored rows and the 4MN byte model would flatter it):
    fusedkit (one fused pass), torch eager and torch.compile (F.cross_entropy forward + autograd
    backward), and Liger's fused cross-entropy where installed."""
    import fusedkit as fk
    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(dtype)
    t = torch.randint(0, N, (M,), device="cuda", generator=g)
    out = {"fusedkit": lambda: fk.cross_entropy(x, t, return_grad=True)}

    def peer(x_, t_):
        return F.cross_entropy(x_, t_)

    def step(fn, xg):
        def run():
            loss = fn(xg, t)
            return loss, torch.autograd.grad(loss, xg)
        return run
    xg = x.detach().clone().requires_grad_(True)
    out["torch_eager"] = step(peer, xg)
    try:
        out["torch_compile"] = step(torch.compile(peer, dynamic=False), xg)
    except Exception:  # noqa: BLE001 - a peer that cannot run is left out, never faked
        pass
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
        # Liger writes the gradient into its input: give it its own copy
        out["liger"] = step(LigerCrossEntropyLoss(), x.detach().clone().requires_grad_(True))
    except Exception:  # noqa: BLE001
        pass
    return out


def _softmax_impls(torch, op, M, N, dtype):
    """Softmax of bf16 rows (M x N): forward, or forward + backward (autograd with a given dy) for the
    peers; causal on (8, Sq, Sk) = (8, 4096, 4096) scores and masked with a (B, 1, Sq, Sk) mask broadcast
    over 16 heads, against torch's masked_fill + softmax. Peers: torch eager, torch.compile, Liger's
    softmax where installed (plain softmax only; liger_kernel.ops.softmax)."""
    import fusedkit as fk
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(dtype)
    bwd = op == "softmax_fwdbwd"
    if op == "softmax_causal_fwd":
        x = x.view(M // N, N, N)
        hide = torch.ones(N, N, dtype=torch.bool, device="cuda").triu_(1)

        def peer(x_):
            return torch.softmax(x_.masked_fill(hide, float("-inf")), -1)
        out = {"fusedkit": lambda: fk.softmax(x, causal=True)}
    elif op == "softmax_masked_fwd":
        x = x.view(8, M // (8 * N), N, N)
        hide = torch.rand(8, 1, N, N, device="cuda", generator=g) < 0.1

        def peer(x_):
            return torch.softmax(x_.masked_fill(hide, float("-inf")), -1)
        out = {"fusedkit": lambda: fk.softmax(x, mask=hide)}
    else:
        def peer(x_):
            return torch.softmax(x_, -1)
        if bwd:
            dy = torch.randn(M, N, device="cuda", generator=g).to(dtype)
            out = {"fusedkit": lambda: fk.softmax_backward(dy, fk.softmax(x))}
        else:
            out = {"fusedkit": lambda: fk.softmax(x)}

    def make(fn):
        if not bwd:
            return lambda: fn(x)
        xg = x.detach().clone().requires_grad_(True)

        def step():
            return torch.autograd.grad(fn(xg), xg, dy)
        return step
    out["torch_eager"] = make(peer)
    try:
        out["torch_compile"] = make(torch.compile(peer, dynamic=False))
    except Exception:  # noqa: BLE001 - a peer that cannot run is left out, never faked
        pass
    if op in ("softmax_fwd", "softmax_fwdbwd"):
        try:
            from liger_kernel.ops.softmax import LigerSoftmaxFunction
            out["liger"] = make(LigerSoftmaxFunction.apply)
        except Exception:  # noqa: BLE001 - not installed, or a version without a softmax op
            pass
    return out


class _Stopped(Exception):
    """SIGTERM during a GPU run (e.g. `timeout`): the rows measured so far are still written."""


def _stop_on_sigterm(signum, frame):
    raise _Stopped()


def measure_until_sigterm(measure, rows) -> str | None:
    """Runs measure() (which appends to rows) with SIGTERM turned into a clean stop: returns None when it
    finished, else a note for the results JSON ("partial"); rows keeps everything measured before."""
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        measure()
        return None
    except _Stopped:
        print(f"bench: stopped (SIGTERM) after {len(rows)} rows; writing those", file=sys.stderr)
        return f"stopped by SIGTERM; {len(rows)} rows measured"
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_gpu(args):
    import torch
    timer = GpuTimer(torch)
    rows = []
    copy = copy_gbps(torch, timer)
    shapes = GPU_SHAPES if not args.quick else GPU_SHAPES[1:2]
    work = [(M, N, op, _impls) for (M, N) in shapes for op in OPS]
    if not args.quick:
        work += [(M, N, op, _fp8_impls) for (M, N) in FP8_SHAPES for op in FP8_OPS]
        work += [(M, N, op, _norm_fp8_impls) for (M, N) in FP8_SHAPES for op in NORM_FP8_OPS]
        work += [(M, N, op, _fp8_grad_impls) for (M, N) in FP8_SHAPES for op in FP8_GRAD_OPS]
        work += [(M, N, op, _fp8_block_impls) for (M, N) in FP8_SHAPES for op in FP8_BLOCK_OPS]
        work += [(M, H, op, _act_impls) for (op, M, H) in ACT_WORK]
        work += [(M, N, op, _ce_impls) for (op, M, N) in CE_WORK]
        work += [(M, N, op, _softmax_impls) for (op, M, N) in SOFTMAX_WORK]
    if args.only:
        pats = [p.strip() for p in args.only.split(",") if p.strip()]
        work = [w for w in work if any(p in w[2] for p in pats)]
    prog = _progress(len(work), "bench")

    def measure():
        _run_work(torch, timer, args, work, rows, prog)
        # opt-in (--only gemm) until the sm_90a kernel has passed its GPU tests: a hang there would stop
        # the whole benchmark
        if not args.quick and "gemm" in args.only:
            gemm_rows(torch, timer, rows, rounds=max(args.rounds, 3))
            try:
                rows.extend(gemm_overhead_rows(torch))
            except Exception as e:  # noqa: BLE001 - reported; the GEMM rows above stay
                print(f"  fp8_gemm host overhead failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        if not args.only or "overhead" in args.only:
            rows.extend(overhead_rows(torch))
            rows.extend(fp8_overhead_rows(torch))

    partial = measure_until_sigterm(measure, rows)
    prog.close()
    res = {"device": torch.cuda.get_device_name(), "copy_GBps": copy, "rows": rows}
    if partial:
        res["partial"] = partial
    return res


def time_rounds(timer, op, fns, rounds) -> dict:
    """{impl: [ms per round]}: the implementations of one (op, shape) timed `rounds` times, interleaved
    (each keeps its fastest median: a slow spell of the card, clock or power, then has to hit every
    round to show). An implementation that raises is reported and left out."""
    times = {impl: [] for impl in fns}
    for _ in range(rounds):
        for impl, fn in fns.items():
            if impl not in times:
                continue  # failed in an earlier round
            try:
                times[impl].append(timer.ms(fn))
            except Exception as e:  # noqa: BLE001 - a failing impl is reported and left out
                print(f"  {op} {impl} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                del times[impl]
    return times


def _run_work(torch, timer, args, work, rows, prog) -> None:
    """Times every (M, N, op, impls) of work, appending rows as each (op, shape) finishes."""
    for (M, N, op, impls) in work:
        nbytes = _registry.OPS[op].bytes_moved(M, N, 2)
        # a fresh torch.compile for every (op, shape): one peer function compiled for more shapes than
        # torch._dynamo's recompile limit (8) falls back to eager without an error (runs before
        # 2026-12-04 21:50Z compared some rows against eager under the torch.compile name)
        _reset_dynamo(torch)
        fns = impls(torch, op, M, N, torch.bfloat16)
        for impl, ts in time_rounds(timer, op, fns, args.rounds).items():
            rows.append({"op": op, "shape": [M, N], "dtype": "bfloat16", "impl": impl, "ms": min(ts),
                         "GBps": nbytes / min(ts) / 1e6, "TFLOPs": None, "ms_rounds": ts})
        del fns
        torch.cuda.empty_cache()
        prog.update()


def _gemm_impls(torch, M, K, N):
    """fp8_gemm, E4M3 x E4M3, bf16 out, as {op: {impl: fn}}: each op compares fusedkit with its peer in the
    same scaling and accumulation mode (cuBLASLt through torch._scaled_mm; use_fast_accum = not split):
      fp8_gemm           split accumulator (TE's forward default) vs cuBLASLt use_fast_accum=False
      fp8_gemm_fast      one fp32 tensor-core accumulator vs cuBLASLt use_fast_accum=True
      fp8_gemm_block     1x128 x 128x128 block scales vs fusedkit's own per-tensor split GEMM
      fp8_gemm_epilogue  bias + GeLU(tanh) + E4M3 output with amax, fused, vs cuBLASLt (bias fused, bf16
                         out) followed by the epilogue as separate kernels (torch eager, torch.compile)."""
    import fusedkit as fk
    from fusedkit import fp8 as _fp8
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", generator=g, dtype=torch.bfloat16)
    a, b = fk.quantize(x, fmt="e4m3"), fk.quantize(w, fmt="e4m3")
    e4m3 = torch.float8_e4m3fn
    a8, b8t = a.data.view(e4m3), b.data.view(e4m3).t()  # b8t: (K, N) column-major, cuBLASLt's TN
    sa, sb = a.scale_inv.reshape(()), b.scale_inv.reshape(())
    out_scale = torch.full((1,), 0.5, device="cuda", dtype=torch.float32)   # a delayed-scaling cast

    def lt(fast, **kw):
        return lambda: torch._scaled_mm(a8, b8t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast, **kw)

    def epilogue(y):                     # what the fused epilogue does after the GEMM: GeLU, amax, E4M3 cast
        z = torch.nn.functional.gelu(y.float(), approximate="tanh")
        amax = z.abs().amax()
        return (z * out_scale).clamp(-448.0, 448.0).to(e4m3), amax

    epilogue_compiled = torch.compile(epilogue)
    ab = fk.quantize(x, fmt="e4m3", recipe=_fp8.BlockScaling())
    bb = fk.quantize(w, fmt="e4m3", recipe=_fp8.BlockScaling(), weight=True)
    return {
        "fp8_gemm": {"fusedkit": lambda: fk.fp8_gemm(a, b, use_split_accumulator=True),
                     "cublaslt": lt(False)},
        "fp8_gemm_fast": {"fusedkit": lambda: fk.fp8_gemm(a, b, use_split_accumulator=False),
                          "cublaslt": lt(True)},
        "fp8_gemm_block": {"fusedkit": lambda: fk.fp8_gemm(ab, bb),
                           "fusedkit_per_tensor": lambda: fk.fp8_gemm(a, b, use_split_accumulator=True)},
        "fp8_gemm_epilogue": {
            "fusedkit": lambda: fk.fp8_gemm(a, b, bias=bias, activation="gelu", out_dtype="e4m3",
                                            out_scale=out_scale, use_split_accumulator=True),
            "cublaslt+eager": lambda: epilogue(lt(False, bias=bias)()),
            "cublaslt+compile": lambda: epilogue_compiled(lt(False, bias=bias)())},
    }


def gemm_rows(torch, timer, rows=None, rounds=3):
    """TFLOP/s of the fp8_gemm ops at GEMM_WORK (shape recorded as [M, K, N], as the issue lists them),
    appended to rows as measured. Each op's implementations are timed `rounds` times, interleaved, and
    keep their fastest median: one timing of one GEMM moved by up to 10 % within a call (run 052859Z:
    fast 16384 x 4096 x 14336 read 1136 TFLOP/s in the benchmark and 1263 in the sweep after it)."""
    rows = [] if rows is None else rows
    flops = _registry.OPS["fp8_gemm"].flops
    for (M, K, N) in GEMM_WORK:
        try:
            ops = _gemm_impls(torch, M, K, N)
        except Exception as e:  # noqa: BLE001 - reported, never faked
            print(f"  fp8_gemm {M}x{K}x{N} setup failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            continue
        for op, impls in ops.items():
            for impl, ts in time_rounds(timer, op, impls, rounds).items():
                rows.append({"op": op, "shape": [M, K, N], "dtype": "e4m3", "impl": impl, "ms": min(ts),
                             "GBps": None, "TFLOPs": flops(M, N, K) / min(ts) / 1e9, "ms_rounds": ts})
                print(f"  {op} {M}x{K}x{N} {impl:18s} {rows[-1]['TFLOPs']:7.0f} TFLOP/s", file=sys.stderr)
        del ops
        torch.cuda.empty_cache()
    return rows


def _host_ms(torch, fn, n):
    """Host time per call of fn, n calls queued back to back (after 50 to warm up)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return t * 1e3


def overhead_rows(torch, n=2000):
    """Per-call host time of one small call (4 x 1024), launches queued back to back."""
    import cupy
    import fusedkit as fk
    xt = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    wt = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    xc = cupy.random.standard_normal((4, 1024), dtype=cupy.float32)
    wc = cupy.ones(1024, dtype=cupy.float32)
    cases = {"fusedkit_cupy": lambda: fk.layer_norm(xc, wc),
             "fusedkit_torch": lambda: fk.layer_norm(xt, wt),
             "torch_eager": lambda: torch.nn.functional.layer_norm(xt, (1024,), wt)}
    return [{"op": "layer_norm_fwd_host_overhead", "shape": [4, 1024],
             "dtype": "float32" if "cupy" in impl else "bfloat16", "impl": impl,
             "ms": _host_ms(torch, fn, n), "GBps": None, "TFLOPs": None} for impl, fn in cases.items()]


def fp8_overhead_rows(torch, n=2000):
    """Per-call host time of the FP8 casts at 4 x 1024 (torch tensors): a delayed-scaling quantize
    (fusedkit, through its call cache after the first call, against torch eager's scale, saturate, cast
    and amax) and LayerNorm with FP8 output (no call cache): whether small layers are host-bound there."""
    import fusedkit as fk
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    scale = torch.full((1,), 0.5, device="cuda")

    def eager_quantize():
        return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), x.abs().amax().float()
    cases = [("fp8_quantize_host_overhead", "fusedkit_torch", lambda: fk.quantize(x, fmt="e4m3", scale=scale)),
             ("fp8_quantize_host_overhead", "torch_eager", eager_quantize),
             ("layer_norm_fp8_fwd_host_overhead", "fusedkit_torch",
              lambda: fk.layer_norm(x, w, fp8_fmt="e4m3", fp8_scale=scale))]
    return [{"op": op, "shape": [4, 1024], "dtype": "bfloat16", "impl": impl, "ms": _host_ms(torch, fn, n),
             "GBps": None, "TFLOPs": None} for op, impl, fn in cases]


def gemm_overhead_rows(torch, n=1000):
    """Per-call host time of the FP8 GEMM at 256 x 256 x 256 (a few us of device work, so the host
    bounds the loop), torch tensors: the plain bf16 call, the fused epilogue (bias + GeLU + E4M3 output
    + amax), and cuBLASLt through torch._scaled_mm. A call's host time beyond the device's is what a
    training loop cannot hide when its GEMMs are small."""
    ops = _gemm_impls(torch, 256, 256, 256)
    cases = {"fusedkit": ops["fp8_gemm"]["fusedkit"], "fusedkit_epilogue": ops["fp8_gemm_epilogue"]["fusedkit"],
             "cublaslt": ops["fp8_gemm"]["cublaslt"]}
    return [{"op": "fp8_gemm_host_overhead", "shape": [256, 256, 256], "dtype": "e4m3", "impl": impl,
             "ms": _host_ms(torch, fn, n), "GBps": None, "TFLOPs": None} for impl, fn in cases.items()]


# ----------------------------------------------------------------------------------------------------
# CPU mode: the CPU backend against NumPy written by hand

def run_cpu(args):
    import fusedkit as fk
    rows = []
    rng = np.random.default_rng(0)
    shapes = [(4096, 1024), (1024, 4096)]
    prog = _progress(len(shapes) * 7, "bench (cpu)")
    for (M, N) in shapes:
        x = (rng.standard_normal((M, N)) * 0.5 - 2.3).astype(np.float32)
        w = rng.standard_normal(N).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)

        def numpy_ln():
            mu = x.mean(-1, keepdims=True)
            var = x.var(-1, keepdims=True)
            return (x - mu) / np.sqrt(var + 1e-5) * w + b

        def numpy_rms():
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

        def numpy_ln_fwdbwd():  # forward with its statistics, then dx, dweight, dbias
            mu = x.mean(-1, keepdims=True)
            rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
            xhat = (x - mu) * rstd
            y = xhat * w + b
            gd = dy * w
            dx = rstd * (gd - xhat * (gd * xhat).mean(-1, keepdims=True) - gd.mean(-1, keepdims=True))
            return y, dx, (dy * xhat).sum(0), dy.sum(0)

        def numpy_rms_fwdbwd():
            rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
            xhat = x * rstd
            y = xhat * w
            gd = dy * w
            dx = rstd * (gd - xhat * (gd * xhat).mean(-1, keepdims=True))
            return y, dx, (dy * xhat).sum(0)

        def fk_ln_fwdbwd():
            y, mean, rstd = fk.layer_norm(x, w, b, return_stats=True)
            return y, fk.layer_norm_backward(dy, x, w, mean, rstd)

        def fk_rms_fwdbwd():
            y, rstd = fk.rms_norm(x, w, return_stats=True)
            return y, fk.rms_norm_backward(dy, x, w, rstd)

        def numpy_softmax():
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        def numpy_softmax_fwdbwd():
            y = numpy_softmax()
            return y, y * (dy - (dy * y).sum(-1, keepdims=True))

        t = rng.integers(0, N, M)

        def numpy_ce_fwdbwd():  # mean loss and its gradient
            m = x.max(-1, keepdims=True)
            e = np.exp(x - m)
            s = e.sum(-1, keepdims=True)
            lse = (m + np.log(s))[:, 0]
            g = e / s
            g[np.arange(M), t] -= 1
            return (lse - x[np.arange(M), t]).mean(), g / M

        dy = rng.standard_normal((M, N)).astype(np.float32)
        for op, mine, peer in (("layer_norm_fwd", lambda: fk.layer_norm(x, w, b), numpy_ln),
                               ("rms_norm_fwd", lambda: fk.rms_norm(x, w), numpy_rms),
                               ("layer_norm_fwdbwd", fk_ln_fwdbwd, numpy_ln_fwdbwd),
                               ("rms_norm_fwdbwd", fk_rms_fwdbwd, numpy_rms_fwdbwd),
                               ("softmax_fwd", lambda: fk.softmax(x), numpy_softmax),
                               ("softmax_fwdbwd", lambda: fk.softmax_backward(dy, fk.softmax(x)),
                                numpy_softmax_fwdbwd),
                               ("cross_entropy_fwdbwd", lambda: fk.cross_entropy(x, t, return_grad=True),
                                numpy_ce_fwdbwd)):
            nbytes = _registry.OPS[op].bytes_moved(M, N, 4)
            for impl, fn in (("fusedkit_cpu", mine), ("numpy_naive", peer)):
                fn()
                ts = []
                for _ in range(5 if args.quick else 15):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                ms = statistics.median(ts) * 1e3
                rows.append({"op": op, "shape": [M, N], "dtype": "float32", "impl": impl, "ms": ms,
                             "GBps": nbytes / ms / 1e6, "TFLOPs": None})
            prog.update()
    prog.close()
    return {"device": f"cpu ({platform.processor() or platform.machine()})", "copy_GBps": None, "rows": rows}


# ----------------------------------------------------------------------------------------------------

def versions() -> dict:
    v = {"fusedkit": __version__, "python": platform.python_version(), "numpy": np.__version__}
    for mod in ("cupy", "torch", "triton", "liger_kernel", "jax"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001
            pass
    try:
        from . import _nvrtc
        v["nvrtc"] = "%d.%d" % _nvrtc.version()
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch
        v["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    return v


def run_meta(device: str) -> dict:
    """What every results JSON starts with: device, UTC date, source commit, package versions."""
    return {"device": device, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": source_commit(), "versions": versions()}


def source_commit():
    """The commit the measured code came from: $FUSEDKIT_COMMIT, else the COMMIT file that
    tools/gpu_snapshot.sh writes into its copy, else git; None when none says."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    c = os.environ.get("FUSEDKIT_COMMIT", "").strip()
    if not c and os.path.exists(os.path.join(root, "COMMIT")):
        c = open(os.path.join(root, "COMMIT")).read().strip()
    if not c:
        try:
            import subprocess
            c = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001 - no git: the commit is unknown, not guessed
            c = ""
    return c or None


def table(res) -> str:
    """ms | GB/s | of copy | speedup of fusedkit over each peer, per (op, shape)."""
    copy = res.get("copy_GBps")
    groups: dict = {}
    for r in res["rows"]:
        groups.setdefault((r["op"], tuple(r["shape"])), {})[r["impl"]] = r
    lines = [f"device: {res['device']}" + (f"   copy: {copy:.0f} GB/s" if copy else "")]
    lines.append(f"{'op':30s} {'shape':>14s} {'impl':16s} {'ms':>9s} {'GB/s':>7s} {'of copy':>7s} {'fk speedup':>10s}")
    for (op, shape), impls in groups.items():
        mine = next((impls[k] for k in ("fusedkit", "fusedkit_cpu") if k in impls), None)
        for impl, r in impls.items():
            gb = r["GBps"]
            frac = f"{gb / copy:.3f}" if (gb and copy) else ""
            sp = f"{r['ms'] / mine['ms']:.2f}x" if (mine and r is not mine and "overhead" not in op) else ""
            ms = f"{r['ms'] * 1e3:.2f}us" if "overhead" in op else f"{r['ms']:.4f}"
            lines.append(f"{op:30s} {str(list(shape)):>14s} {impl:16s} {ms:>9s} "
                         f"{(f'{gb:.0f}' if gb else ''):>7s} {frac:>7s} {sp:>10s}")
    return "\n".join(lines)


def chart(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in res["rows"] if r["GBps"]]
    copy = res.get("copy_GBps") or 1.0
    keys = sorted({(r["op"], tuple(r["shape"])) for r in rows}, key=lambda k: (k[0], k[1][1]))
    impls = sorted({r["impl"] for r in rows}, key=lambda s: (not s.startswith("fusedkit"), s))
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.9), 4.5))
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        vals = []
        for k in keys:
            r = next((r for r in rows if (r["op"], tuple(r["shape"])) == k and r["impl"] == impl), None)
            vals.append(r["GBps"] / copy if r else 0)
        ax.bar([j + i * width for j in range(len(keys))], vals, width, label=impl)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"{op}\n{s[0]}x{s[1]}" for op, s in keys], rotation=60, fontsize=7, ha="right")
    ax.set_ylabel("fraction of copy bandwidth" if res.get("copy_GBps") else "GB/s")
    ax.set_title(f"fusedkit bench, {res['device']}, {res['date'][:10]}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fusedkit bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results", help="folder for the results JSON and PNG")
    p.add_argument("--quick", action="store_true", help="one shape, fewer repetitions")
    p.add_argument("--cpu", action="store_true", help="benchmark the CPU backend even if a GPU is present")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="GPU: time every (op, shape)'s implementations R times, interleaved, and keep each "
                        "one's fastest median (ms_rounds in the JSON lists them all)")
    p.add_argument("--only", default="", metavar="PATTERNS",
                   help="comma-separated substrings of op names: run only the matching ops (GPU; 'overhead' "
                        "selects the host-time rows), e.g. --only softmax,cross_entropy")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give 1 or more rounds")
    gpu = False
    if not args.cpu:
        try:
            import torch
            gpu = torch.cuda.is_available()
        except ImportError:
            gpu = False
    measured = run_gpu(args) if gpu else run_cpu(args)
    res = {**run_meta(measured["device"]), "copy_GBps": measured["copy_GBps"], "rows": measured["rows"]}
    if "partial" in measured:  # stopped by SIGTERM: the rows measured before it
        res["partial"] = measured["partial"]
    if gpu:
        res["rounds"] = args.rounds
        res["torch_compile_fresh"] = True  # torch._dynamo.reset() before every (op, shape): see run_gpu
    nvrtc_opts = os.environ.get("FUSEDKIT_NVRTC_OPTIONS", "").strip()
    if nvrtc_opts:  # an experiment, not the code as committed (tools/readme_table.py skips these)
        res["experiment"] = {"FUSEDKIT_NVRTC_OPTIONS": nvrtc_opts}
    os.makedirs(args.out, exist_ok=True)
    stem = "{}_{}".format(res["device"].split(" (")[0].replace(" ", "-"),
                          res["date"].replace(":", "").replace("+0000", "Z"))
    if "experiment" in res:
        stem += "_experiment"
    path = os.path.join(args.out, stem + ".json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    png = chart(res, os.path.join(args.out, stem + ".png"))
    print(table(res))
    print(f"results: {path}" + (f"   chart: {png}" if png else ""))
    return 0
