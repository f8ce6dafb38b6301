"""fusedkit.dact_cast_transpose with the gated activations (SwiGLU, GeGLU tanh / erf, ReGLU; Transformer
Engine's dswiglu / dgeglu / dreglu cast-transposes): x = [a | b] along its last dim (2H), dy of H,
g = [dy * b * act'(a) | dy * act(a)] cast to FP8 row-wise and transposed. tests/test_fp8_dact.py runs
its delayed, dbias and current-scaling tests on the gated kinds too (and GeGLU's tanh default); here
what is theirs alone: the reference against the activation backward, the shape checks, misaligned
views and the two block layouts at partial strips and row tiles (paired blocks without dbias, per-half
blocks with it). Same criteria (ReGLU exact, the others within one FP8 code)."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend
from test_fp8_dact import GATED, check, inputs
from test_fp8_quantize import F32, rng_for


def gated_inputs(rng, shape, dtype):
    """dy of ``shape`` (a few large values), x = [a | b] of twice its last dim."""
    return inputs(rng, shape, dtype, "swiglu")


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
def test_gated_blocks_match_reference(backend, dtype, activation, scaling, shape):
    """Both block layouts against the reference: without dbias the paired blocks (a block covers 128
    columns of dy and writes both output halves), with dbias the per-half blocks; shapes with partial
    strips (H = 24, 72, 264) and partial row tiles (M = 15, 130, 136, 257)."""
    skip_unsupported(backend, dtype)
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
