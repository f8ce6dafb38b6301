"""fusedkit.dact_cast_transpose: g = dy * act'(x) cast to FP8 row-wise and transposed in one pass, with
optional dbias (column sums of g), on every backend against the CPU reference
(fusedkit.reference.fp8.dact_cast_transpose).

Criterion: ReLU and squared ReLU give g with one rounding (dy times an exact derivative), so their
bytes, amax and scale_inv must equal the reference exactly. The other derivatives (cuda/common/act.cuh:
GeLU-tanh and SiLU through the fast sigmoid, a few ulp; GeLU-erf through erff / expf; the kernel may
contract a multiply-add) differ from the reference's (float64 rounded once, or fp32 NumPy for erf) by a
few ulp, so there the bytes must agree to within one FP8 code (or, for a tiny g, to 5e-6 in value), with
at most 0.1 % of them (or one byte) differing, as tests/test_activations.py::test_fp8_output asks, and
amax (and a current-scaling scale_inv) to 4e-6 relative (where the derivative cancels, e.g. GeLU near x
= -1, a few ulp of the sigmoid become a few more of g). GeLU-erf's 1 + erf(x / sqrt 2) cancels at x << 0
(as in torch and Transformer Engine): there the kernels' erff and the reference's rounded erf differ by a
few ulp of 1, not of the result, so those bytes may lie anywhere between the reference's codes at g -+
that absolute bound (erf_window). dbias within the fp32-accumulation tolerance of
a float64 sum. Shapes: (67, 256) and (136, 264) take the 16-byte-load path, (130, 72) a partial row
group with M % 8 != 0, (33, 100) and (5, 13) the fallback (N % 8 != 0: g in fp32 first, then the fp32
cast-transpose with scalar loads), (3, 5, 40) leading dims. The gated kinds (SwiGLU, GeGLU, ReGLU) run
the same tests with x of twice dy's width (H = dy's last dim: 72 puts a tile across the two halves, 13
and 100 take the fallback); tests/test_fp8_dgated.py has their own."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy
from test_fp8_cast_transpose import check_dbias
from test_fp8_quantize import F32, rng_for

GATED = ["swiglu", "geglu", "geglu_erf", "reglu"]  # x = [a | b]: twice dy's last dim (tests/test_fp8_dgated.py)
ACTIVATIONS = ["gelu", "gelu_erf", "silu", "relu", "squared_relu"] + GATED
EXACT = ("relu", "squared_relu", "reglu")
SHAPES = [(0, 16), (0, 13), (5, 13), (3, 5, 40), (33, 100), (67, 256), (130, 72), (136, 264)]


def _ordinal(b):
    """FP8 bytes -> signed position on the number line (sign-magnitude codes are ordered within a sign)."""
    b = np.asarray(b, np.int16)
    return np.where(b & 0x80, -(b & 0x7F), b)


# |error| of GeLU-erf's Phi(x) = (1 + erf(x / sqrt 2)) / 2 in fp32 whatever x: erff's 2 ulp of 1 and the
# reference's rounding, halved, with a factor 4 of margin (an absolute bound: it cancels at x << 0)
PHI_ABS = 2.0 ** -22


def erf_window(dy, x, activation, fmt, scale):
    """The reference's bytes at g -+ the GeLU-erf kinds' absolute error bound (lo, hi; None for the other
    kinds): dact = Phi + x phi(x) carries Phi's error, act = x Phi carries |x| times it; the gated kinds
    scale them by dy b (first half) and dy (second half)."""
    if activation not in ("gelu_erf", "geglu_erf"):
        return None
    d, xf = np.abs(np.asarray(dy, np.float64)), np.abs(np.asarray(x, np.float64))
    if activation == "gelu_erf":
        bound = d * PHI_ABS
    else:
        H = xf.shape[-1] // 2
        bound = np.concatenate([d * xf[..., H:], d * xf[..., :H]], axis=-1) * PHI_ABS
    g = ref.dact_values(dy, x, activation).astype(np.float64)
    return tuple(ref.quantize_delayed((g + sign * bound).astype(F32), scale, fmt)[0] for sign in (-1, 1))


def check_bytes(got, want, fmt, scale, exact, what, few=1, window=None):
    """``few``: how many bytes may be one code off however small the tensor (0.1 % of them beyond);
    ``window``: (lo, hi) bytes, any code between them is right (erf_window)."""
    got = np.asarray(to_numpy(got), np.uint8)
    want = np.asarray(want, np.uint8)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    diff = np.abs(_ordinal(got) - _ordinal(want))
    if window is not None:
        lo, hi = (_ordinal(np.asarray(w, np.uint8).reshape(got.shape)) for w in window)
        diff[(np.minimum(lo, hi) <= _ordinal(got)) & (_ordinal(got) <= np.maximum(lo, hi))] = 0
    err = np.abs(ref.fp8_to_float(got, fmt) - ref.fp8_to_float(want, fmt)) / scale
    assert ((diff <= 1) | (err <= 5e-6)).all(), f"{what}: bytes more than one code apart"
    assert (diff > 0).sum() <= max(few, 1e-3 * diff.size), f"{what}: {(diff > 0).sum()} bytes differ"


def check(t, dy, x, activation, fmt, scale, current=None, db=None):
    """t (and db) against the reference; scale: the delayed scale, or None with ``current`` a recipe.
    The gated kinds may have two bytes one code off in a small tensor: both halves of their g go through
    an inexact function (act' and act; on the H100, GeGLU-erf fp16 at 3 x 5 x 48 had two)."""
    exact = activation in EXACT
    few = 2 if activation in ("swiglu", "geglu", "geglu_tanh", "geglu_erf") else 1
    if current is None:
        data, data_t, sinv, amax, want_db = ref.dact_cast_transpose(dy, x, activation, fmt, scale)
    else:
        data, data_t, sinv, amax, want_db = ref.dact_cast_transpose(dy, x, activation, fmt, None,
                                                                    current.amax_epsilon,
                                                                    current.power_of_2_scales)
    s = F32(1.0) / sinv
    window = erf_window(dy, x, activation, fmt, s)
    check_bytes(t.data, data, fmt, s, exact, "data", few, window)
    n = x.shape[-1]  # x's shape is g's (gated kinds: twice dy's last dim)
    assert tuple(t.data_t.shape) == (n, x.size // n)
    check_bytes(t.data_t, data_t, fmt, s, exact, "data_t", few,
                window and tuple(ref.transpose_2d(w) for w in window))
    got_sinv = F32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0])
    got_amax = F32(np.asarray(to_numpy(t.amax)).reshape(-1)[0])
    if exact or current is None:
        assert got_sinv == sinv
    else:
        np.testing.assert_allclose(got_sinv, sinv, rtol=4e-6)
    if exact:
        assert got_amax == amax
    else:
        np.testing.assert_allclose(got_amax, amax, rtol=4e-6)
    if db is not None:
        assert str(to_numpy(db).dtype) == str(dy.dtype)
        check_dbias(db, ref.dact_values(dy, x, activation), str(dy.dtype))


def inputs(rng, shape, dtype, activation=None):
    """x spread over the activations' interesting range, dy gradient-like with a few large values; dy
    has ``shape``, and so does x but for the gated kinds (twice the last dim)."""
    x_shape = tuple(shape[:-1]) + (2 * shape[-1],) if activation in GATED else shape
    x = rand(rng, x_shape, dtype, scale=3.0)
    dy = rand(rng, shape, "float32", scale=2.0)
    flat = dy.reshape(-1)
    if flat.size >= 3:
        flat[:3] = [3000.0, -3000.0, 1e-3]
    return dy.astype(x.dtype), x


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dact_cast_transpose_delayed(backend, dtype, activation, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("dact", backend, dtype, activation, shape)
    dy, x = inputs(rng, shape, dtype, activation)
    scale = F32(57344.0 / 4000.0)
    t = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                               scale=float(scale))
    assert t.fmt.name == "e5m2" and t.data_t is not None and tuple(t.data.shape) == x.shape
    check(t, dy, x, activation, "e5m2", scale)


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("activation", ["gelu", "silu", "relu", "swiglu", "reglu"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(0, 16), (5, 13), (130, 72), (777, 100), (1100, 264)], ids=str)
def test_dact_cast_transpose_dbias(backend, dtype, activation, fmt, shape):
    """With dbias: several blocks down the rows add partial sums ((777, 100): two, through the fp32
    fallback, whose fp32 dbias is rounded to dy's dtype afterwards; (1100, 264): three). The gated
    kinds' dbias has x's width (the bias gradient of the projection before them)."""
    skip_unsupported(backend, dtype)
    rng = rng_for("dactdb", backend, dtype, activation, fmt, shape)
    dy, x = inputs(rng, shape, dtype, activation)
    scale = F32(fp8.as_format(fmt).max / 4000.0)
    t, db = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                                   fmt=fmt, scale=float(scale), dbias=True)
    assert tuple(db.shape) == (x.shape[-1],)
    check(t, dy, x, activation, fmt, scale, db=db)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("activation", ["gelu", "squared_relu", "swiglu", "reglu"])
@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_2_scales=True)],
                         ids=["plain", "pow2"])
@pytest.mark.parametrize("shape", [(67, 256), (33, 100)], ids=str)
def test_dact_cast_transpose_current(backend, activation, recipe, shape):
    """Current scaling: a first pass takes the amax of g (fp8_dact_values, fp8_dgated_values), the cast
    derives the scale from it."""
    skip_unsupported(backend, "float32")
    rng = rng_for("dactc", backend, activation, repr(recipe), shape)
    dy, x = inputs(rng, shape, "float32", activation)
    t, db = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                                   recipe=recipe, dbias=True)
    check(t, dy, x, activation, "e5m2", None, current=recipe, db=db)


@pytest.mark.parametrize("names", [("gelu", "gelu_tanh", "gelu_erf"), ("geglu", "geglu_tanh", "geglu_erf")],
                         ids=["gelu", "geglu"])
def test_default_is_the_tanh_form(names):
    """"gelu" / "geglu" are the tanh forms (as Transformer Engine's dgelu / dgeglu)."""
    default, tanh, erf = names
    dy, x = inputs(rng_for("dactgelu", default), (9, 24), "float32", default)
    a, b, c = (fk.dact_cast_transpose(dy, x, activation=k, scale=4.0) for k in names)
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)


def test_reference_values_match_float64():
    """The reference's g equals dy * act'(x) computed in float64 (to fp32 rounding, looser where the
    fp32 formula cancels) and its dbias the float64 column sums."""
    import math
    rng = rng_for("dact64")
    x = rand(rng, (40, 32), "float32", scale=3.0).astype(np.float64)
    dy = rand(rng, (40, 32), "float32").astype(np.float64)
    k0, k1 = math.sqrt(2 / math.pi), 0.044715
    t = np.tanh(k0 * (x + k1 * x ** 3))
    want = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k0 * (1 + 3 * k1 * x * x))
    g = ref.dact_values(dy.astype(np.float32), x.astype(np.float32), "gelu")
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)
    sig = 1 / (1 + np.exp(-x))
    want = dy * sig * (1 + x * (1 - sig))
    np.testing.assert_allclose(ref.dact_values(dy.astype(np.float32), x.astype(np.float32), "silu"), want,
                               rtol=1e-4, atol=1e-6)
    _, _, _, _, db = ref.dact_cast_transpose(dy.astype(np.float32), x.astype(np.float32), "relu", "e5m2", 1.0)
    np.testing.assert_allclose(db, (dy * (x > 0)).sum(0), rtol=1e-5, atol=1e-5)


def test_bad_input():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        fk.dact_cast_transpose(x, x, activation="tanh")
    with pytest.raises(ValueError, match="x must have dy's shape"):
        fk.dact_cast_transpose(x, np.ones((4, 9), np.float32))
    with pytest.raises(ValueError, match="x must have dy's shape"):
        fk.dact_cast_transpose(x, np.ones((4, 8), np.float16))
    with pytest.raises(TypeError, match="CurrentScaling"):
        fk.dact_cast_transpose(x, x, recipe=fp8.MXFP8Scaling())
    with pytest.raises(ValueError, match="at least one dimension"):
        fk.dact_cast_transpose(np.array(1.0, np.float32), np.array(1.0, np.float32))


@pytest.mark.gpu
def test_mixed_frameworks_rejected():
    pytest.importorskip("torch")
    x = rand(rng_for("dactmix"), (4, 8), "float32")
    with pytest.raises(TypeError, match="one framework"):
        fk.dact_cast_transpose(to_backend(x, "torch"), x)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 8], ids=lambda o: f"offset{o}")
def test_misaligned_views(offset):
    """bf16 views 2 bytes (the fallback through an fp32 g) and 16 bytes (the fused 16-byte-load path)
    off the allocation: both exact for ReLU."""
    pytest.importorskip("torch")
    rng = rng_for("dactmis", offset)
    dy, x = inputs(rng, (136 * 64 + offset,), "bfloat16")
    D = to_backend(dy, "torch")[offset:].view(136, 64)
    X = to_backend(x, "torch")[offset:].view(136, 64)
    t, db = fk.dact_cast_transpose(D, X, activation="relu", scale=8.0, dbias=True)
    check(t, dy[offset:].reshape(136, 64), x[offset:].reshape(136, 64), "relu", "e5m2", F32(8.0), db=db)


@pytest.mark.gpu
def test_dbias_deterministic():
    torch = pytest.importorskip("torch")
    dy, x = inputs(rng_for("dactdet"), (4096, 520), "bfloat16")
    D, X = to_backend(dy, "torch"), to_backend(x, "torch")
    dbs = [to_numpy(fk.dact_cast_transpose(D, X, scale=1.0, dbias=True)[1]) for _ in range(3)]
    torch.cuda.synchronize()
    for d in dbs[1:]:
        np.testing.assert_array_equal(d.view(np.uint16), dbs[0].view(np.uint16))
