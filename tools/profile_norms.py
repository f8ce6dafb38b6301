"""A few norm launches for ncu, then a cProfile of the per-call host path (4 x 1024, CuPy)."""
import cProfile
import pstats
import sys
import time

import cupy

import fusedkit as fk

N = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
M = 2**27 // N
x = cupy.random.standard_normal((M, N), dtype=cupy.float32).astype(cupy.float16)
w = cupy.ones(N, dtype=cupy.float16)
for _ in range(5):
    y, m, r = fk.layer_norm(x, w, w, return_stats=True)
    fk.layer_norm_backward(x, x, w, m, r)
cupy.cuda.Device().synchronize()
if "--host" in sys.argv:
    xs = cupy.random.standard_normal((4, 1024), dtype=cupy.float32)
    ws = cupy.ones(1024, dtype=cupy.float32)
    for _ in range(100):
        fk.layer_norm(xs, ws)
    t = time.perf_counter()
    for _ in range(5000):
        fk.layer_norm(xs, ws)
    print(f"host us/call: {(time.perf_counter() - t) / 5000 * 1e6:.1f}")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5000):
        fk.layer_norm(xs, ws)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)

if "--launch" in sys.argv:
    # what one CuPy launch costs with different argument kinds (4 x 1024 rms_norm kernel)
    import numpy as np
    from fusedkit.backends import cuda_norms as cn
    xs = cupy.random.standard_normal((4, 1024), dtype=cupy.float32)
    ys = cupy.empty_like(xs)
    fn, block, rpb = cn._fwd_plan(1024, "float32", "float32", "float32", True, 0, None, 16, False)
    expr = cn.fwd_expr(cn.fwd_config(1024, 4, True), "float32", "float32", "float32", True, plain_w=False)
    raw = fk._jit.get_kernel(cn.FILE, expr, 0).kernel  # CuPy's Function, for comparison
    s = cupy.cuda.get_current_stream()
    args = (xs.data.ptr, 0, 0, 0, ys.data.ptr, 0, 0, 0, 4, 1024, 1e-6, 0)
    np_args = (xs.data.ptr, 0, 0, 0, ys.data.ptr, 0, 0, 0, np.int64(4), np.int32(1024), np.float32(1e-6),
               np.int32(0))
    for name, call in (("fusedkit Launcher", lambda: fn(1, block, 0, s.ptr, *args)),
                       ("cupy Function", lambda: raw((1,), block, np_args, 0, s))):
        for _ in range(100):
            call()
        t = time.perf_counter()
        for _ in range(5000):
            call()
        print(f"launch via {name}: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        xs.flags.c_contiguous
    print(f"flags.c_contiguous: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        xs.device.id
    print(f"device.id: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        cupy.empty((4, 1024), dtype="float32")
    print(f"cupy.empty: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        cupy.cuda.get_current_stream(0)
    print(f"get_current_stream: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    import torch
    xt = torch.empty(4, 1024, device="cuda")
    t = time.perf_counter()
    for _ in range(5000):
        torch.cuda.current_stream(0).cuda_stream
    print(f"torch current_stream: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        torch.empty((4, 1024), dtype=torch.bfloat16, device=xt.device)
    print(f"torch.empty: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
    t = time.perf_counter()
    for _ in range(5000):
        (xt.data_ptr(), xt.is_contiguous(), xt.device.index, tuple(xt.shape), xt.dtype)
    print(f"torch tensor introspection: {(time.perf_counter() - t) / 5000 * 1e6:.2f} us")
