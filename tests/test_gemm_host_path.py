"""fusedkit.fp8_gemm's host path without a GPU (tests/_fake_cuda_gemm.py: CPU torch tensors posing as
CUDA tensors, launches captured): a repeat call of one signature takes the cached plan of
fusedkit/_callcache.py and hands the kernel exactly the parameters the full path would; what the cache
cannot vouch for takes the full path."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import fusedkit as fk  # noqa: E402
from fusedkit import _callcache  # noqa: E402
from fusedkit.backends import cuda_gemm  # noqa: E402
from fusedkit.fp8 import gemm as fp8_gemm_mod  # noqa: E402
from fusedkit.fp8.tensor import FP8Tensor  # noqa: E402
from _fake_cuda_gemm import fake_cuda_gemm  # noqa: E402

POINTER_FIELDS = ("out", "amax", "map_d", "sk_epoch")   # differ between two calls by design


def _operands(rng, M, N, K, block=False, fmt_b="e4m3"):
    a = torch.from_numpy(rng.integers(0, 255, (M, K), dtype=np.uint8))
    b = torch.from_numpy(rng.integers(0, 255, (N, K), dtype=np.uint8))
    if block:
        sa = torch.from_numpy(rng.uniform(0.5, 2, (M, -(-K // 128))).astype(np.float32))
        sb = torch.from_numpy(rng.uniform(0.5, 2, (-(-N // 128), -(-K // 128))).astype(np.float32))
        return (FP8Tensor(a, sa, "e4m3", mode="block", block=(1, 128)),
                FP8Tensor(b, sb, "e4m3", mode="block", block=(128, 128)))
    sa = torch.tensor([rng.uniform(0.5, 2)], dtype=torch.float32)
    sb = torch.tensor([rng.uniform(0.5, 2)], dtype=torch.float32)
    return FP8Tensor(a, sa, "e4m3"), FP8Tensor(b, sb, fmt_b)


def _fields(raw):
    p = cuda_gemm._Params.from_buffer_copy(raw)
    return {name: bytes(getattr(p, name)) if name.startswith("map") else getattr(p, name)
            for name, _ in cuda_gemm._Params._fields_}


CASES = {
    "bf16_split": dict(),
    "bf16_fast_e4m3_e5m2": dict(use_split_accumulator=False, fmt_b="e5m2"),
    "fp32_bias_gelu": dict(out_dtype="float32", bias="float32", activation="gelu"),
    "e4m3_bias_gelu_amax": dict(out_dtype="e4m3", bias="bfloat16", activation="gelu", out_scale=True),
    "accumulate_fp32": dict(out_dtype="float32", accumulate=True),
    "block_scaling": dict(block=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", [(272, 400, 384), (128 * 33, 128 * 9, 256)], ids=["small", "stream_k_tail"])
def test_cached_call_launches_the_full_paths_parameters(case, shape, monkeypatch):
    opts = dict(CASES[case])
    M, N, K = shape
    rng = np.random.default_rng(abs(hash((case, shape))) % 2**32)
    full_calls = []
    real_device = fp8_gemm_mod._device
    monkeypatch.setattr(fp8_gemm_mod, "_device", lambda *a: full_calls.append(1) or real_device(*a))
    with fake_cuda_gemm() as launches:
        for i in range(3):   # fresh operands each time: new pointers, one signature
            a, b = _operands(rng, M, N, K, opts.get("block", False), opts.get("fmt_b", "e4m3"))
            kw = {k: v for k, v in opts.items() if k in ("out_dtype", "activation", "use_split_accumulator")}
            if "bias" in opts:
                kw["bias"] = torch.randn(N).to(getattr(torch, opts["bias"]))
            if opts.get("out_scale"):
                kw["out_scale"] = torch.tensor([rng.uniform(0.1, 4)], dtype=torch.float32)
            if opts.get("accumulate"):
                kw["accumulate_into"] = torch.randn(M, N)
            got = fk.fp8_gemm(a, b, **kw)                  # i = 0: full path; then the cached plan
            cached = _fields(launches[-1][2])
            assert len(full_calls) == 1, "a repeat call of one signature must take the cached plan"
            _callcache.clear()
            want_res = fk.fp8_gemm(a, b, **kw)             # the full path with the same operands
            want = _fields(launches[-1][2])
            assert len(full_calls) == 2
            full_calls.clear()
            full_calls.append(1)                           # the plan exists again, as after call 0
            for name in want:
                if name not in POINTER_FIELDS:
                    assert cached[name] == want[name], f"{case} call {i}: parameter {name}"
            assert launches[-1][:2] == launches[-2][:2]     # grid and shared memory
            out = got.data if isinstance(got, FP8Tensor) else got
            assert cached["out"] == out.data_ptr()
            assert tuple(out.shape) == (M, N) and out.dtype == (want_res.data if isinstance(want_res, FP8Tensor)
                                                                else want_res).dtype
            if opts.get("accumulate"):
                assert got is kw["accumulate_into"]
            if isinstance(got, FP8Tensor):
                assert got.fmt.name == "e4m3" and cached["amax"] == got.amax.data_ptr()
                assert float(got.amax[0]) == 0.0        # zeroed before the (stub) launch
                np.testing.assert_allclose(got.scale_inv.numpy(), 1 / kw["out_scale"].numpy(), rtol=1e-7)
            if shape[0] > 1024 and "fast" not in case and not opts.get("block"):   # split: a stream-K tail
                assert cached["dp_tiles"] < want["M"] // 128 * -(-N // 128)


def test_declined_calls_take_the_full_path(monkeypatch):
    """Forced tiles, host float scales, a float out_scale and a strided operand are never served by a
    cached plan; a cached launch with a stream-K tail on a capturing stream walks without its tail."""
    rng = np.random.default_rng(7)
    M, N, K = 128 * 33, 128 * 9, 256
    with fake_cuda_gemm() as launches:
        a, b = _operands(rng, M, N, K)
        fk.fp8_gemm(a, b)
        assert len(_callcache._plans) == 1
        with cuda_gemm.forced_tiles(split=(128, 1, "staged", "dp")):
            assert _callcache.fp8_gemm(a, b, "bfloat16", None, None, None, None, True) is None
            fk.fp8_gemm(a, b)
            assert _fields(launches[-1][2])["dp_tiles"] == 33 * 9   # the forced walk, not the plan's
        monkeypatch.setattr(cuda_gemm, "_capturing", lambda stream: True)
        assert _callcache.fp8_gemm(a, b, "bfloat16", None, None, None, None, True) is not None
        assert _fields(launches[-1][2])["dp_tiles"] == 33 * 9        # no tail while capturing
        monkeypatch.undo()
        fk.fp8_gemm(a, b)
        assert _fields(launches[-1][2])["dp_tiles"] < 33 * 9         # and the tail again after
        host = FP8Tensor(a.data, float(a.scale_inv[0]), "e4m3")
        fk.fp8_gemm(host, b)
        fk.fp8_gemm(a, b, out_dtype="e4m3", out_scale=0.5)
        assert len(_callcache._plans) == 1                          # neither was remembered
        strided = FP8Tensor(torch.zeros(M, 2 * K, dtype=torch.uint8)[:, :K], a.scale_inv, "e4m3")
        assert _callcache.fp8_gemm(strided, b, "bfloat16", None, None, None, None, True) is None
        with pytest.raises(ValueError, match="not contiguous"):
            fk.fp8_gemm(strided, b)
