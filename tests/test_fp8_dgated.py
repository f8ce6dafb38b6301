"""fusedkit.dact_cast_transpose with the gated activations (SwiGLU, GeGLU tanh / erf, ReGLU; Transformer
Engine's dswiglu / dgeglu / dreglu cast-transposes): x = [a | b] along its last dim (2H), dy of H,
g = [dy * b * act'(a) | dy * act(a)] cast to FP8 row-wise and transposed, with optional dbias, on every
backend against the CPU reference. Same criteria as tests/test_fp8_dact.py (ReGLU exact, the others
within one FP8 code). Shapes (H = dy's last dim): 24, 72, 128, 264 take the fused 16-byte-load path
(H % 8 == 0; 72 puts a 128-column tile across the two halves, (130, 72) also a partial row group), 13
and 100 the fallback (g in fp32 first), (3, 5, 24) leading dims, M = 0. The paired-block experiment
(cuda_fp8.DGATED_PAIRED) has its own GPU test."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend
from test_fp8_dact import check
from test_fp8_quantize import F32, rng_for

GATED = ["swiglu", "geglu", "geglu_erf", "reglu"]
SHAPES = [(0, 8), (5, 13), (3, 5, 24), (33, 100), (67, 128), (130, 72), (136, 264)]


def gated_inputs(rng, shape, dtype):
    """dy of ``shape`` (a few large values), x = [a | b] of twice its last dim."""
    x = rand(rng, tuple(shape[:-1]) + (2 * shape[-1],), dtype, scale=3.0)
    dy = rand(rng, shape, "float32", scale=2.0)
    flat = dy.reshape(-1)
    if flat.size >= 3:
        flat[:3] = [3000.0, -3000.0, 1e-3]
    return dy.astype(x.dtype), x


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", GATED)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dgated_cast_transpose_delayed(backend, dtype, activation, shape):
    skip_unsupported(backend, dtype)
    rng = rng_for("dgated", backend, dtype, activation, shape)
    dy, x = gated_inputs(rng, shape, dtype)
    scale = F32(57344.0 / 4000.0)
    t = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                               scale=float(scale))
    assert tuple(t.data.shape) == x.shape
    check(t, dy, x, activation, "e5m2", scale)


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("activation", ["swiglu", "reglu"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(0, 8), (5, 13), (130, 72), (777, 100), (1100, 136)], ids=str)
def test_dgated_cast_transpose_dbias(backend, dtype, activation, fmt, shape):
    """dbias = column sums of g over the rows (2H of them): the bias gradient of the layer before."""
    skip_unsupported(backend, dtype)
    rng = rng_for("dgateddb", backend, dtype, activation, fmt, shape)
    dy, x = gated_inputs(rng, shape, dtype)
    scale = F32(fp8.as_format(fmt).max / 4000.0)
    t, db = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                                   fmt=fmt, scale=float(scale), dbias=True)
    assert tuple(db.shape) == (x.shape[-1],)
    check(t, dy, x, activation, fmt, scale, db=db)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("activation", ["swiglu", "reglu"])
@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_2_scales=True)],
                         ids=["plain", "pow2"])
@pytest.mark.parametrize("shape", [(67, 128), (33, 100)], ids=str)
def test_dgated_cast_transpose_current(backend, activation, recipe, shape):
    """Current scaling: the first pass (fp8_dgated_values) takes the amax of both halves of g."""
    skip_unsupported(backend, "float32")
    rng = rng_for("dgatedc", backend, activation, repr(recipe), shape)
    dy, x = gated_inputs(rng, shape, "float32")
    t, db = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                                   recipe=recipe, dbias=True)
    check(t, dy, x, activation, "e5m2", None, current=recipe, db=db)


def test_geglu_is_the_tanh_form():
    dy, x = gated_inputs(rng_for("dgeglu"), (9, 24), "float32")
    a = fk.dact_cast_transpose(dy, x, activation="geglu", scale=4.0)
    b = fk.dact_cast_transpose(dy, x, activation="geglu_tanh", scale=4.0)
    c = fk.dact_cast_transpose(dy, x, activation="geglu_erf", scale=4.0)
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)


def test_reference_matches_the_activation_backward():
    """The reference's g is fusedkit.swiglu_backward's dx before its rounding to x's dtype (float64 check
    of the SwiGLU derivative), and ReGLU's equals the plain ReLU gradient times b in the first half."""
    rng = rng_for("dgated64")
    dy, x = gated_inputs(rng, (40, 32), "float32")
    a, b = x[:, :32].astype(np.float64), x[:, 32:].astype(np.float64)
    sig = 1 / (1 + np.exp(-a))
    want = np.concatenate([dy * b * sig * (1 + a * (1 - sig)), dy * a * sig], axis=1)
    g = ref.dact_values(dy, x, "swiglu")
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g, np.asarray(fk.swiglu_backward(dy, x), np.float32), rtol=1e-6, atol=1e-6)
    r = ref.dact_values(dy, x, "reglu")
    np.testing.assert_array_equal(r[:, :32], (dy * x[:, 32:]) * (x[:, :32] > 0))
    np.testing.assert_array_equal(r[:, 32:], dy * np.maximum(x[:, :32], 0))


def test_bad_input():
    dy = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="twice dy's last dim"):
        fk.dact_cast_transpose(dy, dy, activation="swiglu")
    with pytest.raises(ValueError, match="twice dy's last dim"):
        fk.dact_cast_transpose(dy, np.ones((4, 16), np.float16), activation="geglu")
    with pytest.raises(ValueError, match="twice dy's last dim"):
        fk.dact_cast_transpose(dy, np.ones((5, 16), np.float32), activation="reglu")


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("activation", GATED)
@pytest.mark.parametrize("scaling", ["delayed", "current", "dbias"])
@pytest.mark.parametrize("shape", [(3, 5, 24), (130, 72), (136, 264), (257, 256)], ids=str)
def test_paired_blocks_match_reference(monkeypatch, backend, dtype, activation, scaling, shape):
    """The paired-block experiment (cuda_fp8.DGATED_PAIRED: a block covers 128 columns of dy and writes
    both output halves) against the reference; with dbias the shipped blocks run instead."""
    from fusedkit.backends import cuda_fp8
    skip_unsupported(backend, dtype)
    monkeypatch.setattr(cuda_fp8, "DGATED_PAIRED", 1)
    rng = rng_for("dgatedpair", backend, dtype, activation, scaling, shape)
    dy, x = gated_inputs(rng, shape, dtype)
    scale = None if scaling == "current" else F32(57344.0 / 4000.0)
    recipe = fp8.CurrentScaling() if scaling == "current" else None
    r = fk.dact_cast_transpose(to_backend(dy, backend), to_backend(x, backend), activation=activation,
                               scale=None if scale is None else float(scale), recipe=recipe,
                               dbias=scaling == "dbias")
    t, db = r if scaling == "dbias" else (r, None)
    check(t, dy, x, activation, "e5m2", scale, current=recipe, db=db)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 8], ids=lambda o: f"offset{o}")
def test_misaligned_views(offset):
    """bf16 views 2 bytes (the fallback through an fp32 g) and 16 bytes (the fused path) off the
    allocation: exact for ReGLU."""
    pytest.importorskip("torch")
    rng = rng_for("dgatedmis", offset)
    dy = rand(rng, (136 * 64 + offset,), "bfloat16", scale=2.0)
    xx = rand(rng, (136 * 128 + offset,), "bfloat16", scale=3.0)
    D = to_backend(dy, "torch")[offset:].view(136, 64)
    X = to_backend(xx, "torch")[offset:].view(136, 128)
    t, db = fk.dact_cast_transpose(D, X, activation="reglu", scale=8.0, dbias=True)
    check(t, dy[offset:].reshape(136, 64), xx[offset:].reshape(136, 128), "reglu", "e5m2", F32(8.0), db=db)
