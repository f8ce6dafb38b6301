"""fusedkit.quantize / fusedkit.dequantize on JAX arrays: traced calls (buffer callbacks; the CPU
reference on the CPU, the CUDA kernels on XLA's stream on a GPU) and eager GPU arrays, byte for byte
against the CPU reference; FP8Tensor through jax.jit as a pytree; the GPU callbacks' launch arguments
on fake buffers (no GPU needed); clear errors for what JAX cannot do."""
import sys
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import fusedkit as fk  # noqa: E402
from fusedkit import fp8  # noqa: E402
from fusedkit.fp8.tensor import FP8Tensor  # noqa: E402
from fusedkit.jax import _fp8  # noqa: E402
from fusedkit.reference import fp8 as ref  # noqa: E402
from _backends import to_numpy  # noqa: E402
from test_fp8_dact import check_bytes  # noqa: E402
from test_fp8_dequantize import MODE_IDS, MODES, fp8_tensor, same_values  # noqa: E402
from test_jax_adapter import _FakeBuffer  # noqa: E402

# fp16 inputs and outputs beyond 65504 are inf on both sides (NumPy's cast says so each time)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", marks=pytest.mark.gpu, id="gpu")]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def device(name):
    if name == "cpu":
        return jax.devices("cpu")[0]
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")


def hard_input(rng, shape, dtype):
    """Normal values with the cases a cast must get right: beyond the format's max, tiny, zeros, +-inf
    (NaN left out: it would make the amax, and so current scaling's scale, NaN for every byte)."""
    x = (rng.standard_normal(shape) * 3.0).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size >= 8:
        flat[:6] = [1e5, -7e4, 1e-9, 0.0, -0.0, 3e-6]
        if dtype == "float32":
            flat[6:8] = [np.inf, -np.inf]
    return x.astype(fk_np_dtype(dtype))


def fk_np_dtype(dtype):
    from fusedkit._dtypes import numpy_dtype
    return numpy_dtype(dtype)


def reference(x, fmt, scale, recipe):
    if scale is None:
        data, sinv, amax, _ = ref.quantize_current(x, fmt, recipe.amax_epsilon, recipe.power_of_2_scales)
    else:
        data, sinv, amax = ref.quantize_delayed(x, np.float32(scale), fmt)
    return data, np.float32(sinv), np.float32(amax)


def check(t, x, fmt, scale, recipe, transpose):
    data, sinv, amax = reference(x, fmt, scale, recipe)
    np.testing.assert_array_equal(to_numpy(t.data), data)
    assert to_numpy(t.scale_inv).reshape(()) == sinv
    assert to_numpy(t.amax).reshape(()) == amax
    if transpose:
        np.testing.assert_array_equal(to_numpy(t.data_t), ref.transpose_2d(data))
    else:
        assert t.data_t is None


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["delayed_float", "delayed_array", "current", "current_pow2"])
@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transpose"])
@pytest.mark.parametrize("shape", [(3, 7, 40), (129, 136), (5,)], ids=str)
def test_quantize_traced_and_eager(dev, dtype, fmt, scaling, transpose, shape):
    """Inside jax.jit (every device) and eager (on a GPU: the CPU's eager path is the host reference),
    the bytes, scale_inv, amax and transposed bytes equal the reference's."""
    rng = rng_for("q", dtype, fmt, scaling, transpose, shape)
    x = hard_input(rng, shape, dtype)
    X = jax.device_put(jnp.asarray(x), device(dev))
    scale = np.float32(2.0 ** rng.integers(-6, 6) * rng.uniform(0.5, 1.0)) if scaling.startswith("delayed") else None
    recipe = fp8.CurrentScaling(power_of_2_scales=scaling == "current_pow2", amax_epsilon=1e-12)
    S = jax.device_put(jnp.asarray([scale], jnp.float32), device(dev)) if scaling == "delayed_array" else scale

    def q(X, S):
        return fk.quantize(X, fmt=fmt, scale=S, recipe=None if scale is not None else recipe, transpose=transpose)

    t = jax.jit(q)(X, S)  # an FP8Tensor out of jit: a pytree
    assert isinstance(t, FP8Tensor) and t.fmt.name == fmt and t.mode == "tensor"
    check(t, x, fmt, scale, recipe, transpose)
    if dev == "gpu":
        t = q(X, S)
        assert isinstance(t.data, jax.Array) and t.data.dtype == jnp.uint8
        check(t, x, fmt, scale, recipe, transpose)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode,block", list(MODES), ids=MODE_IDS)
@pytest.mark.parametrize("shape", [(7, 13), (65, 200), (257, 256)], ids=str)
def test_dequantize_traced_and_eager(dev, out, mode, block, shape):
    rng = rng_for("dq", out, mode, block, shape)
    t = fp8_tensor(rng, shape, "e4m3", mode, block)
    want = t.dequantize(fk_np_dtype(out))
    d = device(dev)
    s = np.asarray(t.scale_inv, np.float32).reshape(1) if mode == "tensor" else np.asarray(t.scale_inv)
    J = FP8Tensor(jax.device_put(jnp.asarray(np.asarray(t.data)), d), jax.device_put(jnp.asarray(s), d), "e4m3",
                  mode=mode, block=block)
    got = jax.jit(lambda T: fk.dequantize(T, out))(J)
    same_values(to_numpy(got), want)
    if dev == "gpu":
        same_values(to_numpy(fk.dequantize(J, out)), want)


@pytest.mark.parametrize("dev", DEVICES)
def test_round_trip_inside_one_program(dev):
    """quantize -> dequantize -> arithmetic in one jitted program, with the scale from an amax history
    (delayed scaling as a training step runs it)."""
    rng = rng_for("rt", dev)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    d = device(dev)
    X = jax.device_put(jnp.asarray(x), d)
    history = jax.device_put(jnp.asarray([[4.0]], jnp.float32), d)

    @jax.jit
    def step(X, history):
        scale = (448.0 / history[0, :1]).astype(jnp.float32)
        t = fk.quantize(X, scale=scale)
        return fk.dequantize(t, "float32") * 2.0, t.amax

    y, amax = step(X, history)
    data, sinv, want_amax = ref.quantize_delayed(x, np.float32(448.0 / 4.0), "e4m3")
    np.testing.assert_array_equal(to_numpy(y), ref.dequantize(data, sinv, "e4m3", np.float32) * 2.0)
    assert to_numpy(amax).reshape(()) == want_amax


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("variant", ["affine_stats", "residual_array_scale", "no_weight"])
@pytest.mark.parametrize("shape", [(3, 5, 256), (33, 781)], ids=str)
def test_norm_fp8_output(dev, rms, variant, shape):
    """layer_norm / rms_norm with fp8_fmt / fp8_scale on JAX: bytes, scale_inv, amax of the fp32 y, h and
    the stats equal the reference's, inside jit (every device) and eagerly on a GPU."""
    from fusedkit.reference import norms as ref_norms
    rng = rng_for("norm_fp8", rms, variant, shape)
    N = shape[-1]
    x = (rng.standard_normal(shape) * 0.7 - 1.5).astype(fk_np_dtype("bfloat16"))
    w = None if variant == "no_weight" else rng.uniform(0.5, 1.5, N).astype(np.float32)
    b = None if variant == "no_weight" or rms else rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal(shape).astype(fk_np_dtype("bfloat16")) if variant == "residual_array_scale" else None
    stats = variant != "no_weight"
    scale = np.float32(rng.uniform(20.0, 60.0))
    d = device(dev)
    J = [None if a is None else jax.device_put(jnp.asarray(a), d) for a in (x, w, b, res)]
    S = jax.device_put(jnp.asarray([scale]), d) if variant == "residual_array_scale" else scale
    kw = dict(eps=1e-5, fp8_fmt="e4m3", return_stats=stats)

    def run(X, W, B, R, S):
        if rms:
            return fk.rms_norm(X, W, residual=R, fp8_scale=S, **kw)
        return fk.layer_norm(X, W, B, residual=R, fp8_scale=S, **kw)

    if rms:
        want = ref_norms.rms_norm_fp8(x, w, eps=1e-5, fp8_fmt="e4m3", fp8_scale=scale, return_stats=stats, residual=res)
    else:
        want = ref_norms.layer_norm_fp8(x, w, b, eps=1e-5, fp8_fmt="e4m3", fp8_scale=scale, return_stats=stats,
                                        residual=res)
    want = want if isinstance(want, tuple) else (want,)
    data, amax = want[0].data, np.float32(want[0].amax)
    if dev == "gpu":
        # the kernel's bytes are the cast of the GPU's own fp32 y (test_norms_fp8.py says why not the CPU's)
        plain = (fk.rms_norm(J[0], J[1], residual=J[3], eps=1e-5, out_dtype="float32") if rms else
                 fk.layer_norm(J[0], J[1], J[2], residual=J[3], eps=1e-5, out_dtype="float32"))
        y32 = to_numpy(plain[0] if isinstance(plain, tuple) else plain)
        data, _, amax = ref.quantize_delayed(y32, scale, "e4m3")
    for got in [jax.jit(run)(*J, S)] + ([run(*J, S)] if dev == "gpu" else []):
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want)
        t = got[0]
        assert isinstance(t, FP8Tensor) and t.fmt.name == "e4m3"
        np.testing.assert_array_equal(to_numpy(t.data), data)
        assert to_numpy(t.scale_inv).reshape(()) == np.float32(1.0) / scale
        assert to_numpy(t.amax).reshape(()) == amax
        for g, r in zip(got[1:], want[1:]):
            if dev == "cpu":   # the reference itself: exact
                np.testing.assert_array_equal(to_numpy(g), r)
            else:              # the kernel's h is exact, its stats within fp32 rounding
                np.testing.assert_allclose(to_numpy(g).astype(np.float32), np.asarray(r, np.float32), rtol=1e-5,
                                           atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("op", ["cast_transpose_dbias", "dact_gelu_dbias", "dact_silu", "dact_swiglu_dbias",
                                "dact_reglu"])
@pytest.mark.parametrize("scaling", ["delayed", "current"])
@pytest.mark.parametrize("shape", [(3, 40, 136), (130, 13)], ids=str)
def test_fused_casts(dev, op, scaling, shape):
    """cast_transpose_dbias / dact_cast_transpose on JAX: bytes (row-wise and transposed), scale_inv,
    amax and dbias equal the reference's, traced (every device) and eagerly on a GPU ((130, 13): rows
    the 16-byte loads can't take, g through the fp32 scratch; the gated kinds: x of twice dy's width)."""
    rng = rng_for("ct", op, scaling, shape)
    act = {"dact_gelu_dbias": "gelu", "dact_silu": "silu", "dact_swiglu_dbias": "swiglu",
           "dact_reglu": "reglu"}.get(op)
    x_shape = shape[:-1] + (2 * shape[-1],) if act in ("swiglu", "reglu") else shape
    dy = (rng.standard_normal(shape) * 2.0).astype(fk_np_dtype("bfloat16"))
    x = (rng.standard_normal(x_shape) * 1.5).astype(fk_np_dtype("bfloat16"))
    scale = np.float32(rng.uniform(20.0, 60.0)) if scaling == "delayed" else None
    d = device(dev)
    DY, X = (jax.device_put(jnp.asarray(a), d) for a in (dy, x))
    if act is None:
        want = ref.cast_transpose_dbias(dy, "e5m2", scale)

        def run(DY, X):
            return fk.cast_transpose_dbias(DY, scale=scale)
    else:
        want = ref.dact_cast_transpose(dy, x, act, "e5m2", scale)

        def run(DY, X):
            return fk.dact_cast_transpose(DY, X, activation=act, scale=scale, dbias=op.endswith("dbias"))
    data, data_t, sinv, amax, db = want
    # the GPU's act'(x) takes fast exponentials: g (so bytes, by one code at most, and the current scale's
    # amax, by a few ulps) as test_fp8_dact.check allows; the CPU callback is the reference itself
    exact = dev == "cpu" or act in (None, "reglu")
    for r in [jax.jit(run)(DY, X)] + ([run(DY, X)] if dev == "gpu" else []):
        t, got_db = r if isinstance(r, tuple) else (r, None)
        check_bytes(t.data, data, "e5m2", np.float32(1) / sinv, exact, "data")
        check_bytes(t.data_t, data_t, "e5m2", np.float32(1) / sinv, exact, "data_t")
        if exact or scaling == "delayed":
            assert to_numpy(t.scale_inv).reshape(()) == np.float32(sinv)
        else:
            np.testing.assert_allclose(to_numpy(t.scale_inv).reshape(()), sinv, rtol=4e-6)
        if exact:
            assert to_numpy(t.amax).reshape(()) == np.float32(amax)
        else:
            np.testing.assert_allclose(to_numpy(t.amax).reshape(()), amax, rtol=4e-6)
        if not op.endswith("dbias"):
            assert got_db is None
        else:
            assert str(got_db.dtype) == "bfloat16"
            if dev == "cpu":
                np.testing.assert_array_equal(to_numpy(got_db), db)
            else:  # fixed-order fp32 partial sums: within bf16 rounding of the reference's
                np.testing.assert_allclose(to_numpy(got_db).astype(np.float32), np.asarray(db, np.float32),
                                           rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8_cols", "1x128", "128x128"])
@pytest.mark.parametrize("shape", [(130, 300), (64, 256)], ids=str)
def test_quantize_blocks(dev, recipe, shape):
    """Block-scaled quantize on JAX: bytes and scales equal the reference's (traced; eager on a GPU), and
    dequantize brings the values back within the format's precision."""
    rng = rng_for("blocks", recipe, shape)
    x = (rng.standard_normal(shape) * np.exp(rng.standard_normal((shape[0], 1)))).astype(fk_np_dtype("bfloat16"))
    X = jax.device_put(jnp.asarray(x), device(dev))
    if recipe == "mxfp8":
        want = ref.quantize_mxfp8(x, "e4m3", 32)
        kw = dict(recipe=fp8.MXFP8Scaling())
    elif recipe == "mxfp8_cols":
        want = ref.quantize_mxfp8_columnwise(x, "e4m3", 32)
        kw = dict(recipe=fp8.MXFP8Scaling(), columnwise=True)
    else:
        want = ref.quantize_blockwise(x, (1, 128) if recipe == "1x128" else (128, 128), "e4m3")
        kw = dict(recipe=fp8.BlockScaling(), weight=recipe == "128x128")
    runs = [jax.jit(lambda X: fk.quantize(X, **kw))(X)] + ([fk.quantize(X, **kw)] if dev == "gpu" else [])
    for t in runs:
        np.testing.assert_array_equal(to_numpy(t.data), want[0])
        np.testing.assert_array_equal(to_numpy(t.scale_inv), want[1])
        back = to_numpy(jax.jit(lambda T: fk.dequantize(T, "float32"))(t))
        xf = x.astype(np.float32)
        assert np.linalg.norm(back - xf) / np.linalg.norm(xf) < 0.05


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kind", ["gelu", "relu", "swiglu", "reglu"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_activation_fp8_output(dev, kind, bias):
    """Activations with FP8 output on JAX: traced on the CPU the reference's bytes exactly; on a GPU as
    tests/test_activations.py::test_fp8_output allows (exact for the piecewise-polynomial kinds)."""
    from test_activations import _fp8_ordinal
    from fusedkit.reference import activations as ref_act
    if bias and kind in ("swiglu", "reglu"):
        pytest.skip("the gated kinds take no bias")
    rng = rng_for("act_fp8", kind, bias)
    x = (rng.standard_normal((37, 256)) * 3.0).astype(fk_np_dtype("bfloat16"))
    b = (rng.standard_normal(256) * 0.5).astype(fk_np_dtype("bfloat16")) if bias else None
    scale = np.float32(448.0 / 20.0)
    d = device(dev)
    X = jax.device_put(jnp.asarray(x), d)
    B = None if b is None else jax.device_put(jnp.asarray(b), d)
    ref_kind = "gelu_tanh" if kind == "gelu" else kind
    data, sinv, amax = ref.quantize_delayed(ref_act.forward(x, ref_kind, b, np.float32), scale, "e4m3")
    fn = getattr(fk, kind)
    kw = {} if kind in ("swiglu", "reglu") else {"bias": B}
    runs = [jax.jit(lambda X, S: fn(X, fp8_fmt="e4m3", fp8_scale=S, **kw))(X, scale)]
    if dev == "gpu":
        runs.append(fn(X, fp8_fmt="e4m3", fp8_scale=jnp.asarray([scale]), **kw))
    for t in runs:
        got = to_numpy(t.data)
        assert to_numpy(t.scale_inv).reshape(()) == sinv
        if dev == "cpu" or kind in ("relu", "reglu"):
            np.testing.assert_array_equal(got, data)
            assert to_numpy(t.amax).reshape(()) == amax
        else:
            diff = np.abs(_fp8_ordinal(got) - _fp8_ordinal(data))
            err = np.abs(ref.fp8_to_float(got, "e4m3") - ref.fp8_to_float(data, "e4m3")) / scale
            assert ((diff <= 1) | (err <= 5e-6)).all() and (diff > 0).mean() <= 1e-3
            np.testing.assert_allclose(to_numpy(t.amax).reshape(()), amax, rtol=1e-6)


def jax_operands(t, d):
    s = np.asarray(t.scale_inv, np.float32)
    s = s.reshape(1) if t.mode == "tensor" else s
    return FP8Tensor(jax.device_put(jnp.asarray(np.asarray(t.data)), d), jax.device_put(jnp.asarray(s), d), t.fmt,
                     mode=t.mode, block=t.block)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("scaling", ["split", "fast", "block"])
@pytest.mark.parametrize("case", ["plain_f32", "bias_gelu_bf16", "fp8_out", "accumulate"])
def test_fp8_gemm(dev, scaling, case):
    """fusedkit.fp8_gemm on JAX: traced (every device) and eager on a GPU, against the float64 reference
    of the same FP8 operands (relative error 1e-3, fast accumulation 1e-2; bf16 and FP8 outputs within
    their rounding); the FP8 output's amax and scale_inv; accumulate_into returned as a new array."""
    from test_fp8_gemm import host_operands, rel_err
    from fusedkit.reference import gemm as ref_gemm
    M, N, K = 144, 272, 384
    rng = rng_for("gemm", scaling, case)
    a, b = host_operands(rng, M, N, K, "e4m3", "e4m3" if case != "fp8_out" else "e5m2",
                         "block" if scaling == "block" else "tensor")
    if case == "fp8_out" and scaling == "block":
        a, b = host_operands(rng, M, N, K, "e4m3", "e4m3", "block")
    d = device(dev)
    A, B = jax_operands(a, d), jax_operands(b, d)
    kw = dict(use_split_accumulator=scaling != "fast")
    bias = acc = None
    if case == "bias_gelu_bf16":
        bias = rng.standard_normal(N).astype(fk_np_dtype("bfloat16"))
        kw.update(out_dtype="bfloat16", bias=jax.device_put(jnp.asarray(bias), d), activation="gelu")
    elif case == "fp8_out":
        kw.update(out_dtype="e4m3", out_scale=np.float32(8.0), bias=jax.device_put(jnp.zeros(N, jnp.float32), d),
                  activation="relu")
    elif case == "accumulate":
        acc = rng.standard_normal((M, N)).astype(np.float32)
        kw.update(out_dtype="float32", accumulate_into=jax.device_put(jnp.asarray(acc), d))
    else:
        kw.update(out_dtype="float32")
    want = ref_gemm.fp8_gemm(a, b, out_dtype="float32", bias=None if bias is None else bias.astype(np.float32),
                             activation=kw.get("activation"), accumulate_into=None if acc is None else acc.copy())
    tol = 1e-2 if scaling == "fast" or case == "bias_gelu_bf16" else 1e-3
    runs = [jax.jit(lambda A, B, kw=kw: fk.fp8_gemm(A, B, **kw))(A, B)]
    if dev == "gpu":
        runs.append(fk.fp8_gemm(A, B, **kw))
    for got in runs:
        if case == "fp8_out":
            assert isinstance(got, FP8Tensor) and got.fmt.name == "e4m3"
            assert to_numpy(got.scale_inv).reshape(()) == np.float32(1 / 8.0)
            vals = ref.dequantize(to_numpy(got.data), np.float32(1 / 8.0), "e4m3", np.float64)
            relu = np.maximum(want, 0)
            assert rel_err(vals, np.clip(relu, 0, 448 / 8.0)) < 0.05  # E4M3's 3 mantissa bits
            np.testing.assert_allclose(to_numpy(got.amax).reshape(()), relu.max(), rtol=tol)
        else:
            assert rel_err(to_numpy(got).astype(np.float32), want) < tol
    if acc is not None:
        np.testing.assert_array_equal(to_numpy(kw["accumulate_into"]), acc)  # not updated in place


def test_errors_on_jax():
    """What JAX arrays cannot do says so (traced values stand in for GPU arrays here)."""
    X = jnp.ones((4, 64), jnp.float32)

    def traced(fn):
        return jax.jit(fn)(X)

    with pytest.raises(TypeError, match="immutable"):
        traced(lambda X: fk.quantize(X, scale=1.0, amax_out=jnp.zeros((1,), jnp.float32)).data)
    with pytest.raises(TypeError, match="immutable"):
        traced(lambda X: fk.layer_norm(X, fp8_fmt="e4m3", fp8_scale=1.0, fp8_amax_out=jnp.zeros((1,))).data)
    with pytest.raises(ValueError, match="positive finite"):
        traced(lambda X: fk.rms_norm(X, fp8_fmt="e4m3", fp8_scale=-1.0).data)
    with pytest.raises(ValueError, match="2-D"):
        jax.jit(lambda X: fk.quantize(X, recipe=fp8.BlockScaling()).data)(jnp.ones((2, 4, 128), jnp.float32))
    with pytest.raises(ValueError, match="1-element float32"):
        traced(lambda X: fk.quantize(X, scale=jnp.ones((2,), jnp.float32)).data)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        jax.jit(lambda X: fk.quantize(X.astype(jnp.int32), scale=1.0).data)(X)
    a = FP8Tensor(jnp.zeros((16, 32), jnp.uint8), jnp.ones((1,), jnp.float32), "e5m2")
    with pytest.raises(NotImplementedError, match="format pairs"):
        jax.jit(lambda A: fk.fp8_gemm(A, A))(a)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="must be a JAX array"):
        jax.jit(lambda A: fk.fp8_gemm(A, A, out_dtype="e4m3", out_scale=torch.ones(1)).data)(
            FP8Tensor(a.data, a.scale_inv, "e4m3"))
    t = FP8Tensor(jnp.zeros((4, 64), jnp.uint8), jnp.ones((4, 1), jnp.float32), "e4m3", mode="mxfp8", block=32)
    with pytest.raises(ValueError, match="must hold 4 x 2 uint8"):
        jax.jit(lambda T: fk.dequantize(T))(t)


# ----------------------------------------------------------------------------------------------------
# the GPU callbacks without a GPU: fake buffers, recorded launches

def _fake_gpu(monkeypatch):
    import types
    from contextlib import nullcontext

    from fusedkit.backends import cuda_fp8
    calls = []
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=lambda dev: nullcontext(),
                                      runtime=types.SimpleNamespace(
                                          memsetAsync=lambda *a: calls.append(("memset",) + a)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    for name in ("quantize", "cast_transpose", "dequantize", "cast_transpose_fused", "quantize_blocks",
                 "quantize_blocks_2d", "quantize_mx_columnwise"):
        monkeypatch.setattr(cuda_fp8, name, lambda *a, _n=name, **k: calls.append((_n,) + a + tuple(k.items())))
    return calls


def test_gpu_callbacks_dry_run(monkeypatch):
    """The launch arguments of the GPU callbacks: amax zeroed on XLA's stream before the cast, the
    pointers of the delayed and current-scaling casts as the CuPy path passes them."""
    calls = _fake_gpu(monkeypatch)
    ctx = type("Ctx", (), {"stream": 77})()
    shape = (6, 40)
    x, s = _FakeBuffer(shape, "uint16", 1000), _FakeBuffer((1,), "f4", 2000)
    out = [_FakeBuffer(shape, "u1", 3000), None, _FakeBuffer((1,), "f4", 4000), _FakeBuffer((1,), "f4", 5000), None]
    # delayed, rows only: scale pointer in, amax merged into the zeroed amax output
    _fp8._quantize_callbacks((shape, "bfloat16", "e4m3", False, 0.0, False, False))["gpu"](ctx, out, x, s)
    assert calls == [("memset", 5000, 0, 4, 77),
                     ("quantize", 1000, 3000, 2000, 0, 0, 4000, 5000, 240, "bfloat16", "e4m3", False, 0.0, 0, 0, 77)]
    calls.clear()
    # current scaling with the transposed bytes: the amax pass fills the zeroed amax, the scale goes to scratch
    out = [_FakeBuffer(shape, "u1", 3000), _FakeBuffer((40, 6), "u1", 3500), _FakeBuffer((1,), "f4", 4000),
           _FakeBuffer((1,), "f4", 5000), _FakeBuffer((1,), "f4", 6000)]
    _fp8._quantize_callbacks((shape, "bfloat16", "e5m2", True, 1e-6, True, True))["gpu"](ctx, out, x, None)
    assert calls == [("memset", 5000, 0, 4, 77),
                     ("cast_transpose", 1000, 3000, 3500, 0, 5000, 6000, 4000, 0, 6, 40, "bfloat16", "e5m2", True,
                      1e-6, 1, 0, 77)]
    calls.clear()
    # dequantize, MXFP8 row blocks: rows, cols and the scale grid's row length
    key = (shape, "e4m3", "mxfp8", "mxfp8", 32, 6, 2, "bfloat16")
    _fp8._dequantize_callbacks(key)["gpu"](ctx, _FakeBuffer(shape, "uint16", 7000),
                                                 _FakeBuffer(shape, "u1", 8000), _FakeBuffer((12,), "u1", 9000))
    assert calls == [("dequantize", 8000, 9000, 7000, 6, 40, 2, "e4m3", "bfloat16", "mxfp8", 0, 77)]
    calls.clear()
    # LayerNorm -> FP8 with a residual and the stats: the amax zeroed, then forward_fp8 with every pointer
    from fusedkit.backends import cuda_norms
    monkeypatch.setattr(cuda_norms, "forward_fp8", lambda *a: calls.append(("forward_fp8",) + a))
    key = (shape, "bfloat16", "float32", True, True, True, 1e-5, False, True, False, "e4m3")
    out = [_FakeBuffer(shape, "u1", 11), _FakeBuffer((1,), "f4", 12), _FakeBuffer((1,), "f4", 13),
           _FakeBuffer(shape, "uint16", 14), _FakeBuffer((6,), "f4", 15), _FakeBuffer((6,), "f4", 16)]
    ins = [_FakeBuffer(shape, "uint16", 21), _FakeBuffer(shape, "uint16", 22), _FakeBuffer((40,), "f4", 23),
           _FakeBuffer((40,), "f4", 24), _FakeBuffer((1,), "f4", 25)]
    _fp8._norm_callbacks(key)["gpu"](ctx, out, *ins)
    assert calls == [("memset", 13, 0, 4, 77),
                     ("forward_fp8", 21, 22, 23, 24, 11, 14, 15, 16, 25, 12, 13, 6, 40, "bfloat16", "float32", "e4m3",
                      1e-5, 0, False, 0, 77)]
    calls.clear()
    # block-scaled quantize: x viewed as (M, K) = (6, 40), the kernel of each variant
    for variant, want in (("mxfp8", ("quantize_blocks", 1000, 3000, 4000, 6, 40, "bfloat16", "e4m3", True, 0, 77)),
                          ("1x128", ("quantize_blocks", 1000, 3000, 4000, 6, 40, "bfloat16", "e4m3", False, 0, 77)),
                          ("128x128", ("quantize_blocks_2d", 1000, 3000, 4000, 6, 40, "bfloat16", "e4m3", 0, 77)),
                          ("mxfp8_cols", ("quantize_mx_columnwise", 1000, 3000, 4000, 6, 40, "bfloat16", "e4m3", 0,
                                          77))):
        _fp8._blocks_callbacks((shape, "bfloat16", "e4m3", variant))["gpu"](
            ctx, [_FakeBuffer(shape, "u1", 3000), _FakeBuffer((1,), "u1", 4000)], x)
        assert calls.pop() == want
    assert _fp8._blocks_dims((3, 2, 300), "mxfp8")[2:] == ((3, 2, 10), "uint8")
    assert _fp8._blocks_dims((70, 300), "mxfp8_cols")[2:] == ((3, 300), "uint8")
    assert _fp8._blocks_dims((130, 300), "128x128")[2:] == ((2, 3), "float32")
    # GeLU with bias and FP8 output: amax zeroed, then forward_fp8 (H = N; swiglu halves it)
    from fusedkit.backends import cuda_activations
    monkeypatch.setattr(cuda_activations, "forward_fp8", lambda *a: calls.append(("act_fp8",) + a))
    _fp8._act_callbacks(((4, 64), "bfloat16", "gelu_tanh", "e4m3", True))["gpu"](
        ctx, [_FakeBuffer((4, 64), "u1", 1), _FakeBuffer((1,), "f4", 2), _FakeBuffer((1,), "f4", 3)],
        _FakeBuffer((4, 64), "uint16", 4), _FakeBuffer((64,), "uint16", 5), _FakeBuffer((1,), "f4", 6))
    _fp8._act_callbacks(((4, 64), "bfloat16", "swiglu", "e4m3", False))["gpu"](
        ctx, [_FakeBuffer((4, 32), "u1", 1), _FakeBuffer((1,), "f4", 2), _FakeBuffer((1,), "f4", 3)],
        _FakeBuffer((4, 64), "uint16", 4), None, _FakeBuffer((1,), "f4", 6))
    assert calls == [("memset", 3, 0, 4, 77),
                     ("act_fp8", 4, 5, 1, 6, 2, 3, 4, 64, "bfloat16", "e4m3", "gelu_tanh", 0, 77),
                     ("memset", 3, 0, 4, 77),
                     ("act_fp8", 4, 0, 1, 6, 2, 3, 4, 32, "bfloat16", "e4m3", "swiglu", 0, 77)]
    calls.clear()
    # dact_cast_transpose with dbias, delayed scaling, rows of 13 (g through the fp32 scratch): the amax and
    # ticket buffer zeroed whole, tickets after the amax, the scratch pointers
    M, N = 300, 13
    key = ((M, N), "bfloat16", "e5m2", "gelu", 3, False, 0.0, False, True)
    res = _fp8._ct_fused_results(key)
    gx, gy = 1, 1
    assert [None if r is None else r.shape for r in res] == [(M, N), (N, M), (1,), (1 + gx,), (N,), (gy, N), None,
                                                              (M, N)]
    assert str(res[4].dtype) == "float32"  # the fp32 kernel's dbias, rounded to bf16 afterwards
    out = [_FakeBuffer((M, N), "u1", 300), _FakeBuffer((N, M), "u1", 304), _FakeBuffer((1,), "f4", 308),
           _FakeBuffer((2,), "f4", 312), _FakeBuffer((N,), "f4", 330), _FakeBuffer((1, N), "f4", 320), None,
           _FakeBuffer((M, N), "f4", 400)]
    _fp8._ct_fused_callbacks(key)["gpu"](ctx, out, _FakeBuffer((M, N), "uint16", 500),
                                          _FakeBuffer((M, N), "uint16", 600), _FakeBuffer((1,), "f4", 700))
    assert calls == [("memset", 312, 0, 8, 77),
                     ("cast_transpose_fused", 600, 500, 300, 304, 700, 0, 0, 308, 312, 320, 316, 330, M, N,
                      "bfloat16", "e5m2", 3, False, 0.0, 0, 0, 77, ("g", 400))]
    calls.clear()
    # FP8 GEMM with accumulate_into and an FP8 output... (FP8 output excludes accumulate: two calls)
    from fusedkit.backends import cuda_gemm
    monkeypatch.setattr(cuda_gemm, "supported", lambda dev: True)
    monkeypatch.setattr(cuda_gemm, "plan", lambda *a: calls.append(("plan",) + a) or "PLAN")
    monkeypatch.setattr(cuda_gemm, "launch", lambda *a: calls.append(("launch",) + a))
    cupy_rt = sys.modules["cupy"].cuda.runtime
    cupy_rt.memcpyAsync = lambda *a: calls.append(("memcpy",) + a)
    cupy_rt.memcpyDeviceToDevice = 3
    M, N, K = 32, 48, 64
    key = (M, N, K, "e4m3", "e4m3", "tensor", "float32", "bfloat16", "gelu", 0, True, True)
    out = [_FakeBuffer((M, N), "f4", 100), None]
    ins = [_FakeBuffer((M, K), "u1", 101), _FakeBuffer((N, K), "u1", 102), _FakeBuffer((1,), "f4", 103),
           _FakeBuffer((1,), "f4", 104), _FakeBuffer((N,), "uint16", 105), None, _FakeBuffer((M, N), "f4", 106)]
    _fp8._gemm_plans.clear()
    _fp8._gemm_callbacks(key)["gpu"](ctx, out, *ins)
    _fp8._gemm_callbacks(key)["gpu"](ctx, out, *ins)   # planned once per (problem, device)
    launch = ("launch", "PLAN", 101, 102, 100, 105, 103, 104, 0, 0, 77)
    assert calls == [("plan", M, N, K, "e4m3", "e4m3", "split", "float32", "bfloat16", 0, True, 0),
                     ("memcpy", 100, 106, M * N * 4, 3, 77), launch, ("memcpy", 100, 106, M * N * 4, 3, 77), launch]
    calls.clear()
    key = (M, N, K, "e4m3", "e5m2", "block", "e4m3", None, None, -1, False, True)
    out = [_FakeBuffer((M, N), "u1", 200), _FakeBuffer((1,), "f4", 201)]
    ins = [_FakeBuffer((M, K), "u1", 202), _FakeBuffer((N, K), "u1", 203), _FakeBuffer((M, 1), "f4", 204),
           _FakeBuffer((1, 1), "f4", 205), None, _FakeBuffer((1,), "f4", 206), None]
    _fp8._gemm_callbacks(key)["gpu"](ctx, out, *ins)
    assert calls == [("plan", M, N, K, "e4m3", "e5m2", "block", "e4m3", None, -1, False, 0),
                     ("memset", 201, 0, 4, 77), ("launch", "PLAN", 202, 203, 200, 0, 204, 205, 206, 201, 77)]
    _fp8._gemm_plans.clear()
    # the traced results: current scaling's scratch is dropped, the transposed bytes are (N, M)
    res = _fp8._quantize_results((shape, "bfloat16", "e4m3", True, 0.0, False, True))
    assert [None if r is None else r.shape for r in res] == [shape, (40, 6), (1,), (1,), (1,)]
