"""Block-scaled FP8 quantization (MXFP8 32-element blocks with E8M0 scales; 1 x 128 blocks with fp32
power-of-two scales): bytes and scales equal the CPU reference exactly on every backend, including
values beyond the format's max, +-inf, NaN, subnormals, all-zero blocks and partial blocks."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy
from test_fp8_quantize import awkward, rng_for, same_bytes

SHAPES = [(1, 1), (3, 31), (7, 32), (5, 100), (64, 256), (129, 1000), (257, 4096)]


def _blocky(rng, shape, dtype, fmax):
    """awkward() plus a whole zero block and one block of tiny values, so every scale branch runs."""
    x = awkward(rng, shape, dtype, fmax)
    flat = x.reshape(shape[0], -1)
    if flat.shape[1] >= 64:
        flat[-1, :32] = 0
        flat[-1, 32:64] = flat[-1, 32:64] * 1e-30
    return x


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mxfp8_matches_reference(backend, dtype, fmt, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("mx", backend, dtype, fmt, shape)
    x = _blocky(rng, shape, dtype, fp8.as_format(fmt).max)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, recipe=fp8.MXFP8Scaling())
    data, scales = ref.quantize_mxfp8(x, fmt)
    assert t.mode == "mxfp8" and t.block == 32
    same_bytes(to_numpy(t.data), data, fmt)
    np.testing.assert_array_equal(np.asarray(to_numpy(t.scale_inv), np.uint8), scales)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_1x128_matches_reference(backend, dtype, fmt, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("b128", backend, dtype, fmt, shape)
    x = _blocky(rng, shape, dtype, fp8.as_format(fmt).max)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, recipe=fp8.BlockScaling())
    data, sinv = ref.quantize_blockwise(x, (1, 128), fmt)
    assert t.mode == "block" and t.block == (1, 128)
    same_bytes(to_numpy(t.data), data, fmt)
    got = np.asarray(to_numpy(t.scale_inv), np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), sinv.view(np.uint32))


def test_block_quantized_values_round_trip():
    """Dequantized values stay within the format's relative step of the input."""
    rng = rng_for("rt")
    x = rand(rng, (33, 300), "float32", scale=7.0)
    for recipe, tol in ((fp8.MXFP8Scaling(), 2.0**-3), (fp8.BlockScaling(), 2.0**-3)):
        t = fk.quantize(x, fmt="e4m3", recipe=recipe)
        np.testing.assert_allclose(t.dequantize(), x, rtol=tol, atol=1e-6)


def test_block_scaling_bad_input():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match="no `scale`"):
        fk.quantize(x, recipe=fp8.MXFP8Scaling(), scale=1.0)
    with pytest.raises(ValueError, match="32 elements"):
        fk.quantize(x, recipe=fp8.MXFP8Scaling(block=16))


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (128, 128), (130, 300), (257, 1024)], ids=str)
def test_block_128x128_matches_reference(backend, dtype, fmt, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("b2d", backend, dtype, fmt, shape)
    x = _blocky(rng, shape, dtype, fp8.as_format(fmt).max)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, recipe=fp8.BlockScaling(), weight=True)
    data, sinv = ref.quantize_blockwise(x, (128, 128), fmt)
    assert t.mode == "block" and t.block == (128, 128)
    same_bytes(to_numpy(t.data), data, fmt)
    got = np.asarray(to_numpy(t.scale_inv), np.float32)
    assert got.shape == sinv.shape
    np.testing.assert_array_equal(got.view(np.uint32), sinv.view(np.uint32))


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_block_128x128_special_tiles(backend, dtype, fmt):
    """One special value per 128 x 128 tile, so each tile's amax meets it alone (awkward() puts them all
    in the first tile, where the inf decides): a NaN (left out of the amax), a negative largest magnitude,
    -inf, subnormals only, zeros only, NaN among zeros, -0.0 only, and a tile of odd width and height."""
    skip_unsupported(backend, dtype)
    rng = rng_for("b2d-special", backend, dtype, fmt)
    fmax = fp8.as_format(fmt).max
    x = rand(rng, (300, 400), "float32", scale=fmax / 16)
    tiles = [x[r:r + 128, c:c + 128] for r in (0, 128, 256) for c in (0, 128, 256, 384)]
    tiles[0][5, 7] = np.nan
    tiles[1][100, 3] = -fmax * 2
    tiles[2][0, 0] = -np.inf
    tiles[3][:] = rng.uniform(-1, 1, tiles[3].shape) * np.float32(2.0**-20)  # subnormal in fp16
    tiles[4][:] = 0
    tiles[5][:] = 0
    tiles[5][64, 64] = np.nan
    tiles[6][:] = -0.0
    tiles[9][40, 1] = np.nan  # bottom row of tiles: 44 rows
    tiles[10][43, 127] = -fmax * 5
    tiles[11][0, 15] = np.inf  # last tile: 44 x 16
    with np.errstate(over="ignore"):
        x = x.astype(rand(rng, (1,), dtype).dtype)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, recipe=fp8.BlockScaling(), weight=True)
    data, sinv = ref.quantize_blockwise(x, (128, 128), fmt)
    same_bytes(to_numpy(t.data), data, fmt)
    got = np.asarray(to_numpy(t.scale_inv), np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), sinv.view(np.uint32))
    # the tiles did get different scales (fp16 with E5M2: the 2x and 5x max tiles are inf, so only 3)
    assert len(set(got.reshape(-1).tolist())) >= 3


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("unroll", [0, 2, 4], ids=lambda u: f"unroll{u}")
@pytest.mark.parametrize("mx", [True, False], ids=["mxfp8", "1x128"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(3, 128), (64, 256), (257, 4096), (1000, 384)], ids=str)
def test_block_walks_match_reference(monkeypatch, backend, unroll, mx, dtype, shape):
    """Both walks of the row-wise block kernel (cuda_fp8.BLOCKS_UNROLL: 0 the grid-stride one, U > 0 the
    flat one-pass one, taken for rows of whole blocks) give the reference's bytes and scales; the shapes
    end in a partial chunk of the flat walk (M x K / 8 not a multiple of 256 x U)."""
    from fusedkit import _callcache
    from fusedkit.backends import cuda_fp8
    skip_unsupported(backend, dtype)
    monkeypatch.setattr(cuda_fp8, "BLOCKS_UNROLL", unroll)
    _callcache.clear()
    rng = rng_for("walks", backend, unroll, mx, dtype, shape)
    x = _blocky(rng, shape, dtype, fp8.E4M3.max)
    t = fk.quantize(to_backend(x, backend), fmt="e4m3", recipe=fp8.MXFP8Scaling() if mx else fp8.BlockScaling())
    data, scales = ref.quantize_mxfp8(x, "e4m3") if mx else ref.quantize_blockwise(x, (1, 128), "e4m3")
    same_bytes(to_numpy(t.data), data, "e4m3")
    bits = np.uint8 if mx else np.uint32
    np.testing.assert_array_equal(np.asarray(to_numpy(t.scale_inv)).view(bits), scales.view(bits))
