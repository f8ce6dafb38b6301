"""fusedkit.cast_transpose and fusedkit.cast_transpose_dbias: row-wise and transposed FP8 bytes, amax
and scale_inv equal the CPU reference exactly on every backend (the GPU cases are the kernels'
acceptance test); dbias within the fp32-accumulation tolerance of a float64 sum, deterministic; and
column-wise MXFP8 (quantize(..., recipe=MXFP8Scaling(), columnwise=True)), bytes and scales exact.

Shapes and the GPU path they take (cuda_fp8.cast_transpose): N % 8 == 0 with aligned pointers takes
fp8_ct_tile (128 x 128 block tiles of 8 x 8 sub-tiles): (64, 64), (136, 264), (1024, 4096) with M % 8
== 0 (partial block tiles in both dims), (130, 72) and (132, 40) with M % 8 != 0 (narrower transposed
stores, a partial row group), (257, 96) and (3, 5, 40) with M odd (byte stores); N % 8 != 0 takes the
64 x 64 fallback: (1, 1), (7, 13), (12, 36). cast_transpose_dbias uses fp8_ct_tile everywhere (scalar
loads when N % 8 != 0)."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import TOL, backend_params, rand, skip_unsupported, to_backend, to_numpy
from test_fp8_quantize import F32, awkward, rng_for, same_bytes

SHAPES = [(0, 16), (1, 1), (7, 13), (12, 36), (64, 64), (130, 72), (132, 40), (136, 264), (257, 96), (3, 5, 40),
          (1024, 4096)]


def _check(t, x, fmt, want_data, want_sinv, want_amax):
    same_bytes(to_numpy(t.data), want_data, fmt)
    assert t.data_t is not None
    n = x.shape[-1]
    assert tuple(t.data_t.shape) == (n, x.size // n)
    same_bytes(to_numpy(t.data_t), ref.transpose_2d(want_data), fmt)
    assert F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == want_sinv
    assert F32(np.asarray(to_numpy(t.amax)).reshape(-1)[0]) == want_amax


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cast_transpose_delayed_matches_reference(backend, dtype, fmt, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("ct", backend, dtype, fmt, shape)
    f = fp8.as_format(fmt)
    x = awkward(rng, shape, dtype, f.max)
    scale = F32(0.37)
    t = fk.cast_transpose(to_backend(x, backend), fmt=fmt, scale=float(scale))
    data, sinv, amax = ref.quantize_delayed(x, scale, fmt)
    _check(t, x, fmt, data, sinv, amax)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_2_scales=True)],
                         ids=["plain", "pow2"])
@pytest.mark.parametrize("shape", [(257, 96), (130, 72), (64, 1000), (384, 256)], ids=str)
def test_cast_transpose_current_matches_reference(backend, dtype, recipe, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("ctc", backend, dtype, repr(recipe), shape)
    x = rand(rng, shape, dtype, scale=3.0)
    t = fk.quantize(to_backend(x, backend), fmt="e5m2", recipe=recipe, transpose=True)
    data, sinv, amax, _ = ref.quantize_current(x, "e5m2", recipe.amax_epsilon, recipe.power_of_2_scales)
    _check(t, x, "e5m2", data, sinv, amax)


def test_transpose_layout_is_2d():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    t = fk.cast_transpose(x, fmt="e4m3", scale=1.0)
    assert t.data_t.shape == (4, 6)
    np.testing.assert_array_equal(t.data_t, t.data.reshape(6, 4).T)


# ----------------------------------------------------------------------------------------------------
# cast_transpose_dbias

def check_dbias(got, values, dtype, what="dbias"):
    """dbias (the kernel adds fp32 in a fixed order, then rounds to dtype) against the float64 column
    sums of the fp32 ``values``: NaN and +-inf where the reference has them, else within the dtype's
    rounding (TOL) plus fp32 accumulation error (1e-5 of the column's sum of magnitudes)."""
    v = np.asarray(values, np.float64)
    n = v.shape[-1]
    v = v.reshape(-1, n)
    with np.errstate(invalid="ignore", over="ignore"):
        want = v.sum(axis=0)
        mag = np.abs(v).sum(axis=0)
    g = np.asarray(to_numpy(got)).astype(np.float64)
    assert g.shape == (n,), f"{what}: shape {g.shape} != {(n,)}"
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want), err_msg=f"{what}: NaN positions")
    inf = np.isinf(want)
    np.testing.assert_array_equal(g[inf], want[inf], err_msg=f"{what}: inf positions")
    fin = np.isfinite(want)
    tol = TOL[dtype][1] * np.abs(want[fin]) + 1e-5 * mag[fin] + 1e-30
    bad = np.abs(g[fin] - want[fin]) > tol
    assert not bad.any(), (f"{what}: {bad.sum()} columns off, worst {np.abs(g[fin] - want[fin])[bad].max():.3g} "
                           f"(got {g[fin][bad][:4]}, want {want[fin][bad][:4]})")


def finite_grad(rng, shape, dtype, fmax):
    """Gradient-like values: N(0, 3) plus a few beyond the format's max (finite in every dtype)."""
    x = rand(rng, shape, "float32", scale=3.0)
    flat = x.reshape(-1)
    if flat.size >= 4:
        big = min(1.1 * fmax, 60000.0)
        flat[:4] = [big, -big, 2.0**-9, 0.0]
    return x.astype(rand(rng, (1,), dtype).dtype)


DBIAS_SHAPES = [(0, 16), (1, 1), (7, 13), (64, 64), (130, 72), (257, 96), (3, 5, 40), (777, 100), (1100, 264),
                (2100, 136)]


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", DBIAS_SHAPES, ids=str)
def test_cast_transpose_dbias_delayed(backend, dtype, fmt, shape):
    """(777, 100) and (1100, 264): several blocks down the rows add their partial sums (gridDim.y 2 and
    3), (777, 100) on the scalar-load path."""
    skip_unsupported(backend, dtype)
    rng = rng_for("ctdb", backend, dtype, fmt, shape)
    f = fp8.as_format(fmt)
    dy = finite_grad(rng, shape, dtype, f.max)
    scale = F32(0.37)
    t, db = fk.cast_transpose_dbias(to_backend(dy, backend), fmt=fmt, scale=float(scale))
    data, sinv, amax = ref.quantize_delayed(dy, scale, fmt)
    _check(t, dy, fmt, data, sinv, amax)
    assert str(to_numpy(db).dtype) == str(dy.dtype)
    check_dbias(db, dy.astype(np.float32), dtype)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("shape", [(70, 64), (33, 13)], ids=str)
def test_cast_transpose_dbias_special_values(backend, shape):
    """+-inf, NaN, beyond-max and subnormal inputs: bytes exact, dbias inf / NaN where the sums are."""
    skip_unsupported(backend, "float32")
    rng = rng_for("ctdbs", backend, shape)
    dy = awkward(rng, shape, "float32", 57344.0)
    t, db = fk.cast_transpose_dbias(to_backend(dy, backend), fmt="e5m2", scale=0.37)
    data, sinv, amax = ref.quantize_delayed(dy, F32(0.37), "e5m2")
    _check(t, dy, "e5m2", data, sinv, amax)
    check_dbias(db, dy, "float32")


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_2_scales=True)],
                         ids=["plain", "pow2"])
@pytest.mark.parametrize("shape", [(600, 136), (65, 30)], ids=str)
def test_cast_transpose_dbias_current(backend, recipe, shape):
    skip_unsupported(backend, "float32")
    rng = rng_for("ctdbc", backend, repr(recipe), shape)
    dy = rand(rng, shape, "float32", scale=3.0)
    t, db = fk.cast_transpose_dbias(to_backend(dy, backend), fmt="e5m2", recipe=recipe)
    data, sinv, amax, _ = ref.quantize_current(dy, "e5m2", recipe.amax_epsilon, recipe.power_of_2_scales)
    _check(t, dy, "e5m2", data, sinv, amax)
    check_dbias(db, dy, "float32")


def test_cast_transpose_dbias_bad_input():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match="CurrentScaling"):
        fk.cast_transpose_dbias(x, recipe=fp8.DelayedScaling())
    with pytest.raises(TypeError, match="float32, float16"):
        fk.cast_transpose_dbias(np.ones((4, 8), np.int32))
    with pytest.raises(ValueError, match="at least one dimension"):
        fk.cast_transpose_dbias(np.array(1.0, np.float32))
    with pytest.raises(ValueError, match="e4m3"):
        fk.cast_transpose_dbias(x, fmt="int8")


@pytest.mark.gpu
def test_cast_transpose_dbias_deterministic():
    """The same input twice gives the same dbias bits (fixed-order partial sums, whichever block of a
    column strip finishes last)."""
    torch = pytest.importorskip("torch")
    rng = rng_for("ctdbdet")
    dy = to_backend(rand(rng, (4096, 520), "bfloat16", scale=2.0), "torch")
    dbs = [to_numpy(fk.cast_transpose_dbias(dy, fmt="e5m2", scale=1.0)[1]) for _ in range(3)]
    torch.cuda.synchronize()
    for d in dbs[1:]:
        np.testing.assert_array_equal(d.view(np.uint16), dbs[0].view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [4, 8], ids=lambda o: f"offset{o}")
def test_misaligned_views(offset):
    """A bf16 view 8 bytes off a 16-byte boundary takes the fallbacks (64 x 64 kernel, scalar loads),
    one 16 bytes off the fast kernel: both exact."""
    pytest.importorskip("torch")
    rng = rng_for("ctmis", offset)
    full = awkward(rng, (136 * 64 + offset,), "bfloat16", 448.0)
    X = to_backend(full, "torch")[offset:].view(136, 64)
    xs = full[offset:].reshape(136, 64)
    data, sinv, amax = ref.quantize_delayed(xs, F32(0.37), "e4m3")
    _check(fk.cast_transpose(X, fmt="e4m3", scale=0.37), xs, "e4m3", data, sinv, amax)
    g = finite_grad(rng, (136 * 64 + offset,), "bfloat16", 448.0)
    G = to_backend(g, "torch")[offset:].view(136, 64)
    gs = g[offset:].reshape(136, 64)
    t, db = fk.cast_transpose_dbias(G, fmt="e4m3", scale=0.37)
    data, sinv, amax = ref.quantize_delayed(gs, F32(0.37), "e4m3")
    _check(t, gs, "e4m3", data, sinv, amax)
    check_dbias(db, gs.astype(np.float32), "bfloat16")


# ----------------------------------------------------------------------------------------------------
# Column-wise MXFP8 (the MXFP8 operand of the weight-gradient GEMM): blocks of 32 rows of each column

MXC_SHAPES = [(0, 8), (1, 1), (31, 3), (32, 7), (100, 5), (256, 64), (1000, 129), (3, 5, 40), (33, 4096)]


def _column_blocky(rng, shape, dtype, fmax):
    """awkward() plus an all-zero column block and a block of tiny values, so every scale branch runs."""
    x = awkward(rng, shape, dtype, fmax)
    x2 = x.reshape(-1, shape[-1])
    if x2.shape[0] >= 64 and x2.shape[1] >= 2:
        x2[:32, -1] = 0
        x2[32:64, -2] = x2[32:64, -2] * np.asarray(1e-30, x2.dtype)
    return x


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", MXC_SHAPES, ids=str)
def test_mxfp8_columnwise_matches_reference(backend, dtype, fmt, shape):
    """Bytes and E8M0 scales exact, with partial last blocks (M % 32 != 0); on the GPU odd N takes the
    scalar path ((1, 1), (31, 3), (32, 7), (100, 5), (1000, 129)), the others 8-byte row loads."""
    skip_unsupported(backend, dtype)
    rng = rng_for("mxc", backend, dtype, fmt, shape)
    x = _column_blocky(rng, shape, dtype, fp8.as_format(fmt).max)
    t = fk.quantize(to_backend(x, backend), fmt=fmt, recipe=fp8.MXFP8Scaling(), columnwise=True)
    data, scales = ref.quantize_mxfp8_columnwise(x, fmt)
    n = shape[-1]
    assert t.mode == "mxfp8" and t.block == (32, 1)
    assert scales.shape == (-(-(x.size // n) // 32), n)
    same_bytes(to_numpy(t.data), data, fmt)
    np.testing.assert_array_equal(np.asarray(to_numpy(t.scale_inv), np.uint8), scales)


def test_mxfp8_columnwise_reference_is_the_rowwise_one_transposed():
    """The column-wise reference equals the row-wise MXFP8 of the transposed matrix (transposed back), and
    dequantizes within the format's step."""
    rng = rng_for("mxcref")
    x = rand(rng, (70, 48), "float32", scale=5.0)
    data, scales = ref.quantize_mxfp8_columnwise(x, "e4m3")
    d_t, s_t = ref.quantize_mxfp8(np.ascontiguousarray(x.T), "e4m3")
    np.testing.assert_array_equal(data, d_t.T)
    np.testing.assert_array_equal(scales, s_t.T)
    back = fk.quantize(x, recipe=fp8.MXFP8Scaling(), columnwise=True).dequantize()
    assert np.all(np.abs(back - x) <= np.abs(x) / 16 + 2.0**-9 * np.abs(x).max())
    # scale of column c, block b covers rows 32 b .. 32 b + 31 only
    x2 = x.copy()
    x2[40, 3] = 1000.0
    _, s2 = ref.quantize_mxfp8_columnwise(x2, "e4m3")
    changed = np.argwhere(s2 != scales)
    np.testing.assert_array_equal(changed, [[1, 3]])


def test_mxfp8_columnwise_bad_input():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="MXFP8Scaling"):
        fk.quantize(x, columnwise=True)
    with pytest.raises(ValueError, match="MXFP8Scaling"):
        fk.quantize(x, recipe=fp8.BlockScaling(), columnwise=True)
    with pytest.raises(ValueError, match="no `scale`"):
        fk.quantize(x, recipe=fp8.MXFP8Scaling(), columnwise=True, scale=1.0)
