"""One test body, every backend: make inputs in a backend from NumPy, and read results back."""
from __future__ import annotations

import numpy as np
import pytest

from fusedkit._dtypes import numpy_dtype

# backend name -> pytest marks
BACKENDS = {
    "numpy": [],
    "torch_cpu": [],
    "cupy": [pytest.mark.gpu],
    "torch": [pytest.mark.gpu],
    "jax": [pytest.mark.gpu],
}

# Tolerances keyed by the dtype being compared (atol, rtol): the one table every test uses.
TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
# Relative-norm tolerance for reductions over rows (dweight, dbias).
REL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def backend_params(names=tuple(BACKENDS)):
    return [pytest.param(n, marks=BACKENDS[n], id=n) for n in names]


def skip_unsupported(backend: str, dtype: str):
    if backend == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16 dtype")
    if backend.startswith("torch"):
        pytest.importorskip("torch")
    if backend == "jax":
        pytest.importorskip("jax")


def rand(rng, shape, dtype: str, loc=0.0, scale=1.0):
    """Random array rounded to the storage dtype (the reference sees the same values)."""
    return (loc + scale * rng.standard_normal(shape)).astype(np.float32).astype(numpy_dtype(dtype))


def to_backend(a, backend: str):
    if a is None or backend == "numpy":
        return a
    if backend in ("torch", "torch_cpu"):
        import torch
        dev = "cuda" if backend == "torch" else "cpu"
        if a.dtype == numpy_dtype("bfloat16"):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).to(dev)
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)
    if backend == "cupy":
        import cupy
        return cupy.asarray(a)
    if backend == "jax":
        import jax
        import jax.numpy as jnp
        return jax.device_put(jnp.asarray(a), jax.devices("gpu")[0])
    raise AssertionError(backend)


def to_numpy(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        import torch
        a = a.detach().cpu()
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return a.numpy()
    if mod == "cupy":
        return a.get()
    return np.asarray(a)


def framework_of(a) -> str:
    return type(a).__module__.split(".")[0]


def assert_close(got, want, dtype: str, what: str):
    atol, rtol = TOL[dtype]
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    assert not np.isnan(g).any() or np.isnan(w).any(), f"{what}: NaN in result"
    np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, err_msg=what)


def assert_rel(got, want, dtype: str, what: str):
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
    assert err < REL[dtype], f"{what}: relative error {err:.3g} >= {REL[dtype]}"
