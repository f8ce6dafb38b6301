"""Small cross-entropy calls covering every kernel variant once (rows in one block's registers with
1..16 warps and several rows per block, clusters of 2, 4 and 8 CTAs with 32 and 64 values per thread,
the looped kernel, scalar vectors for odd vocabs and misaligned views, the backward from lse, the
count and sum reductions with one block and with block partials, in-place gradients, int32 and int64
targets, ignored and out-of-range targets; the staged and persistent kernels, row chunks bulk-copied into shared memory,
at cluster sizes 1-8, down to CTAs with an empty chunk) on CuPy, for compute-sanitizer memcheck /
racecheck / synccheck. Exits non-zero on a result that differs from the CPU reference beyond a loose tolerance.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cross_entropy.py
"""
import cupy
import numpy as np

import fusedkit as fk
from fusedkit._dtypes import ITEMSIZE
from fusedkit.backends import cuda_cross_entropy as ce
from fusedkit.reference import cross_entropy as ref

rng = np.random.default_rng(0)
ok = True
seen = set()


def check(name, got, want, tol):
    global ok
    g = np.asarray(cupy.asnumpy(got), np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape or not np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
        err = np.nanmax(np.abs(g - w)) if g.shape == w.shape else "shape"
        print("MISMATCH", name, err)
        ok = False


def targets(M, N, t_dtype):
    t = rng.integers(0, N, M)
    t[rng.random(M) < 0.2] = -100
    t[0] = 0
    return t.astype(t_dtype)


def run(M, N, dtype, t_dtype="int64", offset=0, reduction="mean", inplace=False):
    tol = 2e-2 if dtype == "float16" else 1e-4
    buf = (rng.standard_normal(M * N + offset) * 2).astype(dtype)
    x = buf[offset:].reshape(M, N)
    t = targets(M, N, t_dtype)
    X = cupy.asarray(buf)[offset:].reshape(M, N)
    T = cupy.asarray(t)
    loss, lse, grad = fk.cross_entropy(X, T, label_smoothing=0.1, z_loss=1e-4, reduction=reduction,
                                       return_lse=True, return_grad=True, inplace_grad=inplace)
    g2 = fk.cross_entropy_backward(cupy.ones((), cupy.float32), cupy.asarray(x), T, lse,
                                   label_smoothing=0.1, z_loss=1e-4, reduction=reduction)
    cupy.cuda.Device().synchronize()
    wl, wlse, wg = ref.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-4, reduction=reduction,
                                     return_lse=True, return_grad=True)
    name = f"{M}x{N} {dtype} {t_dtype} offset={offset} {reduction} inplace={inplace}"
    check(name + " loss", loss, wl, 1e-4)
    check(name + " lse", lse, wlse, 1e-4)
    check(name + " grad", grad, wg, tol)
    check(name + " backward", g2, wg, tol)
    seen.add(ce.fwd_expr(ce.fwd_config(N, ITEMSIZE[dtype], ce.clusters_ok(0), 16 if offset == 0 else 1), dtype))


cases = [(9, 1), (13, 7), (5, 781), (33, 1024), (3, 4096), (2, 16384), (3, 32768), (2, 50257), (2, 65536),
         (2, 131072), (2, 262144)]
for dtype in ("float16", "float32"):
    for (M, N) in cases:
        run(M, N, dtype)
run(3, 32768, "float16", t_dtype="int32", reduction="sum", inplace=True)
run(3, 131072, "float16", reduction="none", inplace=True)
run(3, 4096, "float16", offset=3)
run(70001, 3, "float32")                      # reductions with block partials
# the looped kernel at every size class
plain = ce.fwd_config
ce.fwd_config = lambda N, s, cluster=True, max_vec=16: ("looped", ce.vec_width(N, s, max_vec))
ce._plans.clear()
for (M, N) in ((5, 7), (3, 32768), (2, 262144)):
    run(M, N, "float16", inplace=True)
ce.fwd_config = plain
ce._plans.clear()
# the register kernels (rows in one block, clusters of 2-8 CTAs) where the staged kernel would run
staged_min = ce.STAGED_MIN_BYTES
ce.STAGED_MIN_BYTES = 1 << 62
ce._plans.clear()
for (M, N) in ((3, 32768), (2, 131072), (2, 262144)):
    run(M, N, "float16", inplace=True)
ce.STAGED_MIN_BYTES = staged_min
# the staged kernel at every cluster size, down to CTAs with an empty chunk (N = 8 over 8 CTAs)
saved = (ce.STAGED_MIN_BYTES, ce.STAGED_CLUSTERS, ce.STAGE_CHUNK_BYTES)
ce.STAGED_MIN_BYTES, ce.STAGE_CHUNK_BYTES, ce.STAGED_MAX_GROUPS = 0, 1 << 30, 2  # clusters walk rows
for c in (1, 2, 4, 8):
    for ce.STAGED_BUFFERS in (1, 2):
        ce.STAGED_CLUSTERS = (c,)
        ce._plans.clear()
        for (M, N) in ((5, 8), (3, 50264)):
            run(M, N, "float16", inplace=(c % 4 == 0))
ce.STAGED_BUFFERS = 1
ce.STAGED_MIN_BYTES, ce.STAGED_CLUSTERS, ce.STAGE_CHUNK_BYTES = saved
# the persistent kernel (forced): clusters walking rows, an empty chunk (N = 8 over 4 CTAs), uneven chunks
for N, cfg in ((8, ("persistent", 8, 1, 1, 4)), (50264, ("persistent", 8, 4, 16, 4)),
               (32768, ("persistent", 8, 8, 16, 1)), (50264, ("persistent", 8, 4, 16, 4, 3)),
               (8, ("persistent", 8, 1, 1, 4, 2))):
    ce.fwd_config = lambda *a, cfg=cfg, **k: cfg
    ce._plans.clear()
    run(5, N, "float16", inplace=N == 50264)
ce.fwd_config = plain
ce.STAGED_MAX_GROUPS = None
ce._plans.clear()
# an out-of-range target: NaN loss, zero gradient row, no fault
X = cupy.asarray(rng.standard_normal((2, 32768)).astype(np.float16))
loss, grad = fk.cross_entropy(X, cupy.asarray([5, 40000]), reduction="none", return_grad=True)
cupy.cuda.Device().synchronize()
if not (np.isnan(float(loss[1])) and not bool(grad[1].any())):
    print("MISMATCH out-of-range target")
    ok = False
print("kernels:", len(seen), "staged/register/cluster configs;", "sanitize_cross_entropy:", "ok" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
