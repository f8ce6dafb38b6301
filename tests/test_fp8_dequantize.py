"""fusedkit.dequantize: FP8 bytes back to values for every scaling mode of an FP8Tensor, against the
CPU reference (fusedkit.reference.fp8) bit for bit. Bytes are drawn over all 256 codes (NaN,
subnormals, the largest finite values, both zeros); NaN results compare as NaN (the sign of a NaN is
not part of the contract). The GPU cases are the acceptance test of cuda/fp8_dequantize.cu."""
import zlib

import numpy as np
import pytest

import fusedkit as fk
from fusedkit._dtypes import numpy_dtype
from fusedkit.fp8.tensor import FP8Tensor
from _backends import backend_params, skip_unsupported, to_backend, to_numpy

# fp16 outputs beyond 65504 are inf on both sides (the reference's NumPy cast says so each time)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

# (mode, block) -> the scale grid of data (rows, cols) and its NumPy dtype
MODES = {
    ("tensor", None): (lambda r, c: (1,), np.float32),
    ("mxfp8", 32): (lambda r, c: (r, -(-c // 32)), np.uint8),
    ("mxfp8", (32, 1)): (lambda r, c: (-(-r // 32), c), np.uint8),
    ("block", (1, 128)): (lambda r, c: (r, -(-c // 128)), np.float32),
    ("block", (128, 128)): (lambda r, c: (-(-r // 128), -(-c // 128)), np.float32),
}
MODE_IDS = ["tensor", "mxfp8_rows", "mxfp8_cols", "block_1x128", "block_128x128"]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def fp8_tensor(rng, shape, fmt, mode, block, full_e8m0=False):
    """A host FP8Tensor with bytes over all 256 codes and random scales of the mode's layout."""
    data = rng.integers(0, 256, shape, dtype=np.uint8)
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    sshape, sdt = MODES[(mode, block)]
    if sdt == np.uint8:   # E8M0 exponents: mostly near 127, or every code (0: 2^-127, 255: inf)
        lo, hi = (0, 256) if full_e8m0 else (110, 145)
        s = rng.integers(lo, hi, sshape(rows, cols), dtype=np.uint8)
    else:
        s = (rng.uniform(0.5, 2.0, sshape(rows, cols)) * 2.0 ** rng.integers(-20, 20, sshape(rows, cols)))
        s = s.astype(np.float32)
    if mode == "tensor":
        s = s.reshape(())
    return FP8Tensor(data, s, fmt, mode=mode, block=block)


def same_values(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    ok = ~np.isnan(w)
    np.testing.assert_array_equal(got[ok].view(np.uint8), want[ok].view(np.uint8))


def on_backend(t, backend):
    s = t.scale_inv
    if t.mode == "tensor":
        s = np.asarray(s, np.float32).reshape(1)
    return FP8Tensor(to_backend(np.asarray(t.data), backend), to_backend(np.asarray(s), backend), t.fmt,
                     mode=t.mode, block=t.block)


@pytest.mark.parametrize("backend", backend_params(["numpy", "torch_cpu", "cupy", "torch"]))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode,block", list(MODES), ids=MODE_IDS)
# the kernel's vector widths: 1 byte ((1, 1), (7, 13), (130, 300)), 8 bytes (the others)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (33, 96), (65, 200), (130, 300), (257, 1024)], ids=str)
def test_dequantize_matches_reference(backend, fmt, out, mode, block, shape):
    skip_unsupported(backend, out)
    rng = rng_for("dq", fmt, out, mode, block, shape)
    t = fp8_tensor(rng, shape, fmt, mode, block, full_e8m0=shape == (130, 300))
    want = t.dequantize(numpy_dtype(out))
    got = fk.dequantize(on_backend(t, backend), out)
    assert type(got).__module__.split(".")[0] == ("numpy" if backend == "numpy" else backend.split("_")[0])
    same_values(to_numpy(got), want)


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
@pytest.mark.parametrize("mode,block", list(MODES), ids=MODE_IDS)
@pytest.mark.parametrize("shape", [(4099, 4096), (2051, 8200)], ids=str)
def test_dequantize_large_grid_walks(backend, mode, block, shape):
    """Tensors larger than one pass of the kernel's grid (it walks them grid-stride): the later passes
    and a partial last one."""
    rng = rng_for("dq_large", backend, mode, block, shape)
    t = fp8_tensor(rng, shape, "e4m3", mode, block)
    got = fk.dequantize(on_backend(t, backend), "float16")
    same_values(to_numpy(got), t.dequantize(np.float16))


@pytest.mark.parametrize("backend", backend_params(["cupy", "torch"]))
def test_dequantize_host_scale_and_odd_views(backend):
    """A per-tensor scale_inv given as a host float; a 3-D tensor; a byte view off an 8-byte boundary
    (the kernel's scalar path); an empty tensor."""
    rng = rng_for("dq_odd", backend)
    t = fp8_tensor(rng, (4, 6, 40), "e4m3", "tensor", None)
    dev = on_backend(t, backend)
    got = fk.dequantize(FP8Tensor(dev.data, float(t.scale_inv), "e4m3"), "float32")
    same_values(to_numpy(got), t.dequantize(np.float32))
    flat = to_backend(rng.integers(0, 256, 8 * 40 + 3, dtype=np.uint8), backend)
    view = flat[3:].reshape(8, 40)
    host = FP8Tensor(to_numpy(view), t.scale_inv, "e4m3")
    got = fk.dequantize(FP8Tensor(view, dev.scale_inv, "e4m3"), "float32")
    same_values(to_numpy(got), host.dequantize(np.float32))
    empty = FP8Tensor(to_backend(np.zeros((0, 16), np.uint8), backend), dev.scale_inv, "e4m3")
    assert tuple(fk.dequantize(empty).shape) == (0, 16)


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
def test_dequantize_round_trip(backend):
    """quantize then dequantize (MXFP8 rows) gives the values back to the format's precision."""
    if backend == "torch":
        pytest.importorskip("torch")
    from fusedkit import fp8
    rng = rng_for("dq_rt", backend)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    t = fk.quantize(to_backend(x, backend), recipe=fp8.MXFP8Scaling())
    back = to_numpy(fk.dequantize(t, "float32"))
    assert np.linalg.norm(back - x) / np.linalg.norm(x) < 0.05


@pytest.mark.parametrize("backend", backend_params(["numpy", "cupy", "torch"]))
def test_dequantize_bad_input(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    rng = rng_for("dq_bad", backend)
    t = on_backend(fp8_tensor(rng, (8, 64), "e4m3", "mxfp8", 32), backend)
    with pytest.raises(ValueError, match="dtype must be one of"):
        fk.dequantize(t, "int8")
    with pytest.raises(TypeError, match="FP8Tensor"):
        fk.dequantize(t.data)
    if backend != "numpy":
        with pytest.raises(ValueError, match="scale_inv"):   # scales of the wrong layout
            fk.dequantize(FP8Tensor(t.data, t.scale_inv[:4], "e4m3", mode="mxfp8", block=32))
        with pytest.raises(ValueError, match="no kernel for scaling mode"):
            fk.dequantize(FP8Tensor(t.data, t.scale_inv, "e4m3", mode="block", block=(64, 64)))
