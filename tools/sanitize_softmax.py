"""Small softmax calls covering every kernel kind once (register rows with several rows per block and
with one, thread-block clusters of 2, 4 and 8 CTAs with partial chunks, the looped kernels; no mask,
causal, tensor masks with per-column and per-row bytes, both; softmax and log-softmax; both backwards;
fp16, fp32 and an fp32 output; the persistent staged forward (clusters, rings of buffers)
and backward), for compute-sanitizer memcheck /
racecheck / synccheck. CuPy arrays (no bf16: the 16-bit paths are shared with fp16). Exits non-zero on
a wrong result.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_softmax.py
"""
import cupy
import numpy as np

import fusedkit as fk
from fusedkit import reference as ref
from fusedkit.backends import cuda_softmax as cs

rng = np.random.default_rng(0)
ok = True
seen = set()


def check(what, got, want, tol):
    global ok
    g = cupy.asnumpy(got).astype(np.float64)
    w = np.asarray(want, np.float64)
    den = np.abs(w).max(-1, keepdims=True)
    den = np.where(den > 0, den, 1.0)
    err = np.abs(g - w) / den
    if not (np.isfinite(g).all() and err.max() <= tol):
        print("MISMATCH", what, float(np.nanmax(err)) if err.size else 0.0)
        ok = False


# (dtype, shape): configs from the real dispatch (see cs.fwd_config / bwd_config)
CASES = [
    ("float16", (3, 5, 7)),          # rows, vec 1, 4 rows per block
    ("float16", (2, 3, 781)),        # rows, odd N, 16 warps
    ("float16", (2, 5, 1024)),       # rows, 2 rows per block
    ("float32", (3, 4096)),          # rows, fp32
    ("float16", (2, 32768)),         # rows fwd (8 items x 16 warps), cluster 2 bwd
    ("float16", (2, 65536)),         # cluster 2 fwd, cluster 4 bwd
    ("float16", (1, 2, 262144)),     # cluster 8 fwd (512-thread CTAs) and bwd (1024-thread CTAs)
    ("float32", (2, 65536)),         # fp32 clusters
    ("float16", (2, 65544)),         # clusters with a partial last chunk
    ("float16", (2, 65537)),         # looped fwd and bwd (odd N)
    ("float32", (2, 262144)),        # looped bwd (fp32)
]
for dtype, shape in CASES:
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    X, DY = cupy.asarray(x), cupy.asarray(dy)
    N = shape[-1]
    tol = 2e-5 if dtype == "float32" else 4e-3
    seen.add(cs.fwd_config(N, np.dtype(dtype).itemsize)[0])
    seen.add(cs.bwd_config(N, np.dtype(dtype).itemsize)[0])
    # plain softmax, log-softmax, backwards
    y = fk.softmax(X, scale=0.5)
    check(f"softmax {dtype} {shape}", y, ref.softmax(x, scale=0.5), tol)
    check(f"softmax_backward {dtype} {shape}", fk.softmax_backward(DY, y, scale=0.5),
          ref.softmax_backward(dy, cupy.asnumpy(y), scale=0.5), tol)
    yl = fk.log_softmax(X)
    check(f"log_softmax {dtype} {shape}", yl, ref.log_softmax(x), tol * 50)
    check(f"log_softmax_backward {dtype} {shape}", fk.log_softmax_backward(DY, yl),
          ref.log_softmax_backward(dy, cupy.asnumpy(yl)), tol * 10)
    if dtype == "float16":
        check(f"softmax fp32 out {shape}", fk.softmax(X, out_dtype="float32"), ref.softmax(x, out_dtype=np.float32), 2e-5)
    # masks: causal (rows = x.shape[-2] when 2-D+), per-column mask broadcast over dim 0, per-row mask, both
    if len(shape) >= 2:
        check(f"causal {dtype} {shape}", fk.softmax(X, causal=True), ref.softmax(x, causal=True), tol)
        m_col = rng.random((1,) + shape[1:]) < 0.3
        m_row = rng.random(shape[:-1] + (1,)) < 0.3
        for name, m, causal in (("mask", m_col, False), ("row mask", m_row, False), ("mask+causal", m_col, True)):
            y = fk.softmax(X, mask=cupy.asarray(m), causal=causal)
            check(f"{name} {dtype} {shape}", y, ref.softmax(x, mask=m, causal=causal), tol)
# the persistent staged forward: each CTA walks several rows (grid capped), a partial last chunk, a
# cluster of 16 whose last CTA holds nothing; rings of 2 to 4 buffers (rows loaded ahead) the same
cs.STAGED_MAX_GRID = 2
real_fwd_config = cs.fwd_config
for shape, cfg in (((5, 65536), ("staged", 8, 8, 32, 1)), ((5, 65544), ("staged", 8, 8, 32, 2)),
                   ((5, 800), ("staged", 8, 1, 1, 16)), ((5, 65544), ("staged", 8, 8, 32, 2, 2)),
                   ((5, 800), ("staged", 8, 1, 1, 16, 4)), ((5, 4104), ("staged", 8, 2, 4, 4, 3))):
    cs.fwd_config, cs._fwd_plans = (lambda *a, cfg=cfg, **k: cfg), {}
    x = (rng.standard_normal(shape) * 2).astype("float16")
    check(f"staged softmax {cfg} {shape}", fk.softmax(cupy.asarray(x), scale=0.5), ref.softmax(x, scale=0.5), 4e-3)
    seen.add("staged")
cs.fwd_config, cs._fwd_plans = real_fwd_config, {}
# the staged backward (y and dy staged): the same walks, softmax and log-softmax
real_bwd_config = cs.bwd_config
for shape, cfg in (((5, 65536), ("staged", 8, 4, 32, 2)), ((5, 65544), ("staged", 8, 4, 32, 4)),
                   ((5, 800), ("staged", 8, 1, 1, 16)), ((5, 65544), ("staged", 8, 4, 32, 4, 2))):
    cs.bwd_config, cs._bwd_plans = (lambda *a, cfg=cfg, **k: cfg), {}
    x = (rng.standard_normal(shape) * 2).astype("float16")
    dy = rng.standard_normal(shape).astype("float16")
    X, DY = cupy.asarray(x), cupy.asarray(dy)
    y, yl = fk.softmax(X, scale=0.5), fk.log_softmax(X)
    check(f"staged softmax_backward {cfg} {shape}", fk.softmax_backward(DY, y, scale=0.5),
          ref.softmax_backward(dy, cupy.asnumpy(y), scale=0.5), 4e-3)
    check(f"staged log_softmax_backward {cfg} {shape}", fk.log_softmax_backward(DY, yl),
          ref.log_softmax_backward(dy, cupy.asnumpy(yl)), 4e-2)
cs.bwd_config, cs._bwd_plans, cs.STAGED_MAX_GRID = real_bwd_config, {}, None
cupy.cuda.Device().synchronize()
if seen != {"rows", "cluster", "looped", "staged"}:
    print("kernel kinds covered:", sorted(seen), "(clusters need sm_90)")
print("sanitize_softmax:", "ok" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
