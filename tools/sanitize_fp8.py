"""Small calls covering every FP8 kernel (per-tensor quantize delayed/current, cast-transpose with and
without vector paths, MXFP8, 1x128 and 128x128 blocks, the scale update) and the activation kernels (forward,
FP8 forward, backward; gated and not) for compute-sanitizer memcheck / racecheck. Exits non-zero on a
result that differs from the CPU reference (activations: beyond a loose tolerance)."""
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
    for shape in ((7, 13), (64, 64), (130, 72), (33, 1000)):
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
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.BlockScaling())
        check(f"1x128 {dtype} {shape}", t.data.get(), ref.quantize_blockwise(x, (1, 128), "e4m3")[0])
        t = fk.quantize(X, fmt="e4m3", recipe=fp8.BlockScaling(), weight=True)
        check(f"128x128 {dtype} {shape}", t.data.get(), ref.quantize_blockwise(x, (128, 128), "e4m3")[0])
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
