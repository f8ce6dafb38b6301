"""Small calls covering every FP8 kernel (per-tensor quantize delayed/current, cast-transpose with and
without vector paths, cast_transpose_dbias, dact_cast_transpose (plain and gated), MXFP8 row- and
column-wise, 1x128 and 128x128 blocks, the scale update, dequantize of each mode) and the activation kernels (forward, FP8
forward, backward; gated and not) for compute-sanitizer memcheck / racecheck. Exits non-zero on a result
that differs from the CPU reference (activations: beyond a loose tolerance)."""
import cupy
import numpy as np

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref

rng = np.random.default_rng(0)
ok = True


def check(name, got, want):
    global ok
    if not np.array_equal(np.asarray(got), np.asarray(want)):
        print("MISMATCH", name)
        ok = False


for dtype in ("float32", "float16"):
    for shape in ((7, 13), (64, 64), (130, 72), (33, 1000), (40, 384)):  # (40, 384): the flat 1 x 128 walk
        x = (rng.standard_normal(shape) * 50).astype(dtype)
        X = cupy.asarray(x)
        t = fk.quantize(X, fmt="e4m3", scale=0.5)
        check(f"quantize {dtype} {shape}", t.data.get(), ref.quantize_delayed(x, 0.5, "e4m3")[0])
        t = fk.quantize(X, fmt="e5m2")
        check(f"quantize current {dtype} {shape}", t.data.get(), ref.quantize_current(x, "e5m2")[0])
        t = fk.cast_transpose(X, fmt="e4m3", scale=0.5)
        d = ref.quantize_delayed(x, 0.5, "e4m3")[0]
        check(f"cast_transpose {dtype} {shape}", t.data_t.get(), ref.transpose_2d(d))
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.MXFP8Scaling())
        check(f"mxfp8 {dtype} {shape}", t.scale_inv.get(), ref.quantize_mxfp8(x, "e4m3")[1])
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.MXFP8Scaling(), columnwise=True)
        check(f"mxfp8 columnwise {dtype} {shape}", t.data.get(), ref.quantize_mxfp8_columnwise(x, "e4m3")[0])
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.BlockScaling())
        check(f"1x128 {dtype} {shape}", t.data.get(), ref.quantize_blockwise(x, (1, 128), "e4m3")[0])
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.BlockScaling(), weight=True)
        check(f"128x128 {dtype} {shape}", t.data.get(), ref.quantize_blockwise(x, (128, 128), "e4m3")[0])
        # dequantize (cuda/fp8_dequantize.cu) of every scaling mode, vector and scalar paths
        for rec, kw in ((None, {}), (fp8.MXFP8Scaling(), {}), (fp8.MXFP8Scaling(), {"columnwise": True}),
                        (fp8.BlockScaling(), {}), (fp8.BlockScaling(), {"weight": True})):
            t = fk.quantize(X, fmt="e4m3", recipe=rec, **kw)
            host = fp8.FP8Tensor(t.data.get(), t.scale_inv.get() if hasattr(t.scale_inv, "get") else t.scale_inv,
                                 t.fmt, mode=t.mode, block=t.block)
            want = host.dequantize(np.float32)
            got = fk.dequantize(t, "float32").get()
            check(f"dequantize {t.mode} {t.block} {dtype} {shape}", np.nan_to_num(got), np.nan_to_num(want))
# fp8_ct_tile: cast_transpose (fast path), cast_transpose_dbias (16-byte and scalar loads, several blocks
# per column strip), dact_cast_transpose (fused, and the fp32-g fallback), delayed and current scaling
for dtype in ("float32", "float16"):
    for shape in ((136, 264), (384, 256), (130, 72), (257, 96), (1100, 100), (33, 13), (0, 16)):
        x = (rng.standard_normal(shape) * 50).astype(dtype)
        X = cupy.asarray(x)
        d = ref.quantize_delayed(x, 0.5, "e4m3")[0]
        t = fk.cast_transpose(X, fmt="e4m3", scale=0.5)
        check(f"cast_transpose {dtype} {shape}", t.data_t.get(), ref.transpose_2d(d))
        t, db = fk.cast_transpose_dbias(X, fmt="e4m3", scale=0.5)
        check(f"cast_transpose_dbias {dtype} {shape}", t.data_t.get(), ref.transpose_2d(d))
        if not np.allclose(db.get().astype(np.float64), x.astype(np.float64).sum(0), rtol=2e-3, atol=1e-2 * shape[0]):
            print("MISMATCH dbias", dtype, shape)
            ok = False
        dy = (rng.standard_normal(shape) * 4).astype(dtype)
        DY = cupy.asarray(dy)
        for act in ("relu", "gelu"):
            t, db = fk.dact_cast_transpose(DY, X, activation=act, scale=8.0, dbias=True)
            want = ref.dact_cast_transpose(dy, x, act, "e5m2", 8.0)
            if act == "relu":
                check(f"dact relu {dtype} {shape}", t.data_t.get(), want[1])
            t.data.get()
            t = fk.dact_cast_transpose(DY, X, activation=act)  # current scaling
            t.data.get()
        # gated (ReGLU exact, SwiGLU run): x = [a | b] of twice dy's width H; fused at H = 128, 48 (a tile
        # across the halves), 8 (M = 0), the fp32-g fallback at H = 132, 36, 50
        if shape[1] % 2 == 0:
            half = np.ascontiguousarray(dy[:, : shape[1] // 2])
            for act in ("reglu", "swiglu"):
                t, db = fk.dact_cast_transpose(cupy.asarray(half), X, activation=act, scale=8.0, dbias=True)
                if act == "reglu":
                    want = ref.dact_cast_transpose(half, x, act, "e5m2", 8.0)
                    check(f"dact reglu {dtype} {shape}", t.data_t.get(), want[1])
                t.data.get()
                fk.dact_cast_transpose(cupy.asarray(half), X, activation=act).data.get()  # current scaling
                t = fk.dact_cast_transpose(cupy.asarray(half), X, activation=act, scale=8.0)  # paired blocks
                if act == "reglu":
                    check(f"dact reglu paired {dtype} {shape}", t.data_t.get(), want[1])
h = np.abs(rng.standard_normal((16, 100))).astype(np.float32)
s = np.ones(100, np.float32)
H, S = cupy.asarray(h), cupy.asarray(s)
fp8.update_scales(H, S)
want_h, amax = fp8.update_amax_history(h)
check("update_scales", S.get(), fp8.delayed_scale(amax, s, 448.0))
from fusedkit.reference import activations as ref_act  # noqa: E402
for shape in ((5, 14), (33, 256)):
    x = rng.standard_normal(shape).astype(np.float32)
    X = cupy.asarray(x)
    for name in ("gelu", "silu", "swiglu", "reglu"):
        kind = "gelu_tanh" if name == "gelu" else name
        y = getattr(fk, name)(X).get()
        if not np.allclose(y, ref_act.forward(x, kind), rtol=1e-4, atol=1e-5):
            print("MISMATCH", name, shape)
            ok = False
        dy = cupy.ones(y.shape, np.float32)
        dx = getattr(fk, name + "_backward")(dy, X).get()
        if not np.allclose(dx, ref_act.backward(np.ones(y.shape, np.float32), x, kind), rtol=1e-4, atol=1e-5):
            print("MISMATCH", name + "_backward", shape)
            ok = False
        t = getattr(fk, name)(X, fp8_fmt="e4m3", fp8_scale=4.0)
        t.data.get()
cupy.cuda.Device().synchronize()
print("sanitize_fp8:", "ok" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
