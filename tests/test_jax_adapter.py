"""fusedkit.jax: custom_vjp LayerNorm / RMSNorm under jax.jit and jax.grad, against an fp64 NumPy
reference; and the public fusedkit API on JAX arrays (eager host path, traced buffer callbacks).

On the CPU the traced calls run fusedkit's CPU backend inside ``buffer_callback``; the GPU variants
(marked ``gpu``) run the CUDA kernels on XLA's stream. Every case draws fresh inputs from its own seed.
"""
import subprocess
import sys
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import fusedkit as fk  # noqa: E402
import fusedkit.jax as fj  # noqa: E402
from fusedkit.jax import _prims  # noqa: E402
from _backends import REL, assert_close, rand, to_numpy  # noqa: E402
from test_softmax import log_softmax64, softmax64  # noqa: E402

DTYPES = ["float32", "bfloat16"]
NS = [7, 781, 1024]
SHAPES = [(2, 3), (5,)]  # leading dims
LN_VARIANTS = ["affine", "fp32_params", "zero_centered", "no_affine", "bias_only"]
RMS_VARIANTS = ["weight", "fp32_weight", "zero_centered", "no_weight"]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def gpu_device():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", marks=pytest.mark.gpu, id="gpu")]


def put(a, device):
    if a is None:
        return None
    dev = jax.devices("cpu")[0] if device == "cpu" else gpu_device()
    return jax.device_put(jnp.asarray(a), dev)


def assert_rel(got, want, dtype, what, floor=1e-3):
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    err = np.linalg.norm(g - w) / max(np.linalg.norm(w), floor)
    assert err < REL[dtype], f"{what}: relative error {err:.3g} >= {REL[dtype]}"


def ref64(x, w, b, dy, eps, rms, zero_centered=False):
    """fp64 forward and backward: y, dx, dweight, dbias."""
    shape, N = x.shape, x.shape[-1]
    x = x.astype(np.float64).reshape(-1, N)
    dy = dy.astype(np.float64).reshape(-1, N)
    mean = 0.0 if rms else x.mean(-1, keepdims=True)
    d = x - mean
    rstd = 1.0 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    xhat = d * rstd
    g = np.ones(N) if w is None else w.astype(np.float64) + (1.0 if zero_centered else 0.0)
    y = xhat * g + (0.0 if b is None else b.astype(np.float64))
    gd = dy * g
    c2 = 0.0 if rms else gd.mean(-1, keepdims=True)
    dx = rstd * (gd - xhat * (gd * xhat).mean(-1, keepdims=True) - c2)
    return y.reshape(shape), dx.reshape(shape), (dy * xhat).sum(0), dy.sum(0)


def make(key, shape, dtype, variant, rms):
    rng = rng_for(*key)
    N = shape[-1]
    zc = variant == "zero_centered"
    p_dtype = "float32" if variant in ("fp32_params", "fp32_weight", "bias_only") else dtype
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    w = rand(rng, (N,), p_dtype, loc=0.0 if zc else 1.0, scale=0.3)
    b = None if rms else rand(rng, (N,), p_dtype, scale=0.3)
    if variant in ("no_affine", "no_weight", "bias_only"):
        w = None
    if variant == "no_affine":
        b = None
    dy = rand(rng, shape, dtype)
    return x, w, b, dy, zc


def check(device, dtype, shape, variant, rms, key):
    x, w, b, dy, zc = make(key, shape, dtype, variant, rms)
    eps = 1e-6 if rms else 1e-5
    X, W, B, DY = (put(a, device) for a in (x, w, b, dy))
    params = {"x": X, "w": W, "b": B}
    params = {k: v for k, v in params.items() if v is not None}

    def f(p):
        if rms:
            return fj.rms_norm(p["x"], p.get("w"), eps=eps, zero_centered_gamma=zc)
        return fj.layer_norm(p["x"], p.get("w"), p.get("b"), eps=eps, zero_centered_gamma=zc)

    def loss(p, ct):
        return jnp.sum(f(p).astype(jnp.float32) * ct.astype(jnp.float32))

    y = jax.jit(f)(params)
    grads = jax.jit(jax.grad(loss))(params, DY)
    assert isinstance(y, jax.Array) and y.dtype == X.dtype and y.shape == X.shape
    y64, dx64, dw64, db64 = ref64(x, w, b, dy, eps, rms, zc)
    assert_close(y, y64, dtype, "y")
    assert grads["x"].dtype == X.dtype
    assert_close(grads["x"], dx64, dtype, "dx")
    if W is not None:
        assert grads["w"].dtype == W.dtype
        assert_rel(grads["w"], dw64, dtype, "dweight")
    if B is not None:
        assert grads["b"].dtype == B.dtype
        assert_rel(grads["b"], db64, dtype, "dbias")
    # eager (no jit): the same function, through the host path on the CPU
    y_eager = f(params)
    assert_close(y_eager, y64, dtype, "y eager")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("lead", SHAPES, ids=str)
@pytest.mark.parametrize("variant", LN_VARIANTS)
def test_layer_norm_jit_grad(device, dtype, N, lead, variant):
    check(device, dtype, lead + (N,), variant, False, ("ln", device, dtype, N, lead, variant))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("lead", SHAPES, ids=str)
@pytest.mark.parametrize("variant", RMS_VARIANTS)
def test_rms_norm_jit_grad(device, dtype, N, lead, variant):
    check(device, dtype, lead + (N,), variant, True, ("rms", device, dtype, N, lead, variant))


# ------------------------------------------------------------------------------------------------
# the public fusedkit API on JAX arrays (the conventions of fusedkit.norms)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_public_api_eager_and_jit(device, dtype):
    rng = rng_for("api", device, dtype)
    N = 781
    x = rand(rng, (3, 4, N), dtype, loc=-2.3, scale=0.5)
    r = rand(rng, (3, 4, N), dtype)
    w = rand(rng, (N,), "float32", loc=1.0, scale=0.3)
    b = rand(rng, (N,), "float32", scale=0.3)
    dy = rand(rng, (3, 4, N), dtype)
    X, R, W, B, DY = (put(a, device) for a in (x, r, w, b, dy))
    h_want = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    y64, dx64, dw64, db64 = ref64(h_want, w, b, dy, 1e-5, False)

    def fwd(X, W, B, R):
        return fk.layer_norm(X, W, B, residual=R, return_stats=True, out_dtype="float32")

    def bwd(DY, H, W, mean, rstd):
        return fk.layer_norm_backward(DY, H, W, mean, rstd)

    for mode, fw, bw in (("eager", fwd, bwd), ("jit", jax.jit(fwd), jax.jit(bwd))):
        y, h, mean, rstd = fw(X, W, B, R)
        for a in (y, h, mean, rstd):
            assert isinstance(a, jax.Array), mode
        assert y.dtype == jnp.float32 and h.dtype == X.dtype, mode
        assert mean.shape == rstd.shape == (3, 4) and mean.dtype == rstd.dtype == jnp.float32, mode
        np.testing.assert_array_equal(to_numpy(h), h_want, err_msg=mode)
        assert_close(y, y64, "float32" if dtype == "float32" else dtype, f"y ({mode})")
        dx, dw, db = bw(DY, h, W, mean, rstd)
        assert dx.dtype == X.dtype and dw.dtype == db.dtype == jnp.float32, mode
        assert_close(dx, dx64, dtype, f"dx ({mode})")
        assert_rel(dw, dw64, dtype, f"dweight ({mode})")
        assert_rel(db, db64, dtype, f"dbias ({mode})")

    # a lone y is returned unpacked, and stats-only RMS conventions
    for fn in (lambda X: fk.rms_norm(X), jax.jit(lambda X: fk.rms_norm(X))):
        assert isinstance(fn(X), jax.Array)
    y, rstd = jax.jit(lambda X: fk.rms_norm(X, return_stats=True))(X)
    dx, dw = jax.jit(lambda DY, X, rstd: fk.rms_norm_backward(DY, X, None, rstd))(DY, X, rstd)
    assert dw is None
    assert_close(dx, ref64(x, None, None, dy, 1e-6, True)[1], dtype, "rms dx without weight")


def test_eager_cpu_returns_jax_array():
    x = jnp.asarray(rand(rng_for("eager"), (4, 64), "float32"))
    y = fk.layer_norm(x)
    assert isinstance(y, jax.Array)
    y, mean, rstd = fk.layer_norm(x, return_stats=True)
    assert all(isinstance(a, jax.Array) for a in (y, mean, rstd))
    assert_close(y, ref64(np.asarray(x), None, None, np.zeros((4, 64)), 1e-5, False)[0], "float32", "y")


def test_vmap_and_zero_rows():
    rng = rng_for("vmap")
    x = rand(rng, (3, 5, 64), "float32")
    w = rand(rng, (3, 64), "float32", loc=1.0, scale=0.3)   # one weight per example
    ys = jax.jit(jax.vmap(fj.rms_norm))(jnp.asarray(x), jnp.asarray(w))
    for i in range(3):
        assert_close(ys[i], ref64(x[i], w[i], None, x[i], 1e-6, True)[0], "float32", f"vmap row {i}")
    g = jax.jit(jax.vmap(jax.grad(lambda x, w: fj.layer_norm(x, w).sum(), argnums=1)))(
        jnp.asarray(x), jnp.asarray(w))
    for i in range(3):
        assert_rel(g[i], ref64(x[i], w[i], None, np.ones_like(x[i]), 1e-5, False)[2], "float32",
                   f"vmap dweight {i}")
    z = jnp.zeros((0, 32), jnp.float32)
    wz = jnp.ones((32,), jnp.float32)
    y = jax.jit(fj.layer_norm)(z, wz)
    assert y.shape == (0, 32)
    gw = jax.jit(jax.grad(lambda w: fj.layer_norm(z, w).sum()))(wz)
    np.testing.assert_array_equal(np.asarray(gw), np.zeros(32, np.float32))


def test_closed_over_constants_under_jit():
    """Traced x with concrete weight / bias closed over (and the reverse) inside jit."""
    rng = rng_for("const")
    x = rand(rng, (6, 781), "bfloat16", loc=-2.3, scale=0.5)
    w = rand(rng, (781,), "float32", loc=1.0, scale=0.3)
    b = rand(rng, (781,), "float32", scale=0.3)
    dy = rand(rng, (6, 781), "bfloat16")
    X, W, B, DY = (jnp.asarray(a) for a in (x, w, b, dy))
    y64, dx64, dw64, db64 = ref64(x, w, b, dy, 1e-5, False)
    assert_close(jax.jit(lambda X: fj.layer_norm(X, W, B))(X), y64, "bfloat16", "y, constant params")
    gx = jax.jit(jax.grad(lambda X: jnp.sum(fj.layer_norm(X, W, B).astype(jnp.float32) * DY)))(X)
    assert_close(gx, dx64, "bfloat16", "dx, constant params")
    gw, gb = jax.jit(jax.grad(lambda W, B: jnp.sum(fj.layer_norm(X, W, B).astype(jnp.float32) * DY),
                              argnums=(0, 1)))(W, B)
    assert_rel(gw, dw64, "bfloat16", "dweight, constant x")
    assert_rel(gb, db64, "bfloat16", "dbias, constant x")
    y64, dx64, dw64, _ = ref64(x, w, None, dy, 1e-6, True)
    gx = jax.jit(jax.grad(lambda X: jnp.sum(fj.rms_norm(X, W).astype(jnp.float32) * DY)))(X)
    assert_close(gx, dx64, "bfloat16", "rms dx, constant weight")


def test_staged_for_gpu_and_cpu(monkeypatch):
    """With a GPU backend present, traced calls stage both branches (lax.platform_dependent) and
    XLA keeps the one of the platform it lowers for: fake a GPU here and check the CPU result."""
    if jax.default_backend() != "cpu":
        pytest.skip("fakes a GPU backend: meaningful only where JAX runs on the CPU")
    class FakeGpu:
        platform, device_kind, id, local_hardware_id = "gpu", "fake", 0, 0

    monkeypatch.setattr(_prims, "_jax_gpus", lambda: (FakeGpu(),))
    monkeypatch.setattr(_prims, "_partial_rows", lambda key, ordinals: 3)
    rng = rng_for("staged")
    x = rand(rng, (4, 96), "float32", loc=-2.3, scale=0.5)
    w = rand(rng, (96,), "float32", loc=1.0, scale=0.3)
    b = rand(rng, (96,), "float32")
    dy = rand(rng, (4, 96), "float32")
    X, W, B, DY = (jnp.asarray(a) for a in (x, w, b, dy))
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda X, W, B: jnp.sum(fj.layer_norm(X, W, B) * DY),
                                        argnums=(0, 1, 2)))(X, W, B))
    assert "platform_index" in jaxpr and "float32[576]" in jaxpr  # GPU scratch: 2 (dw, db) x P x N = 2 x 3 x 96
    gx, gw, gb = jax.jit(jax.grad(lambda X, W, B: jnp.sum(fj.layer_norm(X, W, B) * DY),
                                  argnums=(0, 1, 2)))(X, W, B)
    y64, dx64, dw64, db64 = ref64(x, w, b, dy, 1e-5, False)
    assert_close(gx, dx64, "float32", "dx")
    assert_rel(gw, dw64, "float32", "dweight")
    assert_rel(gb, db64, "float32", "dbias")
    assert_close(jax.jit(fj.rms_norm)(X, W), ref64(x, w, None, dy, 1e-6, True)[0], "float32", "rms y")


def test_committed_arrays_pick_the_device():
    """An uncommitted scalar (jnp.asarray: the default device) follows committed logits, as JAX runs it;
    the H200 run caught a GPU kernel picked for CPU logits because the scalar came first."""
    class Dev:
        def __init__(self, platform):
            self.platform = platform

    class Arr:
        def __init__(self, dev, committed):
            self.dev, self.committed = dev, committed

        def devices(self):
            return {self.dev}

    gpu, cpu, cpu2 = Dev("gpu"), Dev("cpu"), Dev("cpu")
    pick = _prims._concrete_device
    assert pick((Arr(gpu, False), Arr(cpu, True), None)) is cpu
    assert pick((None, Arr(gpu, False), Arr(gpu, False))) is gpu
    assert pick((Arr(cpu, True), Arr(cpu2, True))) is None       # two committed devices: left to JAX
    assert pick((Arr(gpu, False), jax.core.ShapedArray((), jnp.float32))) is None  # no devices(): staged


@pytest.mark.gpu
def test_gpu_jit_inside_larger_program():
    """On a GPU: the kernels run on XLA's stream between XLA ops inside one jit program."""
    dev = gpu_device()
    rng = rng_for("gpu_program")
    N = 1024
    x = rand(rng, (64, 8, N), "bfloat16", loc=-2.3, scale=0.5)
    w = rand(rng, (N,), "float32", loc=1.0, scale=0.3)
    X, W = jax.device_put(jnp.asarray(x), dev), jax.device_put(jnp.asarray(w), dev)

    @jax.jit
    def step(X, W):
        z = X * 2                                   # XLA op before
        y = fj.rms_norm(z, W)
        return (y.astype(jnp.float32) * 3).sum(), jax.grad(lambda W: fj.rms_norm(z, W).astype(
            jnp.float32).sum())(W)

    s, gw = step(X, W)
    z = (x.astype(np.float32) * 2).astype(x.dtype)
    y64, _, dw64, _ = ref64(z, w, None, np.ones(z.shape), 1e-6, True)
    np.testing.assert_allclose(float(s), 3 * y64.sum(), rtol=2e-2, atol=1.0)
    assert_rel(gw, dw64, "bfloat16", "dweight on GPU")


# ------------------------------------------------------------------------------------------------
# softmax / log-softmax (fusedkit.jax.softmax, and fusedkit.softmax on JAX arrays)

SOFTMAX_VARIANTS = ["plain", "scale", "mask", "causal_rect", "mask_causal", "log"]


def softmax_ref64(x, scale, hide, log):
    """fp64 softmax (or log-softmax) of x * scale with `hide` (broadcast bool, True = masked out)."""
    return log_softmax64(x, scale) if log else softmax64(x, scale, hide)


def softmax_case(variant, shape, rng):
    scale = 1.0 if variant in ("plain", "log") else 0.37
    mask = causal = None
    if variant in ("mask", "mask_causal"):
        mask = rng.random((shape[0], 1) + shape[2:]) < 0.2
    if variant in ("causal_rect", "mask_causal"):
        causal = True
    hide = None if mask is None else np.broadcast_to(mask, shape)
    if causal:
        sq, sk = shape[-2], shape[-1]
        tri = np.triu(np.ones((sq, sk), bool), 1 + sk - sq)
        hide = tri if hide is None else hide | tri
    return scale, mask, bool(causal), hide


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [7, 1024, 4099])
@pytest.mark.parametrize("variant", SOFTMAX_VARIANTS)
def test_softmax_jit_grad(device, dtype, N, variant):
    rng = rng_for("softmax", device, dtype, N, variant)
    shape = (2, 3, 5, N)  # (batch, heads, Sq, Sk)
    x = rand(rng, shape, dtype, scale=2.0)
    dy = rand(rng, shape, dtype)
    scale, mask, causal, hide = softmax_case(variant, shape, rng)
    log = variant == "log"
    X, DY, MK = put(x, device), put(dy, device), put(mask, device)

    def f(X):
        if log:
            return fj.log_softmax(X, scale=scale)
        return fj.softmax(X, scale=scale, mask=MK, causal=causal)

    y = jax.jit(f)(X)
    assert isinstance(y, jax.Array) and y.dtype == X.dtype and y.shape == X.shape
    y64 = softmax_ref64(x, scale, hide, log)
    assert_close(y, y64, dtype, "y")
    gx = jax.jit(jax.grad(lambda X: jnp.sum(f(X).astype(jnp.float32) * DY.astype(jnp.float32))))(X)
    assert gx.dtype == X.dtype
    d = dy.astype(np.float64)
    yv = np.asarray(to_numpy(y)).astype(np.float64)  # the backward works from the y the forward returned
    if log:
        dx64 = scale * (d - np.exp(yv) * d.sum(-1, keepdims=True))
    else:
        dx64 = scale * yv * (d - (d * yv).sum(-1, keepdims=True))
    assert_close(gx, dx64, dtype, "dx")
    # the public API on the same arrays, eager and under jit
    for mode, fn in (("eager", lambda X: fk.softmax(X, scale=scale, mask=MK, causal=causal)),
                     ("jit", jax.jit(lambda X: fk.softmax(X, scale=scale, mask=MK, causal=causal)))):
        if not log:
            ys = fn(X)
            assert isinstance(ys, jax.Array), mode
            assert_close(ys, y64, dtype, f"fusedkit.softmax ({mode})")


def test_softmax_closed_over_mask_and_vmap():
    """A concrete CPU mask closed over by a jitted softmax of traced x; vmap over a batch of rows."""
    rng = rng_for("softmax_const")
    x = rand(rng, (4, 6, 33), "float32")
    mask = rng.random((1, 6, 33)) < 0.3
    MK = jnp.asarray(mask)
    y = jax.jit(lambda X: fj.softmax(X, mask=MK))(jnp.asarray(x))
    assert_close(y, softmax_ref64(x, 1.0, np.broadcast_to(mask, x.shape), False), "float32", "closed-over mask")
    ys = jax.jit(jax.vmap(fj.log_softmax))(jnp.asarray(x))
    assert_close(ys, softmax_ref64(x, 1.0, None, True), "float32", "vmap log_softmax")
    z = jax.jit(fj.softmax)(jnp.zeros((0, 5), jnp.float32))
    assert z.shape == (0, 5)
    with pytest.raises(ValueError, match="last axis only"):
        fj.softmax(jnp.asarray(x), axis=0)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [65536, 262144])
def test_softmax_gpu_long_rows(N):
    """The long-row kernels (clusters, the staged forward) on XLA's buffers and stream."""
    dev = gpu_device()
    rng = rng_for("softmax_long", N)
    x = rand(rng, (3, N), "bfloat16", scale=2.0)
    dy = rand(rng, (3, N), "bfloat16")
    X, DY = jax.device_put(jnp.asarray(x), dev), jax.device_put(jnp.asarray(dy), dev)
    y = jax.jit(fj.softmax)(X)
    assert_close(y, softmax_ref64(x, 1.0, None, False), "bfloat16", "y")
    gx = jax.jit(jax.grad(lambda X: jnp.sum(fj.softmax(X).astype(jnp.float32) * DY.astype(jnp.float32))))(X)
    yv, d = np.asarray(to_numpy(y)).astype(np.float64), dy.astype(np.float64)
    assert_close(gx, yv * (d - (d * yv).sum(-1, keepdims=True)), "bfloat16", "dx")


# ------------------------------------------------------------------------------------------------
# cross-entropy (fusedkit.jax.cross_entropy, and fusedkit.cross_entropy on JAX arrays)

IGNORE = -100


def ce_ref64(x, t, reduction, eps, z):
    """fp64 loss and gradient (of the reduced loss; of the sum for "none") of fusedkit.cross_entropy."""
    N = x.shape[-1]
    x = x.astype(np.float64).reshape(-1, N)
    t = t.reshape(-1)
    valid = t != IGNORE
    tc = np.clip(t, 0, N - 1)
    m = x.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    loss = (1 - eps) * (lse - x[np.arange(len(t)), tc]) + eps * (lse - x.mean(-1)) + z * lse**2
    loss = np.where(valid, loss, 0.0)
    p = np.exp(x - lse[:, None])
    q = eps / N + (1 - eps) * (np.arange(N)[None, :] == tc[:, None])
    g = np.where(valid[:, None], p - q + 2 * z * lse[:, None] * p, 0.0)
    if reduction == "mean":
        return loss.sum() / valid.sum(), g / valid.sum()
    if reduction == "sum":
        return loss.sum(), g
    return loss, g


def ce_case(key, shape, dtype):
    rng = rng_for(*key)
    x = rand(rng, shape, dtype, scale=2.0)
    t = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    t.reshape(-1)[::5] = IGNORE
    return x, t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [7, 1024, 32768])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", [(0.0, 0.0), (0.1, 1e-3)], ids=["plain", "smooth_z"])
def test_cross_entropy_jit_grad(device, dtype, N, reduction, opts):
    eps, z = opts
    x, t = ce_case(("ce", device, dtype, N, reduction, opts), (3, 4, N), dtype)
    X, T = put(x, device), put(t, device)
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 12  # upstream gradient of "none"

    def f(X):
        return fj.cross_entropy(X, T, label_smoothing=eps, reduction=reduction, z_loss=z)

    def obj(X):
        loss = f(X)
        return jnp.sum(loss * jnp.asarray(w)) if reduction == "none" else loss

    loss = jax.jit(f)(X)
    gx = jax.jit(jax.grad(obj))(X)
    l64, g64 = ce_ref64(x, t, reduction, eps, z)
    if reduction == "none":
        g64 = g64 * w.reshape(-1, 1)
    assert isinstance(loss, jax.Array) and loss.dtype == jnp.float32
    assert loss.shape == (() if reduction != "none" else (3, 4))
    np.testing.assert_allclose(np.asarray(loss, np.float64), np.asarray(l64).reshape(np.shape(loss)),
                               rtol=2e-5, atol=2e-5, err_msg="loss")
    assert gx.dtype == X.dtype and gx.shape == X.shape
    assert_close(gx, g64.reshape(x.shape), dtype, "dlogits")


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_public_api(device):
    """fusedkit.cross_entropy / cross_entropy_backward on JAX arrays, eager and under jit; the errors."""
    x, t = ce_case(("ce_api", device), (5, 777), "float32")
    X, T = put(x, device), put(t, device)
    l64, g64 = ce_ref64(x, t, "mean", 0.0, 0.0)
    for mode, fn in (("eager", lambda X, T: fk.cross_entropy(X, T, return_lse=True, return_grad=True)),
                     ("jit", jax.jit(lambda X, T: fk.cross_entropy(X, T, return_lse=True, return_grad=True)))):
        loss, lse, grad = fn(X, T)
        assert all(isinstance(a, jax.Array) for a in (loss, lse, grad)), mode
        np.testing.assert_allclose(float(loss), l64, rtol=2e-5, err_msg=mode)
        assert_close(grad, g64, "float32", f"grad ({mode})")
        for gl in (3.0, jnp.asarray(3.0, jnp.float32)):
            gb = jax.jit(lambda G, X, T, S: fk.cross_entropy_backward(G, X, T, S))(gl, X, T, lse) \
                if mode == "jit" and not isinstance(gl, float) else fk.cross_entropy_backward(gl, X, T, lse)
            assert_close(gb, 3.0 * g64, "float32", f"cross_entropy_backward ({mode}, {type(gl).__name__})")
    with pytest.raises(TypeError, match="immutable"):
        fk.cross_entropy(X, T, return_grad=True, inplace_grad=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 131072), (2, 262144), (70001, 8)], ids=str)
def test_cross_entropy_gpu_long_rows_and_many_tokens(shape):
    """The staged long-vocab kernels, and more tokens than one reduction block (the callbacks' scratch
    holds the block partials) on XLA's buffers and stream."""
    dev = gpu_device()
    x, t = ce_case(("ce_gpu", shape), shape, "bfloat16")
    X, T = jax.device_put(jnp.asarray(x), dev), jax.device_put(jnp.asarray(t), dev)
    loss, gx = jax.jit(jax.value_and_grad(lambda X: fj.cross_entropy(X, T)))(X)
    l64, g64 = ce_ref64(x, t, "mean", 0.0, 0.0)
    np.testing.assert_allclose(float(loss), l64, rtol=1e-4)
    assert_close(gx, g64.reshape(shape), "bfloat16", "dlogits")


def test_softmax_and_cross_entropy_staged_for_gpu_and_cpu(monkeypatch):
    """With a (faked) GPU backend, traced softmax and cross-entropy stage both branches (their GPU
    callbacks carry scratch outputs) and the CPU one runs here."""
    if jax.default_backend() != "cpu":
        pytest.skip("fakes a GPU backend: meaningful only where JAX runs on the CPU")

    class FakeGpu:
        platform, device_kind, id, local_hardware_id = "gpu", "fake", 0, 0

    monkeypatch.setattr(_prims, "_jax_gpus", lambda: (FakeGpu(),))
    x, t = ce_case(("ce_staged",), (70001, 3), "float32")  # two reduction blocks: 4 partials of scratch
    X, T = jnp.asarray(x), jnp.asarray(t)
    grad_fn = jax.grad(lambda X: fj.cross_entropy(X, T))
    jaxpr = str(jax.make_jaxpr(grad_fn)(X))
    assert "platform_index" in jaxpr and "float32[70005]" in jaxpr  # tokens + 2 x 2 partials
    l64, g64 = ce_ref64(x, t, "mean", 0.0, 0.0)
    assert_close(jax.jit(grad_fn)(X), g64, "float32", "dlogits")
    y = jax.jit(lambda X: fj.softmax(X, scale=0.5))(X)
    assert "platform_index" in str(jax.make_jaxpr(lambda X: fj.softmax(X))(X))
    assert_close(y, softmax_ref64(x, 0.5, None, False), "float32", "softmax")


class _FakeBuffer:
    """What a GPU buffer_callback hands its callback: shape, dtype, a device pointer, a device."""

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": self.shape}

    def __dlpack_device__(self):
        return (2, 0)


def _fake_gpu(monkeypatch):
    """CuPy's Device context and the kernel launches of cuda_softmax / cuda_cross_entropy replaced by
    recorders (the launch arguments: pointers, sizes, options; then ("dependent", True) for a
    programmatic dependent launch), so the GPU callbacks run without a GPU."""
    import types
    from contextlib import nullcontext

    from fusedkit.backends import cuda_cross_entropy as ce
    from fusedkit.backends import cuda_softmax as cs
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=lambda dev: nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    calls = []

    def dep(k):
        return (("dependent", True),) if k.get("dependent") else ()
    for mod, label in ((cs, "softmax"), (ce, "ce")):
        for name in ("forward", "backward"):
            monkeypatch.setattr(mod, name, lambda *a, _n=f"{label}.{name}", **k: calls.append((_n,) + a + dep(k)))
    monkeypatch.setattr(ce, "launcher", lambda file, expr, codes, device: (
        lambda grid, block, smem, sp, *a, **k: calls.append(("reduce", expr, grid) + a + dep(k))))
    monkeypatch.setattr(ce, "stream_ptr", lambda stream: stream)
    return calls


def test_gpu_callbacks_dry_run(monkeypatch):
    """The GPU branches of the softmax and cross-entropy callbacks on fake buffers: the pointers and
    sizes each launch gets (the buffers' and the scratch's), without a GPU."""
    calls = _fake_gpu(monkeypatch)
    ctx = type("Ctx", (), {"stream": 77})()
    # softmax forward with a broadcast mask and causal: the launch arguments of fusedkit.softmax
    shape, mshape = (2, 3, 5, 9), (2, 1, 5, 9)
    key = (shape, "bfloat16", "float32", mshape, 0.5, True, False)
    x, m, y = _FakeBuffer(shape, "uint16", 1000), _FakeBuffer(mshape, "bool", 2000), _FakeBuffer(shape, "f4", 3000)
    _prims._softmax_fwd_callbacks(key)["gpu"](ctx, y, x, m)
    from fusedkit.softmax import mask_launch_args
    mptr, masking, args = mask_launch_args(shape, mshape, True, 2000)
    assert calls.pop() == ("softmax.forward", 1000, mptr, 3000, 30, 9, "bfloat16", "float32", 0.5, False, masking,
                           args, 0, 77)
    _prims._softmax_bwd_callbacks((shape, "float32", 2.0, True))["gpu"](ctx, y, x, y)
    assert calls.pop() == ("softmax.backward", 1000, 3000, 3000, 30, 9, "float32", 2.0, True, 0, 77)
    # cross-entropy forward, mean with lse and grad, 70001 tokens: two reduction blocks
    M, N = 70001, 3
    key = ((M, N), "float32", "int32", -100, 0.1, "mean", 1e-3, True, True)
    results, cbs = _prims._ce_fwd_callbacks(key, True)
    f32, i32 = results[3].shape[0], results[4].shape[0]
    assert (f32, i32) == (M + 4, 5)
    bufs = [_FakeBuffer((1,), "f4", 10_000), _FakeBuffer((M,), "f4", 20_000), _FakeBuffer((M, N), "f4", 30_000),
            _FakeBuffer((f32,), "f4", 40_000), _FakeBuffer((i32,), "i4", 50_000)]
    cbs["gpu"](ctx, bufs, _FakeBuffer((M, N), "f4", 60_000), _FakeBuffer((M,), "i4", 70_000))
    names = [c[0] if c[0] != "reduce" else c[1].split("<")[0] for c in calls]
    assert names == ["fk::ce_reduce", "fk::ce_reduce_final", "ce.forward", "fk::ce_reduce", "fk::ce_reduce_final"]
    # count (int32 scratch[0]) first: partials of P = 2 blocks after the count, then the forward reads it
    cnt = calls[0]
    assert cnt[2] == 2 and cnt[3:5] == (0, 70_000) and cnt[8:10] == (40_000 + 4 * M, 50_000 + 4)
    fwd = calls[2]
    assert fwd[1:8] == (60_000, 70_000, True, 30_000, 40_000, 20_000, 50_000)  # x, t, t32, grad, tok, lse, count
    assert fwd[8:10] == (M, N)
    red = calls[3]
    assert red[3:5] == (40_000, 70_000) and red[8:10] == (40_000 + 4 * (M + 2), 50_000 + 4 * 3)
    final = calls[4]
    assert final[3:5] == (40_000 + 4 * (M + 2), 50_000 + 4 * 3) and final[6:8] == (10_000, 0)
    # the fused kernel and the sum's first launch are the programmatic dependents of the launch before
    assert [("dependent", True) in c for c in calls] == [False, False, True, True, False]
    calls.clear()
    # cross-entropy backward, per-token grad_loss of "none"
    key = ((M, N), "bfloat16", "int64", -100, 0.0, "none", 0.0, None, True, (M,))
    results, cbs = _prims._ce_bwd_callbacks(key, True)
    cbs["gpu"](ctx, [_FakeBuffer((M, N), "uint16", 1), _FakeBuffer(results[1].shape, "f4", 2),
                     _FakeBuffer(results[2].shape, "i4", 3)],
               _FakeBuffer((M,), "f4", 4), _FakeBuffer((M, N), "uint16", 5), _FakeBuffer((M,), "i8", 6),
               _FakeBuffer((M,), "f4", 7))
    assert calls == [("ce.backward", 4, True, 5, 6, False, 7, 1, 0, M, N, "bfloat16", -100, 0.0, 0.0, 1.0, 0, 77)]


def test_import_fusedkit_does_not_import_jax():
    code = "import sys, fusedkit; sys.exit(1 if 'jax' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
