"""Small FP8 GEMM calls covering every path of cuda/fp8_gemm_sm90.cu (fast / split / block accumulation,
128- and 256-wide tiles, tile edges in M, N and K, more tiles than SMs, every output type, bias,
activation, accumulate_into, FP8 output with amax, direct and staged output stores, the stream-K tail) and
the fallback,
for compute-sanitizer:

    compute-sanitizer --tool memcheck  python3 tools/sanitize_gemm.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_gemm.py --small
    compute-sanitizer --tool synccheck python3 tools/sanitize_gemm.py --small

Exits non-zero when a result is off the float64 reference (relative Frobenius error above 1e-3, 1e-2
for fast accumulation and bf16 outputs) or an FP8 output differs from the CPU cast of the same call's
fp32 output. Operands are quantized on the CPU (reference quantizers) and copied to the device.
"""
import os
import sys

import cupy
import numpy as np

import fusedkit as fk
from fusedkit.backends import cuda_gemm
from fusedkit.fp8.tensor import FP8Tensor
from fusedkit.reference import fp8 as rfp8
from fusedkit.reference import gemm as ref

small = "--small" in sys.argv
rng = np.random.default_rng(0)
ok = True
n_calls = 0


def operands(M, N, K, fa, fb, block):
    x = (rng.standard_normal((M, K)) * np.exp(rng.standard_normal((M, 1)))).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    if block:
        da, sa = rfp8.quantize_blockwise(x, (1, 128), fa)
        db, sb = rfp8.quantize_blockwise(w, (128, 128), fb)
        host = (FP8Tensor(da, sa, fa, mode="block", block=(1, 128)),
                FP8Tensor(db, sb, fb, mode="block", block=(128, 128)))
    else:
        da, sa, _, _ = rfp8.quantize_current(x, fa)
        db, sb, _, _ = rfp8.quantize_current(w, fb)
        host = FP8Tensor(da, sa, fa), FP8Tensor(db, sb, fb)
    dev = tuple(FP8Tensor(cupy.asarray(t.data), cupy.asarray(np.asarray(t.scale_inv, np.float32).reshape(
        (1,) if t.mode == "tensor" else np.shape(t.scale_inv))), t.fmt, mode=t.mode, block=t.block) for t in host)
    return host, dev


def rel(got, want):
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)


def check(name, cond):
    global ok
    if not cond:
        print("MISMATCH", name)
        ok = False


dev = cupy.cuda.runtime.getDevice()
print(f"kernel path: {cuda_gemm.supported(dev)} (compute capability "
      f"{cupy.cuda.Device(dev).compute_capability}); SMs {cupy.cuda.Device(dev).attributes['MultiProcessorCount']}")
shapes = [(16, 16, 16), (144, 272, 208), (256, 384, 512)] + ([] if small else [(2048, 2048, 144), (4096, 4112, 144)])
for (M, N, K) in shapes:
    for fa, fb in list(cuda_gemm.PAIRS) + [("e5m2", "e5m2")]:
        for mode in ("split", "fast", "block"):
            (ha, hb), (da, db) = operands(M, N, K, fa, fb, mode == "block")
            bias = rng.standard_normal(N).astype(np.float32)
            act = ("gelu", "relu", None)[n_calls % 3]
            kw = dict(use_split_accumulator=mode != "fast", activation=act)
            want = ref.fp8_gemm(ha, hb, out_dtype="float32", bias=bias, activation=act)
            got = fk.fp8_gemm(da, db, out_dtype="float32", bias=cupy.asarray(bias), **kw)
            tol = 1e-2 if mode == "fast" else 1e-3
            e = rel(got.get(), want)
            check(f"{fa}x{fb} {mode} {(M, N, K)} act={act}: rel err {e:.2e}", e < tol)
            # accumulate_into (fp32, in place)
            c0 = rng.standard_normal((M, N)).astype(np.float32)
            C = cupy.asarray(c0)
            fk.fp8_gemm(da, db, out_dtype="float32", accumulate_into=C, use_split_accumulator=mode != "fast")
            e = rel(C.get(), ref.fp8_gemm(ha, hb, out_dtype="float32", accumulate_into=c0.copy()))
            check(f"{fa}x{fb} {mode} {(M, N, K)} accumulate: rel err {e:.2e}", e < tol)
            # FP8 output: bytes equal the CPU cast of the fp32 output, amax exact
            v32 = got.get()
            for fmt in ("e4m3", "e5m2"):
                t = fk.fp8_gemm(da, db, out_dtype=fmt, out_scale=0.5, bias=cupy.asarray(bias), **kw)
                if (fa, fb) in cuda_gemm.PAIRS and cuda_gemm.supported(dev):
                    check(f"{fa}x{fb} {mode} {(M, N, K)} -> {fmt} bytes",
                          np.array_equal(t.data.get(), rfp8.cast_to_fp8(v32 * np.float32(0.5), fmt)))
                    check(f"{fa}x{fb} {mode} {(M, N, K)} -> {fmt} amax",
                          np.float32(t.amax.get()[0]) == np.abs(v32).max().astype(np.float32))
            n_calls += 1
# two-CTA clusters (B multicast), forced: odd and even tile-row counts
for (M, N, K) in [] if os.environ.get("FK_NO_CLUSTER") else [(144, 272, 208), (272, 400, 384)]:
    for mode in ("split", "fast", "block"):
        (ha, hb), (da, db) = operands(M, N, K, "e4m3", "e4m3", mode == "block")
        with cuda_gemm.forced_tiles(fast=(256, 2), split=(128, 2), block=(128, 2)):
            got = fk.fp8_gemm(da, db, out_dtype="float32", use_split_accumulator=mode != "fast")
        e = rel(got.get(), ref.fp8_gemm(ha, hb, out_dtype="float32"))
        check(f"cluster 2 {mode} {(M, N, K)}: rel err {e:.2e}", e < (1e-2 if mode == "fast" else 1e-3))
        n_calls += 1
# staged stores (shared memory + TMA stores), forced: FP8 outputs (and bf16 through torch, CuPy has no
# bf16) equal the direct stores' bytes (tile edges in M and N, several tiles per CTA, two rounds per slab
# at BN = 256)
try:
    import torch
    has_torch = torch.cuda.is_available()
except ImportError:
    has_torch = False
STAGED = {"fast": [(256, 1, "staged"), (256, 1, "whole"), (128, 1, "staged")], "split": [(128, 1, "staged")],
          "block": [(128, 1, "staged")]}


def staged_outputs(da, db, kw):
    outs = [fk.fp8_gemm(da, db, out_dtype=f, out_scale=0.5, **kw) for f in ("e4m3", "e5m2")]
    res = [(t.fmt.name, t.data.get(), t.amax.get()) for t in outs]
    if has_torch:
        ta, tb = (FP8Tensor(torch.as_tensor(t.data, device="cuda"), torch.as_tensor(t.scale_inv, device="cuda"),
                            t.fmt, mode=t.mode, block=t.block) for t in (da, db))
        y = fk.fp8_gemm(ta, tb, out_dtype="bfloat16", **{**kw, "bias": torch.as_tensor(kw["bias"], device="cuda")})
        res.append(("bfloat16", y.view(torch.int16).cpu().numpy(), None))
    return res


for (M, N, K) in [] if os.environ.get("FK_STORES") == "none" else (
        [(144, 272, 208), (272, 400, 384)] + ([] if small else [(4224, 4112, 256)])):
    for mode, tiles in STAGED.items():
        (ha, hb), (da, db) = operands(M, N, K, "e4m3", "e4m3", mode == "block")
        bias = cupy.asarray(rng.standard_normal(N).astype(np.float32))
        kw = dict(use_split_accumulator=mode != "fast", activation="gelu", bias=bias)
        for bn, cluster, store in tiles:
            with cuda_gemm.forced_tiles(**{mode: (bn, 1)}):
                direct = staged_outputs(da, db, kw)
            with cuda_gemm.forced_tiles(**{mode: (bn, cluster, store)}):
                staged = staged_outputs(da, db, kw)
            for (name, d, da_max), (_, t, ta_max) in zip(direct, staged):
                check(f"staged {store} BN={bn} {mode} {(M, N, K)} {name} bytes", np.array_equal(d, t))
                if da_max is not None:
                    check(f"staged {store} BN={bn} {mode} {(M, N, K)} {name} amax", np.array_equal(da_max, ta_max))
            n_calls += 1
# the stream-K tail (forced): more tiles than SMs and a partial last wave, so tiles split between two CTAs
# are joined through global memory (partials, flags); FP8 bytes equal the same walk's fp32 output cast
sms = cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
for mode, bn, store in ([] if os.environ.get("FK_STORES") == "none" else
                        [("split", 128, "staged"), ("block", 128, "staged"), ("fast", 256, "whole"),
                         ("fast", 256, "staged")]):
    M, N, K = 128 * (sms // 16 + 1) - 48, 16 * bn - 16, 256 - 16   # M, N, K: multiples of 16
    (ha, hb), (da, db) = operands(M, N, K, "e4m3", "e4m3", mode == "block")
    kw = dict(use_split_accumulator=mode != "fast")
    with cuda_gemm.forced_tiles(**{mode: (bn, 1, store, "sk")}):
        v32 = fk.fp8_gemm(da, db, out_dtype="float32", **kw).get()
        t = fk.fp8_gemm(da, db, out_dtype="e4m3", out_scale=0.5, **kw)
    e = rel(v32, ref.fp8_gemm(ha, hb, out_dtype="float32"))
    check(f"stream-K {mode} {(M, N, K)}: rel err {e:.2e}", e < (1e-2 if mode == "fast" else 1e-3))
    check(f"stream-K {mode} {(M, N, K)} -> e4m3 bytes",
          np.array_equal(t.data.get(), rfp8.cast_to_fp8(v32 * np.float32(0.5), "e4m3")))
    n_calls += 1
# bf16 output and bf16 bias (torch)
try:
    import torch
    if torch.cuda.is_available():
        for mode in ("split", "fast", "block"):
            (ha, hb), _ = operands(144, 272, 256, "e4m3", "e4m3", mode == "block")
            ta, tb = (FP8Tensor(torch.from_numpy(h.data).cuda(),
                                torch.from_numpy(np.asarray(h.scale_inv, np.float32).reshape(
                                    (1,) if h.mode == "tensor" else np.shape(h.scale_inv))).cuda(),
                                h.fmt, mode=h.mode, block=h.block) for h in (ha, hb))
            bias = torch.randn(272, device="cuda").to(torch.bfloat16)
            out = fk.fp8_gemm(ta, tb, bias=bias, activation="gelu", use_split_accumulator=mode != "fast")
            want = ref.fp8_gemm(ha, hb, out_dtype="float32", bias=bias.float().cpu().numpy(), activation="gelu")
            e = rel(out.float().cpu().numpy(), want)
            check(f"torch bf16 {mode}: rel err {e:.2e}", e < 1e-2)
            acc = torch.zeros(144, 272, device="cuda", dtype=torch.bfloat16)
            fk.fp8_gemm(ta, tb, accumulate_into=acc, use_split_accumulator=mode != "fast")
            e = rel(acc.float().cpu().numpy(), ref.fp8_gemm(ha, hb, out_dtype="float32"))
            check(f"torch bf16 accumulate {mode}: rel err {e:.2e}", e < 1e-2)
        torch.cuda.synchronize()
except ImportError:
    pass
cupy.cuda.runtime.deviceSynchronize()
print("sanitize_gemm:", "ok" if ok else "MISMATCHES", f"({n_calls} configurations)")
sys.exit(0 if ok else 1)
