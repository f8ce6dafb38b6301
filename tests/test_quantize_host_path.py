"""fusedkit.quantize's host path without a GPU (tests/_fake_cuda_gemm.py: CPU torch tensors posing as CUDA
tensors; the launchers of cuda_fp8 replaced by recorders): a repeat call of one signature takes the cached
plan of fusedkit/_callcache.py and launches the same kernels with the same arguments as the full path
(outputs aside: they are new per call); what the cache cannot vouch for takes the full path."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import fusedkit as fk  # noqa: E402
from fusedkit import _callcache, fp8  # noqa: E402
from fusedkit.backends import cuda_fp8  # noqa: E402
from _fake_cuda_gemm import fake_cuda_gemm  # noqa: E402


class _Recorder:
    def __init__(self, launches, expr):
        self.launches, self.expr = launches, expr

    def __call__(self, grid, block, smem, stream, *values, dependent=False):
        self.launches.append(("full", self.expr, grid, block, values, dependent))

    def launch_current(self, grid, block, smem, stream, *values, dependent=False):
        self.launches.append(("cached", self.expr, grid, block, values, dependent))


@pytest.fixture
def launches(monkeypatch):
    rec = []
    monkeypatch.setattr(cuda_fp8, "launcher", lambda file, expr, codes, device: _Recorder(rec, expr))
    monkeypatch.setattr(cuda_fp8, "grid_stride_blocks", lambda work, threads, device: max(1, min(-(-work // threads),
                                                                                                 132 * 8)))
    with fake_cuda_gemm():
        yield rec


def _shape_of(launch, x_ptr, scale_ptr):
    """A launch with the per-call output pointers reduced to zero / non-zero (and whether it is a
    programmatic dependent launch: current scaling's cast after its amax pass)."""
    path, expr, grid, block, vals, dependent = launch
    keep = {x_ptr, scale_ptr, 0}
    return (expr, grid, block, tuple(v if not isinstance(v, int) or v in keep or v < 1 << 20 else "ptr" for v in vals),
            dependent)


CASES = {
    "delayed_bf16": dict(shape=(4, 1024), dtype=torch.bfloat16, scale=True, recipe=None),
    "current_fp32": dict(shape=(3, 5, 96), dtype=torch.float32, scale=False, recipe=None),
    "current_pow2_e5m2": dict(shape=(257, 40), dtype=torch.bfloat16, scale=False,
                              recipe=fp8.CurrentScaling(power_of_2_scales=True, amax_epsilon=1e-6)),
    "odd_size": dict(shape=(7, 13), dtype=torch.float16, scale=True, recipe=None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cached_launch_matches_full_path(launches, case):
    c = CASES[case]
    x = torch.randn(c["shape"]).to(c["dtype"])
    s = torch.tensor([3.0]) if c["scale"] else None
    fmt = "e5m2" if "e5m2" in case else "e4m3"
    fk.quantize(x, fmt=fmt, scale=s, recipe=c["recipe"])
    full = list(launches)
    launches.clear()
    t = fk.quantize(x, fmt=fmt, scale=s, recipe=c["recipe"])
    cached = list(launches)
    assert [p for p, *_ in full] == ["full"] * len(full) and [p for p, *_ in cached] == ["cached"] * len(full)
    sp = 0 if s is None else s.data_ptr()
    assert [_shape_of(a, x.data_ptr(), sp) for a in cached] == [_shape_of(a, x.data_ptr(), sp) for a in full]
    # current scaling: the amax pass, then the cast as its programmatic dependent; delayed: one cast
    assert [a[-1] for a in full] == ([False] if c["scale"] else [False, True])
    # the result: bytes of x's shape, fp32 amax and scale_inv (views of one zeroed buffer)
    assert tuple(t.data.shape) == tuple(x.shape) and t.data.dtype == torch.uint8 and t.fmt.name == fmt
    assert t.amax.shape == (1,) and t.scale_inv.shape == (1,) and t.amax.dtype == torch.float32
    vals = cached[-1][4]
    amax_ptr = vals[3] if s is None else vals[6]
    assert amax_ptr == t.amax.data_ptr() and vals[5] == t.scale_inv.data_ptr() and vals[1] == t.data.data_ptr()
    if s is None:  # the amax pass writes the amax the cast then reads; the cast's own scale goes elsewhere
        assert cached[0][4][1] == t.amax.data_ptr() and vals[4] not in (0, vals[3], vals[5])
    assert float(t.amax[0]) == 0.0  # zeroed for the kernel's atomicMax


def test_what_the_cache_declines(launches):
    x = torch.randn(64, 256).to(torch.bfloat16)
    s = torch.tensor([2.0])
    fk.quantize(x, scale=s)
    launches.clear()

    def path(**kw):
        launches.clear()
        fk.quantize(**kw)
        return launches[-1][0]

    assert path(x=x, scale=s) == "cached"
    assert path(x=x, scale=2.0) == "full"                           # a host float: its device copy per call
    assert path(x=x, scale=s, transpose=True) == "full"
    assert path(x=x, scale=s, amax_out=torch.zeros(1)) == "full"
    flat = torch.randn(64 * 256 + 1).to(torch.bfloat16)
    assert path(x=flat[1:].reshape(64, 256), scale=s) == "full"    # x off its 16-byte alignment
    launches.clear()
    with pytest.raises(ValueError, match="not contiguous"):        # same signature, strided: the full
        fk.quantize(torch.randn(256, 64).to(torch.bfloat16).t(), scale=s)  # path's error, nothing launched
    assert not launches
    assert path(x=x, scale=s, fmt="e5m2") == "full"                 # a new signature, planned now
    assert path(x=x, scale=s, fmt="e5m2") == "cached"
    assert path(x=x) == "full" and path(x=x) == "cached"            # current scaling, default recipe
    assert path(x=x, recipe=fp8.CurrentScaling(power_of_2_scales=True)) == "full"  # another recipe
    with pytest.raises(ValueError, match="1-element float32"):
        fk.quantize(x, scale=torch.tensor([1.0, 2.0]))              # errors stay the full path's
    _callcache.clear()
    assert path(x=x, scale=s) == "full"
