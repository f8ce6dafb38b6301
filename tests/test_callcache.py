"""The host-time fast path (fusedkit/_callcache.py): repeat calls of one signature skip validation, so
these tests repeat calls with fresh data and check every result, and check that whatever a signature
cannot vouch for (contiguity, alignment, device) still takes the full path with its errors."""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import _callcache
from _backends import assert_close, backend_params, rand, skip_unsupported, to_backend, to_numpy
from test_norms import ref64_forward


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def test_host_arrays_never_use_the_cache():
    x = np.ones((2, 8), np.float32)
    assert _callcache.norm_forward(x, None, None, 1e-5, False, None, False, False) is None


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("stats", [False, True], ids=["y", "stats"])
def test_repeat_calls_stay_correct(backend, dtype, rms, stats):
    skip_unsupported(backend, dtype)
    _callcache.clear()
    shape, eps = (37, 1024), 1e-5
    for i in range(3):  # first call plans, the next ones take the cached plan
        rng = _rng("repeat", backend, dtype, rms, stats, i)
        x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
        w = rand(rng, (shape[-1],), dtype, loc=1.0, scale=0.3)
        b = rand(rng, (shape[-1],), dtype, scale=0.3)
        X, W, B = (to_backend(a, backend) for a in (x, w, b))
        if rms:
            out = fk.rms_norm(X, W, eps=eps, return_stats=stats)
        else:
            out = fk.layer_norm(X, W, B, eps=eps, return_stats=stats)
        y = out[0] if stats else out
        y64, mean64, rstd64 = ref64_forward(x, w, None if rms else b, eps, rms)
        assert_close(y, y64, dtype, f"y (call {i})")
        if stats:
            np.testing.assert_allclose(to_numpy(out[-1]), rstd64, rtol=1e-5, err_msg=f"rstd (call {i})")
            if not rms:
                np.testing.assert_allclose(to_numpy(out[1]), mean64, atol=1e-5, rtol=1e-5)
    assert len(_callcache._plans) == 1


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
def test_cached_signature_still_rejects_and_handles_odd_views(backend):
    """After a plan exists: a strided view of the same shape raises; a misaligned view (same shape,
    pointer off by one element) falls back to the full path and is still right."""
    _callcache.clear()
    rng = _rng("odd", backend)
    x = rand(rng, (8, 64), "float32", loc=-2.3, scale=0.5)
    w = rand(rng, (64,), "float32", loc=1.0, scale=0.3)
    X, W = to_backend(x, backend), to_backend(w, backend)
    fk.rms_norm(X, W)
    fk.rms_norm(X, W)
    wide = to_backend(np.repeat(x, 2, axis=1), backend)
    with pytest.raises(ValueError, match="contiguous"):
        fk.rms_norm(wide[:, ::2], W)
    flat = to_backend(np.concatenate([[0.0], x.reshape(-1)]).astype(np.float32), backend)
    Xoff = flat[1:].reshape(8, 64)
    y = fk.rms_norm(Xoff, W)
    y64, _, _ = ref64_forward(x, w, None, 1e-6, True)
    assert_close(y, y64, "float32", "misaligned y")


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_repeat_backward_calls_match_the_full_path(backend, dtype, rms, weight):
    """The backward's cached plan (kernel + column sums into fresh buffers) gives the same bits as the
    full path on fresh data, call after call; dx also against the float64 reference."""
    skip_unsupported(backend, dtype)
    from test_norms import ref64_backward
    shape, eps = (300, 1024), 1e-5
    for i in range(3):
        rng = _rng("bwd", backend, dtype, rms, weight, i)
        x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
        dy = rand(rng, shape, dtype)
        w = rand(rng, (shape[-1],), dtype, loc=1.0, scale=0.3) if weight else None
        X, DY = to_backend(x, backend), to_backend(dy, backend)
        W = to_backend(w, backend) if weight else None
        if rms:
            _, rstd = fk.rms_norm(X, W, eps=eps, return_stats=True)
            cached = fk.rms_norm_backward(DY, X, W, rstd)
            _callcache.clear()
            full = fk.rms_norm_backward(DY, X, W, rstd)
        else:
            _, mean, rstd = fk.layer_norm(X, W, None, eps=eps, return_stats=True)
            cached = fk.layer_norm_backward(DY, X, W, mean, rstd)
            _callcache.clear()
            full = fk.layer_norm_backward(DY, X, W, mean, rstd)
        assert len(cached) == len(full)
        for a, b in zip(cached, full):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        dx64, _, _ = ref64_backward(dy, x, w, eps, rms)
        assert_close(cached[0], dx64.reshape(shape), dtype, f"dx (call {i})")
    assert any(isinstance(p, _callcache.BwdPlan) for p in _callcache._plans.values())


def test_host_arrays_never_use_the_backward_cache():
    x = np.ones((2, 8), np.float32)
    assert _callcache.norm_backward(x, x, None, None, np.ones(2, np.float32), False, True) is None


def test_clear_memory_cache_empties_every_plan_cache():
    """Tools rebuild kernels with other NVRTC options after _jit.clear_memory_cache(): no launch plan may
    keep a kernel of the previous build (runs 1935Z / 2059Z timed stale norm plans)."""
    from fusedkit import _callcache, _jit
    from fusedkit.backends import _common, cuda_cross_entropy, cuda_norms, cuda_softmax
    caches = [_callcache._plans, _common._launchers, _common._occ, cuda_cross_entropy._plans,
              cuda_norms._fwd_plans, cuda_norms._fwd_fp8_plans, cuda_norms._bwd_plans,
              cuda_softmax._fwd_plans, cuda_softmax._bwd_plans]
    for d in caches:
        d["sentinel"] = object()
    _jit.clear_memory_cache()
    assert all("sentinel" not in d for d in caches)
