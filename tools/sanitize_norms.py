"""Small norm calls covering every kernel kind (staged and register rows, shared-memory dbias, a staged
ring refilled by one block (5 x 16384: one block walks all five rows), looped, odd N, column_sum with 8
and 32 lanes, the two-CTA backward, the cluster merge of the partial rows, FP8 output), for
compute-sanitizer memcheck / racecheck.
Exits non-zero on a wrong result."""
import cupy
import numpy as np

import fusedkit as fk
from fusedkit import _callcache, reference as ref
from fusedkit.backends import cuda_norms as cn

rng = np.random.default_rng(0)
ok = True


def drop_plans():
    """Forget the backend's launch plans and the public calls' own (fusedkit/_callcache.py), so the next
    call plans again under the settings just changed (without the second, an earlier pass's kernel ran)."""
    cn._fwd_plans.clear()
    cn._bwd_plans.clear()
    _callcache.clear()


def backward_errors(M, N, rms):
    """Relative max errors of dx, dweight (and dbias for LayerNorm) of one fp16 backward of fresh inputs
    against the CPU reference."""
    x = rng.standard_normal((M, N)).astype("float16")
    w = rng.standard_normal(N).astype("float16")
    dy = rng.standard_normal((M, N)).astype("float16")
    X, W, DY = (cupy.asarray(a) for a in (x, w, dy))
    if rms:
        _, r = fk.rms_norm(X, W, return_stats=True)
        got = fk.rms_norm_backward(DY, X, W, r)
        want = ref.rms_norm_backward(dy, x, w, cupy.asnumpy(r))
    else:
        _, m, r = fk.layer_norm(X, W, W, return_stats=True)
        got = fk.layer_norm_backward(DY, X, W, m, r)
        want = ref.layer_norm_backward(dy, x, w, cupy.asnumpy(m), cupy.asnumpy(r))
    cupy.cuda.Device().synchronize()
    return {name: np.abs(cupy.asnumpy(g).astype(np.float64) - wt).max() / (np.abs(wt).max() + 1e-30)
            for name, g, wt in zip(("dx", "dweight", "dbias"), got, want)}


staged_ok = cn._staged_ok
for staged, dtype in ((True, "float32"), (True, "float16"), (False, "float16")):
    cn._staged_ok = staged_ok if staged else (lambda device: False)
    drop_plans()
    for (M, N) in ((3, 7), (5, 781), (9, 1024), (6, 4096), (5, 16384), (2, 65536), (2, 131072)):
        x = rng.standard_normal((M, N)).astype(dtype)
        w = rng.standard_normal(N).astype(dtype)
        dy = rng.standard_normal((M, N)).astype(dtype)
        X, W, DY = (cupy.asarray(a) for a in (x, w, dy))
        y, m, r = fk.layer_norm(X, W, W, return_stats=True)
        dx, dw, db = fk.layer_norm_backward(DY, X, W, m, r)
        y2, h, r2 = fk.rms_norm(X, W, residual=X, return_stats=True)
        dx2, dw2 = fk.rms_norm_backward(DY, h, W, r2)
        cupy.cuda.Device().synchronize()
        want = ref.layer_norm(x, w, w)
        err = np.abs(y.get().astype(np.float64) - want).max()
        if not err < (1e-2 if dtype == "float16" else 1e-4):
            print("MISMATCH", "staged" if staged else "registers", dtype, M, N, err)
            ok = False
# column_sum with 8 and 32 lanes (the four-load loop and its tail), dweight and dbias against the
# reference.
cn._staged_ok = staged_ok
for lanes in (8, 32):
    cn.COLSUM_LANES = lanes
    drop_plans()
    for (M, N) in ((300, 96), (1000, 1024)):
        x = rng.standard_normal((M, N)).astype("float32")
        w = rng.standard_normal(N).astype("float32")
        dy = rng.standard_normal((M, N)).astype("float32")
        X, W, DY = (cupy.asarray(a) for a in (x, w, dy))
        _, m, r = fk.layer_norm(X, W, W, return_stats=True)
        dx, dw, db = fk.layer_norm_backward(DY, X, W, m, r)
        _, dw_want, db_want = ref.layer_norm_backward(dy, x, w, m.get(), r.get())
        cupy.cuda.Device().synchronize()
        for name, got, want in (("dweight", dw, dw_want), ("dbias", db, db_want)):
            err = np.abs(got.get().astype(np.float64) - want).max() / (np.abs(want).max() + 1e-30)
            if not err < 1e-4:
                print("MISMATCH column_sum lanes", lanes, name, M, N, err)
                ok = False
cn.COLSUM_LANES = 32
drop_plans()
# The two-CTA backward (norm_bwd_staged_pair: clusters of two CTAs sharing each row, the row sums sent
# to the peer's shared memory), forced through TUNED_PAIR for both PIPE variants, with two pairs per
# cluster adding their partial rows (MERGE 2; 1 row: a pair without rows), rows in quarters (SPLIT 4)
# and for N = 8192 (not shipped there); more rows than resident clusters.
tuned_pair = dict(cn.TUNED_PAIR)
for (M, N, pipe, merge, split) in ((5, 16384, False, 1, 2), (700, 8192, False, 1, 2), (5, 16384, True, 1, 2),
                                   (700, 8192, True, 1, 2), (1, 16384, False, 2, 2), (700, 8192, False, 2, 2),
                                   (5, 16384, False, 1, 4), (300, 8192, False, 1, 4)):
    for rms in (False, True):
        cn.TUNED_PAIR = {("rms" if rms else "ln", N, 2): cn.pair_from_half(N, 2, rms, pipe, merge, split)[2:]}
        drop_plans()
        errors = backward_errors(M, N, rms)
        if not any(p.ctas == split and p.merge == merge for p in cn._bwd_plans.values()):
            print("MISMATCH pair kernel not dispatched", M, N, rms, pipe)
            ok = False
        for name, err in errors.items():
            if not err < 2e-2:
                print("MISMATCH pair", "rms" if rms else "ln", "pipe" if pipe else "wait", name, M, N, err)
                ok = False
cn.TUNED_PAIR = tuned_pair
drop_plans()
# The staged backward with its partial rows added over a cluster (CLUSTER 2 and 4: every CTA reads the
# others' shared memory), forced through TUNED_STAGED; fewer rows than CTAs (idle CTAs add zeros),
# several row slots per block (N = 1024, two warps per row), dweight and dbias.
tuned_staged = dict(cn.TUNED_STAGED)
for cluster in cn.CLUSTER_CHOICES:
    for (M, N) in ((3, 1024), (700, 1024), (37, 4096)):
        for rms in (False, True):
            base = cn._staged_config(N, 2, rms)
            cfg = ("staged", 8, 2, 2, 2, 0) if N == 1024 else base[:6]
            cn.TUNED_STAGED = {("rms" if rms else "ln", N, 2): cfg[2:] + (cluster,)}
            drop_plans()
            errors = backward_errors(M, N, rms)
            if not any(p.merge == cluster for p in cn._bwd_plans.values()):
                print("MISMATCH cluster merge not dispatched", cluster, M, N, rms)
                ok = False
            for name, err in errors.items():
                if not err < 2e-2:
                    print("MISMATCH cluster merge", cluster, "rms" if rms else "ln", name, M, N, err)
                    ok = False
cn.TUNED_STAGED = tuned_staged
drop_plans()
# FP8 output (norm_fwd_fp8 / norm_fwd_looped_fp8): rows and looped kernels, residual, odd N, M = 0, a
# misaligned view; bytes against the cast of the kernel's own fp32 y (same row code: must be equal).
cn._staged_ok = staged_ok
for dtype in ("float32", "float16"):
    for (M, N) in ((0, 64), (3, 7), (5, 781), (9, 1024), (6, 4096), (3, 14336), (2, 16384), (2, 65536)):
        x = rng.standard_normal((M, N)).astype(dtype)
        w = rng.standard_normal(N).astype(dtype)
        X, W = cupy.asarray(x), cupy.asarray(w)
        for fmt in ("e4m3", "e5m2"):
            s = 448.0 / 4 if fmt == "e4m3" else 57344.0 / 4
            t, h, m, r = fk.layer_norm(X, W, W, residual=X, return_stats=True, fp8_fmt=fmt, fp8_scale=s)
            y32, _ = fk.layer_norm(X, W, W, residual=X, out_dtype="float32")
            t2 = fk.rms_norm(X, W, fp8_fmt=fmt, fp8_scale=cupy.full((1,), s, cupy.float32))
            y32b = fk.rms_norm(X, W, out_dtype="float32")
            cupy.cuda.Device().synchronize()
            for name, tt, yy in (("layer_norm", t, y32), ("rms_norm", t2, y32b)):
                d, sinv, amax = ref.fp8.quantize_delayed(yy.get(), s, fmt)
                if not (np.array_equal(tt.data.get(), d) and tt.scale_inv.get()[0] == sinv
                        and tt.amax.get()[0] == amax):
                    print("MISMATCH fp8", name, dtype, fmt, M, N)
                    ok = False
# One block walking every row group of the FP8 forward (the row sums' buffer parity carried across
# groups: racecheck's case).
cn.FWD_FP8_MAX_GRID = 1
for (M, N) in ((37, 1024), (9, 4096)):
    X = cupy.asarray(rng.standard_normal((M, N)).astype("float16"))
    W = cupy.asarray(rng.standard_normal(N).astype("float16"))
    for rms in (False, True):
        if rms:
            t, y32 = fk.rms_norm(X, W, fp8_fmt="e4m3", fp8_scale=50.0), fk.rms_norm(X, W, out_dtype="float32")
        else:
            t, y32 = fk.layer_norm(X, W, W, fp8_fmt="e4m3", fp8_scale=50.0), fk.layer_norm(X, W, W, out_dtype="float32")
        cupy.cuda.Device().synchronize()
        if not np.array_equal(t.data.get(), ref.fp8.quantize_delayed(y32.get(), 50.0, "e4m3")[0]):
            print("MISMATCH fp8 one block", "rms" if rms else "ln", M, N)
            ok = False
cn.FWD_FP8_MAX_GRID = None
# The non-persistent FP8 forward (FWD_FP8_WAVES = None: one row group per block, the amax merged per
# warp by atomics), amax checked too.
waves, cn.FWD_FP8_WAVES = cn.FWD_FP8_WAVES, None
for (M, N) in ((37, 1024), (9, 4096), (5, 781)):
    X = cupy.asarray(rng.standard_normal((M, N)).astype("float32"))
    for rms in (False, True):
        t = fk.rms_norm(X, fp8_fmt="e4m3", fp8_scale=50.0) if rms else fk.layer_norm(X, fp8_fmt="e4m3", fp8_scale=50.0)
        y32 = fk.rms_norm(X, out_dtype="float32") if rms else fk.layer_norm(X, out_dtype="float32")
        cupy.cuda.Device().synchronize()
        d, _, amax = ref.fp8.quantize_delayed(y32.get(), 50.0, "e4m3")
        if not (np.array_equal(t.data.get(), d) and t.amax.get()[0] == amax):
            print("MISMATCH fp8 one group per block", "rms" if rms else "ln", M, N)
            ok = False
cn.FWD_FP8_WAVES = waves
flat = cupy.asarray(rng.standard_normal(5 * 1024 + 1).astype("float32"))
Xm = flat[1:].reshape(5, 1024)
t = fk.layer_norm(Xm, fp8_fmt="e4m3", fp8_scale=100.0)
d = ref.fp8.quantize_delayed(fk.layer_norm(Xm, out_dtype="float32").get(), 100.0, "e4m3")[0]
cupy.cuda.Device().synchronize()
if not np.array_equal(t.data.get(), d):
    print("MISMATCH fp8 misaligned")
    ok = False
print("sanitize_norms:", "ok" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
