"""Small norm calls covering every kernel kind (staged and register rows, shared-memory dbias, looped,
odd N), for compute-sanitizer memcheck / racecheck. Exits non-zero on a wrong result."""
import cupy
import numpy as np

import fusedkit as fk
from fusedkit import reference as ref
from fusedkit.backends import cuda_norms as cn

rng = np.random.default_rng(0)
ok = True
staged_ok = cn._staged_ok
for staged, dtype in ((True, "float32"), (True, "float16"), (False, "float16")):
    cn._staged_ok = staged_ok if staged else (lambda device: False)
    cn._fwd_plans.clear()
    cn._bwd_plans.clear()
    for (M, N) in ((3, 7), (5, 781), (9, 1024), (6, 4096), (2, 16384), (2, 65536), (2, 131072)):
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
print("sanitize_norms:", "ok" if ok else "FAILED")
raise SystemExit(0 if ok else 1)
