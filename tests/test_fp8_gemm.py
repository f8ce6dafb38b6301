"""FP8 GEMM (fusedkit.fp8_gemm, issue 5): C = act(A @ B.T + C0 + bias), A (M, K), B (N, K) FP8.

CPU: the float64 reference against an independent computation, the public API on NumPy and CPU torch,
and every API error. GPU (marked `gpu`): cuda/fp8_gemm_sm90.cu (on sm_90; the fallback elsewhere, and
forced on any GPU in test_gpu_fallback_*) against the float64 reference on the same dequantized operands:
relative Frobenius error < 1e-3 for fp32 output (fast accumulation: 1e-2, the tensor core's FP8
accumulation keeps fewer bits), FP8 outputs byte-exact against the fp32 output of the same call cast on
the CPU, and the output amax bit-exact. Operands are quantized on the CPU (reference quantizers) and moved
to the device, so these tests depend on no quantize kernel.
"""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit import _callcache
from fusedkit import fp8
from fusedkit.fp8.tensor import FP8Tensor
from fusedkit.reference import fp8 as rfp8
from fusedkit.reference import gemm as ref
from _backends import backend_params, to_backend, to_numpy

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def host_operands(rng, M, N, K, fa="e4m3", fb="e4m3", scaling="tensor", spread=1.0):
    """(a, b) host FP8Tensors: x (M, K) and w (N, K) random, quantized by the reference quantizers
    (current scaling per tensor, or 1 x 128 / 128 x 128 blocks). ``spread`` varies row magnitudes so the
    block scales differ."""
    x = (rng.standard_normal((M, K)) * np.exp(spread * rng.standard_normal((M, 1)))).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    if scaling == "block":
        da, sa = rfp8.quantize_blockwise(x, (1, 128), fa)
        db, sb = rfp8.quantize_blockwise(w, (128, 128), fb)
        return (FP8Tensor(da, sa, fa, mode="block", block=(1, 128)),
                FP8Tensor(db, sb, fb, mode="block", block=(128, 128)))
    da, sa, _, _ = rfp8.quantize_current(x, fa)
    db, sb, _, _ = rfp8.quantize_current(w, fb)
    return FP8Tensor(da, sa, fa), FP8Tensor(db, sb, fb)


def to_dev(t: FP8Tensor, backend):
    s = t.scale_inv
    s = np.asarray(s, np.float32).reshape(1) if t.mode == "tensor" else np.asarray(s, np.float32)
    return FP8Tensor(to_backend(np.asarray(t.data), backend), to_backend(s, backend), t.fmt, mode=t.mode,
                     block=t.block)


def rel_err(got, want):
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
    assert np.isfinite(g).all(), "non-finite values in the result"
    return np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)


# ----------------------------------------------------------------------------------------------------
# CPU: the reference

def _independent(a, b, bias=None, act=None, c0=None):
    """The same math written out separately: ml_dtypes decode, einsum, 0.5 x (1 + tanh(u)) GeLU."""
    def deq(t):
        v = np.asarray(t.data).view(t.fmt.np_dtype).astype(np.float64)
        if t.mode == "tensor":
            return v * float(t.scale_inv)
        out = np.empty_like(v)
        bm, bk = t.block
        s = np.asarray(t.scale_inv, np.float64)
        for i in range(v.shape[0]):
            for k in range(v.shape[1]):
                out[i, k] = v[i, k] * s[i // bm, k // bk]
        return out
    v = np.einsum("mk,nk->mn", deq(a), deq(b))
    if c0 is not None:
        v = v + c0
    if bias is not None:
        v = v + bias
    if act == "gelu":
        v = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    elif act == "relu":
        v = np.maximum(v, 0)
    return v


@pytest.mark.parametrize("scaling", ["tensor", "block"])
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
def test_reference_matches_independent_math(scaling, fa, fb, act):
    rng = rng_for("ind", scaling, fa, fb, act)
    M, N, K = 48, 144, 272  # K and N not multiples of 128: partial scale blocks
    a, b = host_operands(rng, M, N, K, fa, fb, scaling)
    bias = rng.standard_normal(N).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    got = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation=act, accumulate_into=c0.copy())
    want = _independent(a, b, bias.astype(np.float64), act, c0.astype(np.float64))
    assert rel_err(got, want) < 1e-6


def test_reference_block_dequantize_agrees_with_fp8tensor():
    rng = rng_for("bdq")
    a, b = host_operands(rng, 130 - 2, 256, 384, scaling="block")
    np.testing.assert_array_equal(ref.dequantize_operand(a), a.dequantize(np.float64))
    np.testing.assert_array_equal(ref.dequantize_operand(b), b.dequantize(np.float64))


def test_quantized_gemm_approximates_float_gemm():
    """Sanity of the whole path: FP8 operands give the float GEMM to FP8 precision."""
    rng = rng_for("approx")
    M, N, K = 64, 96, 512
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    a = fk.quantize(x, fmt="e4m3")
    b = fk.quantize(w, fmt="e4m3")
    got = fk.fp8_gemm(a, b, out_dtype="float32")
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert rel_err(got, x.astype(np.float64) @ w.T.astype(np.float64)) < 0.05
    ab = fk.quantize(x, fmt="e4m3", recipe=fp8.BlockScaling())
    bb = fk.quantize(w, fmt="e4m3", recipe=fp8.BlockScaling(), weight=True)
    got = fk.fp8_gemm(ab, bb, out_dtype="float32")
    assert rel_err(got, x.astype(np.float64) @ w.T.astype(np.float64)) < 0.05


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_reference_fp8_output(fmt):
    rng = rng_for("fp8out", fmt)
    a, b = host_operands(rng, 32, 64, 128)
    v32 = ref.fp8_gemm(a, b, out_dtype="float32", activation="gelu")
    t = ref.fp8_gemm(a, b, out_dtype=fmt, activation="gelu", out_scale=3.0)
    assert isinstance(t, FP8Tensor) and t.fmt.name == fmt and t.data.dtype == np.uint8
    np.testing.assert_array_equal(t.data, rfp8.cast_to_fp8(v32 * np.float32(3.0), fmt))
    assert t.amax == np.abs(v32).max()
    assert t.scale_inv == np.float32(1.0) / np.float32(3.0)


def test_public_api_numpy_and_torch_cpu():
    rng = rng_for("api")
    a, b = host_operands(rng, 32, 48, 64)
    bias = rng.standard_normal(48).astype(np.float32)
    want = ref.fp8_gemm(a, b, out_dtype="bfloat16", bias=bias, activation="relu")
    got = fk.fp8_gemm(a, b, bias=bias, activation="relu")  # default out_dtype bfloat16
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    c0 = rng.standard_normal((32, 48)).astype(np.float32)
    acc = c0.copy()
    res = fk.fp8_gemm(a, b, out_dtype="float32", accumulate_into=acc)
    assert res is acc
    np.testing.assert_allclose(acc, c0 + ref.fp8_gemm(a, b, out_dtype="float32"), rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    ta = FP8Tensor(torch.from_numpy(a.data), a.scale_inv, a.fmt)
    tb = FP8Tensor(torch.from_numpy(b.data), b.scale_inv, b.fmt)
    out = fk.fp8_gemm(ta, tb, out_dtype="float32", bias=torch.from_numpy(bias), activation="relu")
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), ref.fp8_gemm(a, b, out_dtype="float32", bias=bias,
                                                            activation="relu"))


# ----------------------------------------------------------------------------------------------------
# CPU: API errors

def _ops(M=32, N=32, K=32, **kw):
    return host_operands(rng_for("err", M, N, K), M, N, K, **kw)


@pytest.mark.parametrize("M,N,K,bad", [(40, 32, 32, "M=40"), (32, 24, 32, "N=24"), (32, 32, 72, "K=72"),
                                       (8, 8, 8, "M=8, N=8, K=8")])
def test_error_not_multiple_of_16(M, N, K, bad):
    rng = rng_for("m16")
    a = FP8Tensor(np.zeros((M, K), np.uint8), np.float32(1), "e4m3")
    b = FP8Tensor(np.zeros((N, K), np.uint8), np.float32(1), "e4m3")
    with pytest.raises(ValueError, match="multiples of 16") as e:
        fk.fp8_gemm(a, b)
    assert bad in str(e.value) and "pad" in str(e.value).lower()
    del rng


def test_error_k_mismatch_and_rank():
    a, _ = _ops()
    b = FP8Tensor(np.zeros((32, 48), np.uint8), np.float32(1), "e4m3")
    with pytest.raises(ValueError, match="K dims differ"):
        fk.fp8_gemm(a, b)
    c = FP8Tensor(np.zeros((2, 32, 32), np.uint8), np.float32(1), "e4m3")
    with pytest.raises(ValueError, match="2-D"):
        fk.fp8_gemm(c, a)


def test_error_types():
    a, b = _ops()
    with pytest.raises(TypeError, match="FP8Tensors"):
        fk.fp8_gemm(np.zeros((32, 32), np.float32), b)
    f = FP8Tensor(np.zeros((32, 32), np.float32), np.float32(1), "e4m3")
    with pytest.raises(TypeError, match="uint8"):
        fk.fp8_gemm(f, b)


def test_error_options():
    a, b = _ops()
    with pytest.raises(ValueError, match="out_scale"):
        fk.fp8_gemm(a, b, out_dtype="e4m3")
    with pytest.raises(ValueError, match="only to FP8 outputs"):
        fk.fp8_gemm(a, b, out_dtype="float32", out_scale=1.0)
    with pytest.raises(ValueError, match="out_dtype"):
        fk.fp8_gemm(a, b, out_dtype="int8")
    with pytest.raises(ValueError, match="activation"):
        fk.fp8_gemm(a, b, activation="tanh")
    with pytest.raises(ValueError, match=r"bias.*\(N,\)"):
        fk.fp8_gemm(a, b, bias=np.zeros(16, np.float32))
    with pytest.raises(TypeError, match="bias"):
        fk.fp8_gemm(a, b, bias=np.zeros(32, np.float64))
    with pytest.raises(TypeError, match="accumulate_into"):
        fk.fp8_gemm(a, b, out_dtype="float32", accumulate_into=np.zeros((32, 32), fk._dtypes.numpy_dtype("bfloat16")))
    with pytest.raises(ValueError, match="accumulate_into"):
        fk.fp8_gemm(a, b, out_dtype="float32", accumulate_into=np.zeros((16, 32), np.float32))
    with pytest.raises(ValueError, match="accumulate_into"):
        fk.fp8_gemm(a, b, out_dtype="e4m3", out_scale=1.0, accumulate_into=np.zeros((32, 32), np.float32))


def test_error_scaling_modes():
    x = rng_for("mx").standard_normal((32, 128)).astype(np.float32)
    a = fk.quantize(x, recipe=fp8.MXFP8Scaling())
    b = fk.quantize(x, fmt="e4m3")
    with pytest.raises(ValueError, match="block scaling"):
        fk.fp8_gemm(a, b)
    ab = fk.quantize(x, recipe=fp8.BlockScaling())  # 1 x 128 for both: b must be 128 x 128
    with pytest.raises(ValueError, match="128 x 128"):
        fk.fp8_gemm(ab, ab)


def test_registry_entry():
    from fusedkit import _registry
    op = _registry.OPS["fp8_gemm"]
    assert op.flops(4096, 4096, 4096) == 2 * 4096 ** 3
    assert op.reference is ref.fp8_gemm
    exprs = _registry.all_expressions()["fp8_gemm_sm90.cu"]
    from fusedkit.backends import cuda_gemm
    built = {(mode, bn, cluster, store, out) for mode, bn, cluster, store in cuda_gemm.VARIANTS
             for out in cuda_gemm.variant_outputs(bn, store)}
    sk = {(mode, bn, cluster, store, out) for mode, bn, cluster, store in cuda_gemm.SK_VARIANTS
          for out in cuda_gemm.variant_outputs(bn, store)}   # the stream-K variants (E4M3 x E4M3)
    sk_exprs = cuda_gemm.sk_expressions()
    assert len(exprs) == len(set(exprs)) == len(cuda_gemm.PAIRS) * len(built) + len(sk_exprs)
    assert len(sk_exprs) >= len(sk) and all(e.endswith(", 1>") for e in sk_exprs)
    # every launch the table walks stream-K has its kernel registered (format pairs and outputs)
    for mode in (m for m, walk in cuda_gemm.TABLE_SCHED.items() if walk == "sk"):
        for fa, fb in cuda_gemm.PAIRS:
            for out in cuda_gemm.OUT_CXX:
                bn, stages, cluster, store = cuda_gemm.config(8192, 8192, mode, out=out)
                assert cuda_gemm.expr(fa, fb, bn, mode, out, stages, cluster, store, "sk") in sk_exprs
    assert {o for *_, o in built} == set(cuda_gemm.OUT_CXX)
    assert ("fast", 256, 1, "whole", "bfloat16") in built and ("fast", 256, 1, "whole", "e4m3") not in built
    assert not any(store != "direct" and out == "float32" for *_, store, out in built)
    # the tile table: bf16 out, fast 256-wide with the whole-slab stage (3 ring stages), split staged
    assert cuda_gemm.config(4096, 4096, "fast") == (256, 3, 1, "whole")
    assert cuda_gemm.config(4096, 4096, "fast", out="float32") == (256, 4, 1, "direct")
    assert cuda_gemm.config(4096, 4096, "split") == (128, 6, 1, "staged")
    assert cuda_gemm.config(4096, 4096, "block") == (128, 6, 1, "staged")
    assert cuda_gemm.config(256, 256, "fast")[:2] == (128, 6)  # too few 256-wide tiles for 132 SMs
    for M, N, mode in ((4096, 4096, "fast"), (4096, 4096, "split"), (256, 256, "block")):  # built variants
        for out in cuda_gemm.OUT_CXX:
            bn, stages, cluster, store = cuda_gemm.config(M, N, mode, out=out)
            assert (mode, bn, cluster, store, out) in built
            assert cuda_gemm.expr("e4m3", "e4m3", bn, mode, out, stages, cluster, store) in exprs
    with cuda_gemm.forced_tiles(fast=(256, 2)):
        assert cuda_gemm.config(256, 256, "fast") == (256, 4, 2, "direct")
        assert cuda_gemm.config(256, 256, "split") == (128, 6, 1, "direct")
    with cuda_gemm.forced_tiles(fast=(256, 1, "whole"), split=(128, 1, "staged")):
        assert cuda_gemm.config(256, 256, "fast") == (256, 3, 1, "whole")       # 64 KB of output stages
        assert cuda_gemm.config(256, 256, "fast", out="e4m3") == (256, 4, 1, "staged")  # one round anyway
        assert cuda_gemm.config(256, 256, "fast", out="float32") == (256, 4, 1, "direct")
        assert cuda_gemm.config(256, 256, "split") == (128, 6, 1, "staged")
    assert cuda_gemm.config(256, 256, "fast") == (128, 6, 1, "staged")  # table (BN 128: one staged round)
    for mode, bn, cluster, store in cuda_gemm.VARIANTS:
        for out in cuda_gemm.variant_outputs(bn, store):
            st = cuda_gemm.stages_for(bn, out, store)
            assert st >= 3 and cuda_gemm.smem_bytes(bn, st, out, store) <= 232448  # the H200's opt-in limit
    assert cuda_gemm.out_stage_bytes(256, "bfloat16", "staged") == 16384     # two rounds of 64 x 128
    assert cuda_gemm.out_stage_bytes(256, "bfloat16", "whole") == 32768
    assert cuda_gemm.out_stage_bytes(128, "e5m2", "staged") == 8192


@pytest.mark.parametrize("out", ["bfloat16", "e4m3"])
@pytest.mark.parametrize("bn,store", [(128, "staged"), (256, "staged"), (256, "whole")])
def test_staged_store_layout_model(out, bn, store):
    """A transcription of gemm_store_staged's shared-memory addressing (cuda/fp8_gemm_sm90.cu): undoing
    TMA's 128-byte swizzle (16-byte chunk c of box row r stored at chunk c ^ (r % 8)) must give every
    thread its own pairs' (row, column) of the wgmma layout, each byte of the slab once, and the 32 lanes
    of one store instruction must hit distinct 4-byte banks (or share a word)."""
    from fusedkit.backends import cuda_gemm
    ob = cuda_gemm.OUT_BYTES[out]
    stage = cuda_gemm.out_stage_bytes(bn, out, store)
    rounds = 64 * bn * ob // stage
    cols, box_cols = bn // rounds, 128 // ob
    written = set()
    for q in range(rounds):
        for warp in range(4):
            for jj in range(cols // 8):
                for h in range(2):
                    words = {}
                    for lane in range(32):
                        j = q * (cols // 8) + jj
                        box = jj // (box_cols // 8)
                        byte = (jj % (box_cols // 8)) * 8 * ob + 2 * (lane & 3) * ob
                        r = 16 * warp + (lane >> 2) + 8 * h
                        addr = box * 8192 + r * 128 + ((((byte >> 4) ^ r) & 7) << 4) + (byte & 15)
                        b, off = divmod(addr, 8192)              # TMA's view of the stage
                        row, rem = divmod(off, 128)
                        col = q * cols + b * box_cols + ((((rem >> 4) ^ row) & 7) * 16 + (rem & 15)) // ob
                        assert (row, col) == (r, 8 * j + 2 * (lane & 3))
                        assert addr + 2 * ob <= stage
                        for k in range(2 * ob):
                            assert (q, addr + k) not in written
                            written.add((q, addr + k))
                        words.setdefault((addr // 4) % 32, set()).add(addr // 4)
                    assert all(len(w) == 1 for w in words.values())   # no bank conflicts
    assert len(written) == 64 * bn * ob


def test_tensor_map_enum_values_match_cuda_bindings():
    """The ctypes encoder's enum numbers are cuda.bindings' (when it is installed)."""
    drv = pytest.importorskip("cuda.bindings.driver")
    from fusedkit.backends import cuda_gemm
    assert cuda_gemm._ENC == (drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8.value,
                              drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE.value,
                              drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B.value,
                              drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B.value,
                              drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE.value)


# ----------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_gpu_tensor_map_encoders_agree():
    """cuda.bindings and the ctypes fallback encode the same 128 bytes."""
    pytest.importorskip("cuda.bindings.driver")
    import cupy
    from fusedkit.backends import cuda_gemm
    x = cupy.zeros((272, 208), cupy.uint8)
    assert cuda_gemm._encode_bindings(x.data.ptr, 272, 208, 128) == cuda_gemm._encode_ctypes(x.data.ptr, 272, 208, 128)

GPU = backend_params(["cupy", "torch"])
SHAPES = [(16, 16, 16), (128, 128, 128), (144, 272, 208), (256, 384, 512), (1040, 784, 528),
          (2048, 2048, 256)]


def _run(backend, a, b, **kw):
    if backend == "torch":
        pytest.importorskip("torch")
    return fk.fp8_gemm(to_dev(a, backend), to_dev(b, backend), **kw)


def _tol(scaling):
    return 1e-2 if scaling == "fast" else 1e-3


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gpu_matches_reference(backend, scaling, fa, fb, shape):
    M, N, K = shape
    rng = rng_for("gpu", scaling, fa, fb, shape)
    a, b = host_operands(rng, M, N, K, fa, fb, "block" if scaling == "block" else "tensor")
    got = _run(backend, a, b, out_dtype="float32", use_split_accumulator=scaling != "fast")
    want = ref.fp8_gemm(a, b, out_dtype="float32")
    assert rel_err(to_numpy(got), want) < _tol(scaling)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 4112, 144), (4096, 4096, 256)], ids=str)
def test_gpu_wide_tiles_persistent(shape):
    """Fast accumulation on 128 x 256 tiles, more tiles than SMs (persistent walk), N and K edges."""
    M, N, K = shape
    rng = rng_for("wide", shape)
    a, b = host_operands(rng, M, N, K)
    got = _run("cupy", a, b, out_dtype="float32", use_split_accumulator=False)
    assert rel_err(to_numpy(got), ref.fp8_gemm(a, b, out_dtype="float32")) < 1e-2


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
@pytest.mark.parametrize("act", [None, "gelu", "gelu_erf", "silu", "relu", "squared_relu"])
def test_gpu_epilogue_bias_activation(backend, scaling, act):
    M, N, K = 272, 400, 384
    rng = rng_for("epi", backend, scaling, act)
    a, b = host_operands(rng, M, N, K, scaling="block" if scaling == "block" else "tensor")
    bias_dt = "bfloat16" if backend == "torch" else "float32"
    bias = (rng.standard_normal(N)).astype(np.float32).astype(fk._dtypes.numpy_dtype(bias_dt))
    got = _run(backend, a, b, out_dtype="float32", bias=to_backend(bias, backend), activation=act,
               use_split_accumulator=scaling != "fast")
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation=act)
    assert rel_err(to_numpy(got), want) < _tol(scaling)


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["split", "block"])
def test_gpu_bf16_output_and_bf16_bias(scaling):
    pytest.importorskip("torch")
    M, N, K = 320, 528, 256
    rng = rng_for("bf16", scaling)
    a, b = host_operands(rng, M, N, K, scaling="block" if scaling == "block" else "tensor")
    bias = rng.standard_normal(N).astype(np.float32).astype(fk._dtypes.numpy_dtype("bfloat16"))
    got = _run("torch", a, b, bias=to_backend(bias, "torch"), activation="gelu")  # default bfloat16
    assert str(got.dtype) == "torch.bfloat16"
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation="gelu")
    assert rel_err(to_numpy(got).astype(np.float32), want) < 1e-2


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
def test_gpu_accumulate_into(backend, out, scaling):
    if backend == "cupy" and out == "bfloat16":
        pytest.skip("CuPy has no bfloat16 dtype")
    M, N, K = 144, 272, 256
    rng = rng_for("acc", backend, out, scaling)
    a, b = host_operands(rng, M, N, K, scaling="block" if scaling == "block" else "tensor")
    c0 = rng.standard_normal((M, N)).astype(np.float32).astype(fk._dtypes.numpy_dtype(out))
    C = to_backend(c0.copy(), backend)
    res = _run(backend, a, b, out_dtype=out, accumulate_into=C, bias=to_backend(np.ones(N, np.float32), backend),
               use_split_accumulator=scaling != "fast")
    assert res is C
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=np.ones(N, np.float32), accumulate_into=c0.astype(np.float32))
    assert rel_err(to_numpy(C).astype(np.float32), want) < (1e-2 if out == "bfloat16" else _tol(scaling))


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
@pytest.mark.parametrize("shape", [(144, 272, 208), (272, 400, 384), (1040, 784, 528), (4224, 4096, 512)],
                         ids=str)
def test_gpu_cluster_multicast(scaling, shape):
    """Two-CTA clusters sharing B through TMA multicast: odd and even tile-row counts (the second CTA of
    the last cluster may have no rows), more cluster units than clusters (persistent walk), every mode,
    the FP8 output's bytes and amax against the same call's fp32 output."""
    from fusedkit.backends import cuda_gemm
    M, N, K = shape
    rng = rng_for("cluster", scaling, shape)
    a, b = host_operands(rng, M, N, K, scaling="block" if scaling == "block" else "tensor")
    bias = rng.standard_normal(N).astype(np.float32)
    kw = dict(bias=to_backend(bias, "cupy"), activation="gelu", use_split_accumulator=scaling != "fast")
    with cuda_gemm.forced_tiles(fast=(256, 2), split=(128, 2), block=(128, 2)):
        v32 = to_numpy(_run("cupy", a, b, out_dtype="float32", **kw))
        t = _run("cupy", a, b, out_dtype="e4m3", out_scale=0.37, **kw)
    assert rel_err(v32, ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation="gelu")) < _tol(scaling)
    np.testing.assert_array_equal(to_numpy(t.data), rfp8.cast_to_fp8(v32 * np.float32(0.37), "e4m3"))
    amax = np.asarray(to_numpy(t.amax), np.float32).reshape(())
    assert amax.view(np.uint32) == np.abs(v32).max().astype(np.float32).view(np.uint32)
    with cuda_gemm.forced_tiles(fast=(256, 1)):
        v_plain = to_numpy(_run("cupy", a, b, out_dtype="float32", **kw))
    np.testing.assert_array_equal(v32, v_plain)  # the same tiles without the cluster: the same bits


STAGED_TILES = [("fast", 256, "staged"), ("fast", 256, "whole"), ("fast", 128, "staged"), ("split", 128, "staged"),
                ("block", 128, "staged")]


@pytest.mark.gpu
@pytest.mark.parametrize("mode,bn,store", STAGED_TILES, ids=str)
@pytest.mark.parametrize("shape", [(144, 272, 208), (272, 400, 384), (4224, 4112, 256)], ids=str)
def test_gpu_staged_stores_equal_direct(mode, bn, store, shape):
    """Output stores through shared memory and TMA (staged, in rounds or whole) write the same bits as the
    direct stores of the same tiles: bf16 with bias + GeLU, bf16 accumulate_into, FP8 bytes and amax; the
    shapes cut tiles in M and N and give several tiles per CTA (4224 x 4112)."""
    pytest.importorskip("torch")
    from fusedkit.backends import cuda_gemm
    M, N, K = shape
    rng = rng_for("staged", mode, bn, store, shape)
    a, b = host_operands(rng, M, N, K, scaling="block" if mode == "block" else "tensor")
    bias = to_backend(rng.standard_normal(N).astype(np.float32), "torch")
    c0 = rng.standard_normal((M, N)).astype(np.float32).astype(fk._dtypes.numpy_dtype("bfloat16"))
    kw = dict(bias=bias, activation="gelu", use_split_accumulator=mode != "fast")

    def outputs():
        y = _run("torch", a, b, **kw)
        acc = to_backend(c0, "torch")
        _run("torch", a, b, accumulate_into=acc, use_split_accumulator=mode != "fast")
        f8 = [_run("torch", a, b, out_dtype=f, out_scale=0.37, **kw) for f in ("e4m3", "e5m2")]
        return [to_numpy(y).view(np.uint16), to_numpy(acc).view(np.uint16)] + [
            v for t in f8 for v in (to_numpy(t.data), to_numpy(t.amax))]

    with cuda_gemm.forced_tiles(**{mode: (bn, 1)}):
        direct = outputs()
    with cuda_gemm.forced_tiles(**{mode: (bn, 1, store)}):
        staged = outputs()
    for d, t in zip(direct, staged):
        np.testing.assert_array_equal(t, d)
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=to_numpy(bias), activation="gelu")
    assert rel_err(staged[0].view(fk._dtypes.numpy_dtype("bfloat16")).astype(np.float32), want) < 1e-2


def test_stream_k_split_rule():
    """The stream-K tail starts after all but the last full wave: grid < tail tiles < 2 grid, so every CTA's
    share is at least one tile's K blocks (a tile split at most once); no tail without a partial wave."""
    from fusedkit.backends import cuda_gemm
    for grid in (1, 7, 114, 132):
        for units in range(1, 5 * grid + 3):
            dp = cuda_gemm.sk_split(units, grid)
            if units <= grid or units % grid == 0:
                assert dp == units
            else:
                assert 0 <= dp < units and dp % grid == 0 and grid < units - dp < 2 * grid
    # the walk: every K block of every tile exactly once; a cut tile's head ends CTA b's share and its
    # tail starts CTA b + 1's (the slot the head reads); no segment both starts and ends inside a tile
    for grid, units, kb in ((132, 144, 9), (132, 256, 9), (132, 400, 9), (132, 4096, 64), (132, 1024, 32),
                            (114, 8192, 64), (7, 30, 1), (7, 30, 3)):
        dp = cuda_gemm.sk_split(units, grid)
        walk = cuda_gemm.sk_segments(units, kb, grid, dp)
        seen = {}
        for b, segs in enumerate(walk):
            for i, (t, kb0, kb1) in enumerate(segs):
                assert 0 <= kb0 < kb1 <= kb and not (kb0 > 0 and kb1 < kb)
                for k in range(kb0, kb1):
                    assert (t, k) not in seen
                    seen[(t, k)] = b
                if kb0 > 0:   # a tail: the first segment of its share, its head the last of CTA b - 1's
                    assert i == len([s_ for s_ in segs if s_[1] == 0 and s_[2] == kb and s_[0] < dp])
                    assert walk[b - 1][-1] == (t, 0, kb0)
        assert len(seen) == units * kb
    names = set(cuda_gemm.all_expressions()[cuda_gemm.FILE])
    for mode, bn, cluster, store in cuda_gemm.SK_VARIANTS:
        for out in cuda_gemm.variant_outputs(bn, store):
            e = cuda_gemm.expr("e4m3", "e4m3", bn, mode, out, cuda_gemm.stages_for(bn, out, store), cluster, store, "sk")
            assert e.endswith(", 1>") and e in names
    assert cuda_gemm.expr("e4m3", "e4m3", 128, "split", "bfloat16", 6, 1, "staged") in names  # dp: names as before
    assert cuda_gemm.sched("split", 1) == cuda_gemm.TABLE_SCHED["split"]
    # the table: split accumulation launches the stream-K kernel; the tail is split only when short
    assert cuda_gemm.sched("split", 1, 4096, 132) == "sk"          # 31.03 waves
    assert cuda_gemm.sched("split", 1, 1024, 132) == "sk_notail"   # 7.76 waves: 76 % last wave
    assert cuda_gemm.sched("split", 2, 4096, 132) == "dp"
    assert cuda_gemm.sched("fast", 1, 4096, 132) == cuda_gemm.TABLE_SCHED["fast"] == "dp"
    with cuda_gemm.forced_tiles(split=(128, 1, "staged", "sk"), fast=(256, 2, "direct", "sk")):
        assert cuda_gemm.sched("split", 1) == "sk"
        assert cuda_gemm.sched("fast", 2) == "dp"  # clusters walk data-parallel
        assert cuda_gemm.config(4096, 4096, "split") == (128, 6, 1, "staged")


SK_CASES = [("split", 128, "staged"), ("split", 128, "direct"), ("block", 128, "staged"), ("fast", 256, "whole"),
            ("fast", 256, "staged")]


@pytest.mark.gpu
@pytest.mark.parametrize("mode,bn,store", SK_CASES, ids=str)
@pytest.mark.parametrize("waves", [1, 2, 3], ids=["tail_only_1.1_waves", "tail_only_1.9_waves", "dp_then_tail"])
def test_gpu_stream_k_tail(mode, bn, store, waves):
    """The stream-K tail (tiles split between two CTAs, joined through global memory) against the float64
    reference and the data-parallel walk of the same tiles: bf16 with bias + GeLU, fp32, FP8 bytes equal
    to the same walk's fp32 output cast on the CPU, amax exact, and the same bits on a second launch
    (flags reset, epoch). The shapes give (on 132 SMs) 144 tiles, all in the tail (every CTA a tail and a
    head), 256 (whole tiles between them) and 400 (two data-parallel waves, then a tail of 136); tiles cut
    in M and N, an odd number of K blocks."""
    pytest.importorskip("torch")
    import cupy
    from fusedkit.backends import cuda_gemm
    from fusedkit.backends._common import sm_count
    sms = sm_count(cupy.cuda.Device().id)
    n_tiles = 16
    m_tiles = (2 * sms) // n_tiles if waves == 2 else (waves * sms) // n_tiles + 1
    units = m_tiles * n_tiles
    if cuda_gemm.sk_split(units, sms) == units:
        pytest.skip(f"{units} tiles on {sms} SMs leave no tail to split")
    M, N, K = 128 * m_tiles - 48, bn * n_tiles - 16, 9 * 128 - 16   # 9 K blocks, the last one partial
    rng = rng_for("sk", mode, bn, store, waves)
    a, b = host_operands(rng, M, N, K, scaling="block" if mode == "block" else "tensor")
    bias = to_backend(rng.standard_normal(N).astype(np.float32), "torch")
    kw = dict(bias=bias, activation="gelu", use_split_accumulator=mode != "fast")

    def outputs():
        y = _run("torch", a, b, **kw)
        v32 = to_numpy(_run("torch", a, b, out_dtype="float32", **kw))
        t = _run("torch", a, b, out_dtype="e4m3", out_scale=0.37, **kw)
        return to_numpy(y).view(np.uint16), v32, to_numpy(t.data), to_numpy(t.amax)

    with cuda_gemm.forced_tiles(**{mode: (bn, 1, store, "sk")}):
        y, v32, f8, amax = outputs()
        again = outputs()
    with cuda_gemm.forced_tiles(**{mode: (bn, 1, store)}):
        y_dp, v32_dp, _, _ = outputs()
    for first, second in zip((y, v32, f8, amax), again):
        np.testing.assert_array_equal(second, first)
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=to_numpy(bias), activation="gelu")
    assert rel_err(v32, want) < _tol(mode)
    assert rel_err(v32, v32_dp) < (1e-5 if mode != "fast" else 2e-3)  # split tiles: one rounding more
    np.testing.assert_array_equal(f8, rfp8.cast_to_fp8(v32 * np.float32(0.37), "e4m3"))
    assert np.asarray(amax, np.float32).reshape(()).view(np.uint32) == np.abs(v32).max().astype(np.float32).view(np.uint32)
    assert rel_err(y.view(fk._dtypes.numpy_dtype("bfloat16")).astype(np.float32), want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["split", "fast"])
def test_gpu_stream_k_kernel_without_tail_equals_data_parallel(mode):
    """The forced "sk_notail" walk (the stream-K kernel, every tile data-parallel: tools/sweep_gemm.py
    uses it to tell the tail's gain from the kernel's) gives the data-parallel walk's bits, at a shape
    whose tail the table's stream-K would split."""
    pytest.importorskip("torch")
    import cupy
    from fusedkit.backends import cuda_gemm
    from fusedkit.backends._common import sm_count
    sms = sm_count(cupy.cuda.Device().id)
    bn = 128 if mode == "split" else 256
    m_tiles = -(-(2 * sms + 8) // 8)                  # two full waves and a tail of a few tiles
    M, N, K = 128 * m_tiles - 32, 8 * bn - 16, 5 * 128
    rng = rng_for("sk_notail", mode)
    a, b = host_operands(rng, M, N, K)
    kw = dict(use_split_accumulator=mode == "split")  # bf16 out: the staged kernels of SK_VARIANTS
    with cuda_gemm.forced_tiles(**{mode: (bn, 1, "staged", "sk_notail")}):
        got = to_numpy(_run("torch", a, b, **kw)).view(np.uint16)
    with cuda_gemm.forced_tiles(**{mode: (bn, 1, "staged")}):
        want = to_numpy(_run("torch", a, b, **kw)).view(np.uint16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_gpu_table_stream_k_and_graph_capture():
    """Split accumulation at a shape whose last wave is nearly empty walks stream-K by the tile table
    (TABLE_SCHED, SK_MAX_TAIL_FILL); under torch.cuda.graph capture the same call splits no tail (its
    workspace is allocated outside graphs), so the replayed graph gives exactly the bits of the forced
    data-parallel walk, and stream-K agrees with both to one extra rounding."""
    torch = pytest.importorskip("torch")
    import cupy
    from fusedkit.backends import cuda_gemm
    from fusedkit.backends._common import sm_count
    sms = sm_count(cupy.cuda.Device().id)
    n_tiles = 8
    m_tiles = -(-(2 * sms + 8) // n_tiles)            # two full waves and a tail of a few tiles
    units = m_tiles * n_tiles
    if units % sms > cuda_gemm.SK_MAX_TAIL_FILL * sms or units % sms == 0:
        pytest.skip(f"{units} tiles on {sms} SMs: no short tail")
    assert cuda_gemm.sched("split", 1, units, sms) == "sk"
    M, N, K = 128 * m_tiles - 48, 128 * n_tiles - 16, 9 * 128 - 16
    rng = rng_for("sk_table_graph")
    a, b = host_operands(rng, M, N, K)
    ad, bd = to_dev(a, "torch"), to_dev(b, "torch")
    kw = dict(out_dtype="float32", use_split_accumulator=True)
    eager = to_numpy(fk.fp8_gemm(ad, bd, **kw))       # the table: stream-K
    with cuda_gemm.forced_tiles(split=(128, 1, "staged", "dp")):
        dp = to_numpy(fk.fp8_gemm(ad, bd, **kw))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                      # warm-up off the default stream, as torch asks
        fk.fp8_gemm(ad, bd, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fk.fp8_gemm(ad, bd, **kw)
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(captured), dp)
    assert rel_err(eager, dp) < 1e-5
    assert rel_err(eager, ref.fp8_gemm(a, b, out_dtype="float32")) < _tol("split")


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_gpu_fp8_output_exact_bytes_and_amax(backend, fmt, scaling, act):
    """The FP8 output equals the same call's fp32 output cast on the CPU, byte for byte, and its amax is
    max |fp32 output| exactly (the kernel's epilogue rounds identically for every output type)."""
    M, N, K = 272, 400, 384
    rng = rng_for("fp8o", backend, fmt, scaling, act)
    a, b = host_operands(rng, M, N, K, scaling="block" if scaling == "block" else "tensor")
    bias = rng.standard_normal(N).astype(np.float32)
    kw = dict(bias=to_backend(bias, backend), activation=act, use_split_accumulator=scaling != "fast")
    v32 = to_numpy(_run(backend, a, b, out_dtype="float32", **kw))
    out_scale = np.float32(0.37) if fmt == "e4m3" else np.float32(5.0)
    t = _run(backend, a, b, out_dtype=fmt, out_scale=float(out_scale), **kw)
    assert isinstance(t, FP8Tensor) and t.fmt.name == fmt
    np.testing.assert_array_equal(to_numpy(t.data), rfp8.cast_to_fp8(v32 * out_scale, fmt))
    amax = np.asarray(to_numpy(t.amax), np.float32).reshape(())
    assert amax.view(np.uint32) == np.abs(v32).max().astype(np.float32).view(np.uint32)
    np.testing.assert_allclose(np.asarray(to_numpy(t.scale_inv), np.float32).reshape(()), 1 / out_scale, rtol=1e-7)
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation=act)
    assert rel_err(v32, want) < _tol(scaling)
    # and the out_scale as a device array gives the same bytes
    t2 = _run(backend, a, b, out_dtype=fmt, out_scale=to_backend(np.array([out_scale], np.float32), backend), **kw)
    np.testing.assert_array_equal(to_numpy(t2.data), to_numpy(t.data))


@pytest.mark.parametrize("backend", GPU)
def test_gpu_host_scale_inv_and_e5m2_pair(backend):
    """Per-tensor scale_inv given as host floats; e5m2 x e5m2 (no kernel: the fallback) still agrees."""
    rng = rng_for("hs", backend)
    a, b = host_operands(rng, 128, 256, 256)
    A = FP8Tensor(to_backend(a.data, backend), float(a.scale_inv), a.fmt)
    B = FP8Tensor(to_backend(b.data, backend), float(b.scale_inv), b.fmt)
    got = fk.fp8_gemm(A, B, out_dtype="float32")
    assert rel_err(to_numpy(got), ref.fp8_gemm(a, b, out_dtype="float32")) < 1e-3
    a5, b5 = host_operands(rng, 128, 256, 256, "e5m2", "e5m2")
    got = _run(backend, a5, b5, out_dtype="float32")
    assert rel_err(to_numpy(got), ref.fp8_gemm(a5, b5, out_dtype="float32")) < 1e-3


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_gpu_fallback_matches_reference(backend, scaling, monkeypatch):
    """The non-sm_90 path (dequantize + fp32 matmul + epilogue), forced on any GPU."""
    from fusedkit.backends import cuda_gemm
    monkeypatch.setattr(cuda_gemm, "supported", lambda device: False)
    _callcache.clear()   # a cached plan of an earlier test's signature would launch the kernel
    rng = rng_for("fb", backend, scaling)
    M, N, K = 144, 272, 208
    a, b = host_operands(rng, M, N, K, scaling=scaling)
    bias = rng.standard_normal(N).astype(np.float32)
    got = _run(backend, a, b, out_dtype="float32", bias=to_backend(bias, backend), activation="gelu")
    want = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation="gelu")
    assert rel_err(to_numpy(got), want) < 1e-4
    t = _run(backend, a, b, out_dtype="e4m3", out_scale=2.0)
    v = ref.fp8_gemm(a, b, out_dtype="float32")
    deq = rfp8.fp8_to_float(to_numpy(t.data), "e4m3") / 2.0
    assert rel_err(deq, v) < 0.05
    assert abs(float(np.asarray(to_numpy(t.amax)).reshape(())) - np.abs(v).max()) <= 1e-4 * np.abs(v).max()


@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("case", ["split_f32", "fast_bias_gelu_f32", "e4m3_out", "block_f32", "accumulate"])
def test_gpu_repeat_calls_through_the_call_cache(backend, case):
    """Three calls of one signature with fresh operands: the first plans (fusedkit/_callcache.py), the
    next two launch the cached plan; each result against the reference, FP8 bytes and amax exact against
    the same call's fp32 output (tests/test_gemm_host_path.py checks the parameters without a GPU)."""
    _callcache.clear()
    M, N, K = 1040, 784, 528   # 7 x 7 tiles, a partial tile in M and N
    for i in range(3):
        rng = rng_for("callcache", backend, case, i)
        a, b = host_operands(rng, M, N, K, scaling="block" if case == "block_f32" else "tensor")
        ad, bd = to_dev(a, backend), to_dev(b, backend)
        split = not case.startswith("fast")
        bias = rng.standard_normal(N).astype(np.float32) if "bias" in case or case == "e4m3_out" else None
        kw = dict(use_split_accumulator=split, bias=None if bias is None else to_backend(bias, backend),
                  activation="gelu" if bias is not None else None)
        want = ref.fp8_gemm(a, b, out_dtype="float32", bias=bias, activation=kw["activation"])
        if case == "e4m3_out":
            scale = np.float32(rng.uniform(0.2, 2.0))
            v32 = to_numpy(fk.fp8_gemm(ad, bd, out_dtype="float32", **kw))
            t = fk.fp8_gemm(ad, bd, out_dtype="e4m3", out_scale=to_backend(np.array([scale], np.float32), backend),
                            **kw)
            np.testing.assert_array_equal(to_numpy(t.data), rfp8.cast_to_fp8(v32 * scale, "e4m3"))
            amax = np.asarray(to_numpy(t.amax), np.float32).reshape(())
            assert amax.view(np.uint32) == np.abs(v32).max().astype(np.float32).view(np.uint32)
            np.testing.assert_allclose(np.asarray(to_numpy(t.scale_inv)).reshape(()), 1 / scale, rtol=1e-7)
            got = v32
        elif case == "accumulate":
            c0 = rng.standard_normal((M, N)).astype(np.float32)
            c = to_backend(c0, backend)
            assert fk.fp8_gemm(ad, bd, out_dtype="float32", accumulate_into=c, **kw) is c
            got, want = to_numpy(c), want + c0
        else:
            got = to_numpy(fk.fp8_gemm(ad, bd, out_dtype="float32", **kw))
        assert rel_err(got, want) < _tol("split" if split else "fast"), f"call {i}"
    assert len(_callcache._plans) == (2 if case == "e4m3_out" else 1)


@pytest.mark.parametrize("backend", GPU)
def test_gpu_errors(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    a, b = _ops()
    A, B = to_dev(a, backend), to_dev(b, backend)
    with pytest.raises(TypeError, match="bias"):
        fk.fp8_gemm(A, B, out_dtype="float32", bias=np.zeros(32, np.float32))  # host bias, device operands
    if backend == "cupy":
        with pytest.raises(TypeError, match="bfloat16"):
            fk.fp8_gemm(A, B)  # default bf16 output: CuPy cannot hold it
