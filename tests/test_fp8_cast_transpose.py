"""fusedkit.cast_transpose: row-wise and transposed FP8 bytes, amax and scale_inv equal the CPU
reference exactly on every backend (the GPU cases are the kernel's acceptance test)."""
import numpy as np
import pytest

import fusedkit as fk
from fusedkit import fp8
from fusedkit.reference import fp8 as ref
from _backends import backend_params, rand, skip_unsupported, to_backend, to_numpy
from test_fp8_quantize import F32, awkward, rng_for, same_bytes

SHAPES = [(0, 16), (1, 1), (7, 13), (64, 64), (130, 72), (257, 96), (3, 5, 40), (1024, 4096)]


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
@pytest.mark.parametrize("shape", [(257, 96), (130, 72), (64, 1000)], ids=str)
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
