"""Activations, forward and backward, on every backend, against float64 formulas (whose derivatives
are themselves checked by finite differences). Odd shapes, leading dims, bias, out_dtype, bad input."""
import math
import zlib

import numpy as np
import pytest

import fusedkit as fk
from _backends import assert_close, backend_params, framework_of, rand, skip_unsupported, to_backend, to_numpy

DTYPES = ["float32", "float16", "bfloat16"]
SHAPES = [(0, 8), (1, 2), (7, 14), (3, 5, 66), (129, 1024)]
ERF = np.vectorize(math.erf, otypes=[np.float64])


def f64(kind, x):
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "gelu_erf":
        return 0.5 * x * (1 + ERF(x / math.sqrt(2)))
    if kind == "silu":
        return x / (1 + np.exp(-x))
    if kind == "relu":
        return np.maximum(x, 0)
    return np.maximum(x, 0) ** 2


def df64(kind, x):
    if kind == "gelu_tanh":
        k0, k1 = math.sqrt(2 / math.pi), 0.044715
        t = np.tanh(k0 * (x + k1 * x ** 3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k0 * (1 + 3 * k1 * x * x)
    if kind == "gelu_erf":
        return 0.5 * (1 + ERF(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    if kind == "silu":
        s = 1 / (1 + np.exp(-x))
        return s * (1 + x * (1 - s))
    if kind == "relu":
        return (x > 0).astype(np.float64)
    return 2 * np.maximum(x, 0)


INNER = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_erf": "gelu_erf", "reglu": "relu"}
KINDS = ["gelu_tanh", "gelu_erf", "silu", "relu", "squared_relu", *INNER]


def call(kind, x, bias=None, out_dtype=None):
    if kind.startswith("gelu"):
        return fk.gelu(x, approximate="tanh" if kind.endswith("tanh") else "none", bias=bias, out_dtype=out_dtype)
    if kind.startswith("geglu"):
        return fk.geglu(x, approximate="tanh" if kind.endswith("tanh") else "none", bias=bias, out_dtype=out_dtype)
    return getattr(fk, kind)(x, bias=bias, out_dtype=out_dtype)


def call_bwd(kind, dy, x, bias=None):
    if kind.startswith("gelu"):
        return fk.gelu_backward(dy, x, approximate="tanh" if kind.endswith("tanh") else "none", bias=bias)
    if kind.startswith("geglu"):
        return fk.geglu_backward(dy, x, approximate="tanh" if kind.endswith("tanh") else "none", bias=bias)
    return getattr(fk, kind + "_backward")(dy, x, bias=bias)


def want64(kind, x64, dy64=None):
    if kind in INNER:
        H = x64.shape[-1] // 2
        a, g = x64[..., :H], x64[..., H:]
        y = f64(INNER[kind], a) * g
        if dy64 is None:
            return y
        return np.concatenate([dy64 * g * df64(INNER[kind], a), dy64 * f64(INNER[kind], a)], axis=-1)
    return f64(kind, x64) if dy64 is None else dy64 * df64(kind, x64)


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in INNER])
def test_float64_derivatives_match_finite_differences(kind):
    x = np.linspace(-6, 6, 1001) + 1e-3  # off the relu kink
    h = 1e-6
    fd = (f64(kind, x + h) - f64(kind, x - h)) / (2 * h)
    np.testing.assert_allclose(df64(kind, x), fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_backward(backend, dtype, shape, kind):
    skip_unsupported(backend, dtype)
    rng = rng_for("act", backend, dtype, shape, kind)
    x = rand(rng, shape, dtype, scale=2.5)
    with_bias = shape[-1] % 3 == 0
    b = rand(rng, (shape[-1],), dtype, scale=0.5) if with_bias else None
    X, B = to_backend(x, backend), to_backend(b, backend)
    y = call(kind, X, B)
    assert framework_of(y) == framework_of(X)
    # the kernels add the bias in fp32: the reference sees the same fp32 sum
    x64 = (x.astype(np.float32) + (b.astype(np.float32) if with_bias else np.float32(0))).astype(np.float64)
    y64 = want64(kind, x64)
    assert tuple(to_numpy(y).shape) == y64.shape
    assert_close(y, y64, dtype, f"{kind} forward")
    dy = rand(rng, y64.shape, dtype)
    dx = call_bwd(kind, to_backend(dy, backend), X, B)
    assert_close(dx, want64(kind, x64, dy.astype(np.float64)), dtype, f"{kind} backward")


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
def test_out_dtype_float32(backend):
    skip_unsupported(backend, "float16")
    rng = rng_for("odt", backend)
    x = rand(rng, (5, 64), "float16", scale=2.0)
    y = fk.swiglu(to_backend(x, backend), out_dtype="float32")
    assert to_numpy(y).dtype == np.float32
    assert_close(y, want64("swiglu", x.astype(np.float64)), "float32", "swiglu fp32 out")


def test_bad_inputs():
    x = np.ones((4, 7), np.float32)
    with pytest.raises(ValueError, match="even"):
        fk.swiglu(x)
    with pytest.raises(ValueError, match="bias"):
        fk.gelu(x, bias=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="approximate"):
        fk.gelu(x, approximate="sigmoid")
    with pytest.raises(ValueError, match="dy"):
        fk.gelu_backward(np.ones((4, 6), np.float32), x)
    with pytest.raises(TypeError, match="float32"):
        fk.relu(np.ones((2, 2), np.int32))


def _fp8_ordinal(b):
    """FP8 bytes -> signed position on the number line (sign-magnitude codes are ordered within a sign)."""
    b = np.asarray(b, np.int16)
    return np.where(b & 0x80, -(b & 0x7F), b)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["gelu_tanh", "silu", "relu", "squared_relu", "swiglu", "reglu"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_output(backend, dtype, kind, fmt):
    """FP8 output equals the reference cast of the fp32 activation: byte-exact for the piecewise
    polynomial kinds; for tanh/exp kinds the library functions may differ from NumPy's by an ulp, so
    at most 0.1 % of the bytes may differ, by one code (or, for tiny activations, by 5e-6)."""
    from fusedkit import fp8
    from fusedkit.reference import activations as ref_act
    from fusedkit.reference import fp8 as ref_fp8
    skip_unsupported(backend, dtype)
    rng = rng_for("fp8out", backend, dtype, kind, fmt)
    x = rand(rng, (67, 256), dtype, scale=3.0)
    scale = np.float32(fp8.as_format(fmt).max / 20.0)
    kw = {"approximate": "tanh"} if kind.startswith("gelu") else {}
    fn = getattr(fk, "gelu" if kind.startswith("gelu") else kind)
    t = fn(to_backend(x, backend), fp8_fmt=fmt, fp8_scale=float(scale), **kw)
    y32 = ref_act.forward(x, kind, None, np.float32)
    data, sinv, amax = ref_fp8.quantize_delayed(y32, scale, fmt)
    got = np.asarray(to_numpy(t.data), np.uint8)
    assert got.shape == data.shape
    assert np.float32(np.asarray(to_numpy(t.scale_inv)).reshape(-1)[0]) == sinv
    got_amax = np.float32(np.asarray(to_numpy(t.amax)).reshape(-1)[0])
    if kind in ("relu", "squared_relu", "reglu"):
        np.testing.assert_array_equal(got, data)
        assert got_amax == amax
    else:
        diff = np.abs(_fp8_ordinal(got) - _fp8_ordinal(data))  # codes apart; -0 and +0 are 0 apart
        # Where 1 + tanh(u) cancels (GeLU at x << 0) an ulp of tanh is a large relative error of a tiny
        # activation: there the dequantized values must agree to 5e-6 in absolute terms instead.
        err = np.abs(ref_fp8.fp8_to_float(got, fmt) - ref_fp8.fp8_to_float(data, fmt)) / scale
        assert ((diff <= 1) | (err <= 5e-6)).all() and (diff > 0).mean() <= 1e-3
        np.testing.assert_allclose(got_amax, amax, rtol=1e-6)


def test_fp8_output_bad_input():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="fp8_fmt and fp8_scale"):
        fk.gelu(x, fp8_fmt="e4m3")


@pytest.mark.parametrize("kind", ["gelu_tanh", "gelu_erf", "silu", "squared_relu", "swiglu", "geglu_tanh"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_jax_custom_vjp_under_jit(kind, with_bias):
    """fusedkit.jax activations: values and gradients (x and bias) under jax.jit, on JAX's default
    device (the CPU in CI: the buffer callbacks run the reference; a GPU runs the kernels)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import fusedkit.jax as fj
    rng = rng_for("jaxact", kind, with_bias)
    x = rand(rng, (6, 32), "float32", scale=2.0)
    b = rand(rng, (32,), "float32", scale=0.5) if with_bias else None
    name = kind.split("_")[0] if kind.startswith(("gelu", "geglu")) else kind
    kw = {"approximate": "tanh" if kind.endswith("tanh") else "none"} if kind.startswith(("gelu", "geglu")) else {}
    fn = getattr(fj, name)
    xj = jnp.asarray(x)
    bj = None if b is None else jnp.asarray(b)
    y = jax.jit(lambda x_, b_: fn(x_, b_, **kw))(xj, bj)
    x64 = (x + (b if with_bias else np.float32(0))).astype(np.float64)
    assert_close(np.asarray(y), want64(kind, x64), "float32", "jax forward")
    dy = rand(rng, y.shape, "float32")

    def loss(x_, b_):
        return (fn(x_, b_, **kw) * jnp.asarray(dy)).sum()
    gx, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(xj, bj) if with_bias else \
        (jax.jit(jax.grad(loss))(xj, None), None)
    dx64 = want64(kind, x64, dy.astype(np.float64))
    assert_close(np.asarray(gx), dx64, "float32", "jax dx")
    if with_bias:
        np.testing.assert_allclose(np.asarray(gb), dx64.sum(0), rtol=1e-4, atol=1e-4)


def test_jax_eager_arrays_through_the_public_api():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    y = fk.swiglu(jnp.asarray(x))
    assert isinstance(y, jax.Array)
    assert_close(np.asarray(y), want64("swiglu", x.astype(np.float64)), "float32", "swiglu jax")


@pytest.mark.parametrize("backend", backend_params(["torch_cpu", "torch"]))
@pytest.mark.parametrize("kind", ["gelu_tanh", "silu", "swiglu", "geglu_erf"])
def test_torch_autograd_matches_torch(backend, kind):
    """fusedkit.torch activations: values and gradients (x and bias) against torch's own ops."""
    torch = pytest.importorskip("torch")
    import fusedkit.torch as ft
    F = torch.nn.functional
    dev = "cuda" if backend == "torch" else "cpu"
    g = torch.Generator().manual_seed(zlib.crc32(kind.encode()))
    x = (torch.randn(5, 3, 48, generator=g) * 2).to(dev).requires_grad_(True)
    b = (torch.randn(48, generator=g) * 0.5).to(dev).requires_grad_(True)
    approx = "tanh" if kind.endswith("tanh") else "none"

    def theirs(x_, b_):
        h = x_ + b_
        if kind.startswith("gelu"):
            return F.gelu(h, approximate=approx)
        if kind == "silu":
            return F.silu(h)
        a, gate = h.chunk(2, dim=-1)
        return (F.silu(a) if kind == "swiglu" else F.gelu(a, approximate=approx)) * gate

    def ours(x_, b_):
        if kind.startswith("gelu"):
            return ft.gelu(x_, b_, approximate=approx)
        if kind == "geglu_erf":
            return ft.geglu(x_, b_, approximate="none")
        return getattr(ft, kind)(x_, b_)
    y1, y2 = ours(x, b), theirs(x, b)
    dy = torch.randn(y2.shape, generator=g).to(dev)
    g1 = torch.autograd.grad(y1, (x, b), dy)
    g2 = torch.autograd.grad(y2, (x, b), dy)
    torch.testing.assert_close(y1, y2, rtol=2e-5, atol=2e-5)
    for a_, b2 in zip(g1, g2):
        torch.testing.assert_close(a_, b2, rtol=2e-4, atol=2e-4)
