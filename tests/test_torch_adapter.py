"""fusedkit.torch: autograd functions and modules against fp64 torch references.

LayerNorm is checked against ``torch.nn.functional.layer_norm`` in float64, RMSNorm against an fp64
RMSNorm written here; both through ``torch.autograd`` (x, weight, bias, residual). fusedkit has no
float64, so instead of ``gradcheck`` the float32 / bfloat16 results are held to the tolerances of
tests/_backends.py against the fp64 autograd of the same (storage-rounded) inputs. Every case draws
fresh inputs from its own seed.
"""
import subprocess
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import fusedkit.torch as ft  # noqa: E402
from _backends import REL, assert_close, rand, to_numpy  # noqa: E402

DTYPES = ["float32", "bfloat16"]
NS = [1, 7, 781, 1024]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]
LN_VARIANTS = ["affine", "fp32_params", "zero_centered", "no_affine", "bias_only"]
RMS_VARIANTS = ["weight", "fp32_weight", "zero_centered", "no_weight", "residual", "residual_no_weight"]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def need_device(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")


def tt(a, device, requires_grad=False):
    """NumPy (float32 / ml_dtypes bfloat16) -> torch tensor on device, same values."""
    if a is None:
        return None
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device).requires_grad_(requires_grad)


def t64(a, requires_grad=False):
    if a is None:
        return None
    return torch.from_numpy(a.astype(np.float64)).requires_grad_(requires_grad)


def rms64(x, w, eps):
    """fp64 RMSNorm (w is the effective gamma, or None)."""
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def assert_rel(got, want, dtype, what, floor=1e-3):
    """Relative-norm check of a reduction (dweight, dbias); ``floor`` keeps a gradient that is zero
    in exact arithmetic (N = 1: dweight of LayerNorm) from being judged against fp64 round-off."""
    g = to_numpy(got).astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    err = np.linalg.norm(g - w) / max(np.linalg.norm(w), floor)
    assert err < REL[dtype], f"{what}: relative error {err:.3g} >= {REL[dtype]}"


# ------------------------------------------------------------------------------------------------
# LayerNorm vs F.layer_norm (fp64)

def check_layer_norm(device, dtype, shape, variant, key):
    rng = rng_for(*key)
    N = shape[-1]
    p_dtype = "float32" if variant in ("fp32_params", "bias_only") else dtype
    zc = variant == "zero_centered"
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    w = rand(rng, (N,), p_dtype, loc=0.0 if zc else 1.0, scale=0.3)
    b = rand(rng, (N,), p_dtype, scale=0.3)
    if variant == "no_affine":
        w = b = None
    if variant == "bias_only":
        w = None
    dy = rand(rng, shape, dtype)
    eps = 1e-5

    X, W, B = tt(x, device, True), tt(w, device, True), tt(b, device, True)
    y = ft.layer_norm(X, W, B, eps=eps, zero_centered_gamma=zc)
    assert y.dtype == X.dtype and y.shape == X.shape and y.device == X.device
    y.backward(tt(dy, device))

    X64, W64, B64 = t64(x, True), t64(w, True), t64(b, True)
    g64 = None if W64 is None else (W64 + 1.0 if zc else W64)
    y64 = F.layer_norm(X64, (N,), g64, B64, eps)
    y64.backward(t64(dy))

    assert_close(y, y64.detach().numpy(), dtype, "y")
    assert X.grad.dtype == X.dtype
    assert_close(X.grad, X64.grad.numpy(), dtype, "dx")
    for name, P, P64 in (("dweight", W, W64), ("dbias", B, B64)):
        if P is None:
            continue
        assert P.grad is not None and P.grad.dtype == P.dtype, name
        assert_rel(P.grad, P64.grad.numpy(), dtype, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("variant", LN_VARIANTS)
def test_layer_norm_matches_torch(device, dtype, N, variant):
    need_device(device)
    check_layer_norm(device, dtype, (2, 3, N), variant, ("ln", device, dtype, N, variant))


# ------------------------------------------------------------------------------------------------
# RMSNorm vs an fp64 RMSNorm

def check_rms_norm(device, dtype, shape, variant, key):
    rng = rng_for(*key)
    N = shape[-1]
    zc = variant == "zero_centered"
    has_res = variant.startswith("residual")
    p_dtype = "float32" if variant in ("fp32_weight", "residual") else dtype
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    w = None if variant.endswith("no_weight") else rand(rng, (N,), p_dtype, loc=0.0 if zc else 1.0, scale=0.3)
    r = rand(rng, shape, dtype) if has_res else None
    dy = rand(rng, shape, dtype)
    dh = rand(rng, shape, dtype) if has_res else None
    eps = 1e-6

    X, W, R = tt(x, device, True), tt(w, device, True), tt(r, device, True)
    out = ft.rms_norm(X, W, eps=eps, zero_centered_gamma=zc, residual=R)
    if has_res:
        y, h = out
        h_want = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
        np.testing.assert_array_equal(to_numpy(h), h_want)
        torch.autograd.backward([y, h], [tt(dy, device), tt(dh, device)])
    else:
        y, h_want = out, x
        y.backward(tt(dy, device))

    H64, W64 = t64(h_want, True), t64(w, True)
    g64 = None if W64 is None else (W64 + 1.0 if zc else W64)
    y64 = rms64(H64, g64, eps)
    y64.backward(t64(dy))
    dh64 = H64.grad.numpy() + (0.0 if dh is None else dh.astype(np.float64))

    assert y.dtype == X.dtype and y.shape == X.shape
    assert_close(y, y64.detach().numpy(), dtype, "y")
    assert_close(X.grad, dh64, dtype, "dx")
    if has_res:
        assert_close(R.grad, dh64, dtype, "dresidual")
    if W is not None:
        assert W.grad.dtype == W.dtype
        assert_rel(W.grad, W64.grad.numpy(), dtype, "dweight")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("variant", RMS_VARIANTS)
def test_rms_norm_matches_fp64(device, dtype, N, variant):
    need_device(device)
    check_rms_norm(device, dtype, (2, 3, N), variant, ("rms", device, dtype, N, variant))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_non_default_stream(dtype):
    """Forward and backward on a side stream that is kept busy first: if anything launched on
    another stream, it would read the inputs before they are written."""
    need_device("cuda")
    rng = rng_for("stream", dtype)
    shape, N = (64, 8, 1024), 1024
    x = rand(rng, shape, dtype, loc=-2.3, scale=0.5)
    r = rand(rng, shape, dtype)
    w = rand(rng, (N,), "float32", loc=1.0, scale=0.3)
    b = rand(rng, (N,), "float32", scale=0.3)
    dy = rand(rng, shape, dtype)
    X0, R0, DY0 = tt(x, "cuda"), tt(r, "cuda"), tt(dy, "cuda")
    W, B = tt(w, "cuda", True), tt(b, "cuda", True)
    W2 = tt(w, "cuda", True)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)
        X = (X0 * 1).requires_grad_()       # written on s, after the sleep
        R = (R0 * 1).requires_grad_()
        DY = DY0 * 1
        y = ft.layer_norm(X, W, B)
        y.backward(DY)
        y2, h = ft.rms_norm(X, W2, residual=R)
        (y2.float() * DY.float()).sum().backward()
        outs = [t.detach().float().cpu() for t in (y, X.grad, W.grad, B.grad, y2, h, R.grad, W2.grad)]
    s.synchronize()
    y, dx, dw, db, y2, h, dr, dw2 = outs

    X64, W64, B64 = t64(x, True), t64(w, True), t64(b, True)
    F.layer_norm(X64, (N,), W64, B64, 1e-5).backward(t64(dy))
    assert_close(y, F.layer_norm(X64, (N,), W64, B64, 1e-5).detach().numpy(), dtype, "y on a side stream")
    assert_rel(dw, W64.grad.numpy(), dtype, "dweight on a side stream")
    assert_rel(db, B64.grad.numpy(), dtype, "dbias on a side stream")

    h_want = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(h.numpy(), h_want.astype(np.float32))
    H64, W264 = t64(h_want, True), t64(w, True)
    y264 = rms64(H64, W264, 1e-6)
    y264.backward(t64(dy))
    assert_close(y2, y264.detach().numpy(), dtype, "rms y on a side stream")
    assert_close(dr, H64.grad.numpy(), dtype, "dresidual on a side stream")
    # x feeds both norms: its grad is the sum of the two
    assert_close(dx, X64.grad.numpy() + H64.grad.numpy(), dtype, "dx on a side stream")
    assert_rel(dw2, W264.grad.numpy(), dtype, "rms dweight on a side stream")


# ------------------------------------------------------------------------------------------------
# adapter details

@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs_and_grads(device):
    need_device(device)
    rng = rng_for("nc", device)
    N = 64
    base = tt(rand(rng, (N, 6), "float32"), device)
    x_nc = base.t().requires_grad_()            # (6, N), strided
    assert not x_nc.is_contiguous()
    x_c = x_nc.detach().contiguous().requires_grad_()
    w = tt(rand(rng, (2 * N,), "float32", loc=1.0), device)[::2].requires_grad_()  # strided weight
    w_c = w.detach().contiguous().requires_grad_()
    y_nc = ft.layer_norm(x_nc, w, None)
    y_c = ft.layer_norm(x_c, w_c, None)
    torch.testing.assert_close(y_nc, y_c, rtol=0, atol=0)
    y_nc.sum().backward()                       # dy is an expanded (stride-0) tensor
    y_c.sum().backward()
    torch.testing.assert_close(x_nc.grad, x_c.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, w_c.grad, rtol=0, atol=0)
    z = ft.rms_norm(x_nc, w, residual=base.t())[0]
    z.sum().backward()


def test_needs_input_grad_and_none_weights():
    rng = rng_for("needs")
    x = tt(rand(rng, (3, 16), "float32"), "cpu")
    w = tt(rand(rng, (16,), "float32", loc=1.0), "cpu", True)
    b = tt(rand(rng, (16,), "float32"), "cpu")  # no grad
    ft.layer_norm(x, w, b).sum().backward()
    assert x.grad is None and b.grad is None and w.grad is not None
    x.requires_grad_()
    w2 = w.detach()
    ft.rms_norm(x, w2).pow(2).sum().backward()
    assert x.grad is not None and w2.grad is None
    x.grad = None
    y = ft.layer_norm(x)                        # no weight, no bias
    y.backward(torch.ones_like(y))
    assert torch.isfinite(x.grad).all()


def test_no_grad_path_matches_autograd_path():
    rng = rng_for("nograd")
    x = tt(rand(rng, (5, 33), "bfloat16"), "cpu")
    w = tt(rand(rng, (33,), "float32", loc=1.0), "cpu")
    b = tt(rand(rng, (33,), "float32"), "cpu")
    y0 = ft.layer_norm(x, w, b)                 # nothing requires grad: plain call
    assert y0.grad_fn is None
    y1 = ft.layer_norm(x.clone().requires_grad_(), w, b)
    assert y1.grad_fn is not None
    torch.testing.assert_close(y0, y1.detach(), rtol=0, atol=0)
    with torch.no_grad():
        y2, h2 = ft.rms_norm(x.requires_grad_(), w, residual=x)
    assert y2.grad_fn is None and h2.grad_fn is None


def test_one_dimensional_input():
    rng = rng_for("1d")
    x = rand(rng, (40,), "float32")
    X = tt(x, "cpu", True)
    y = ft.layer_norm(X)
    assert y.shape == (40,)
    dy = rand(rng, (40,), "float32")
    y.backward(tt(dy, "cpu"))
    X64 = t64(x, True)
    F.layer_norm(X64, (40,)).backward(t64(dy))
    assert_close(X.grad, X64.grad.numpy(), "float32", "dx of a 1-D input")
    R = tt(rand(rng, (40,), "float32"), "cpu", True)
    y, h = ft.rms_norm(X, residual=R)
    assert y.shape == h.shape == (40,)
    (y.sum() + h.sum()).backward()
    assert R.grad.shape == (40,)


def test_residual_partial_use_and_no_aliasing():
    rng = rng_for("partial")
    x, r = (tt(rand(rng, (4, 32), "float32"), "cpu", True) for _ in range(2))
    w = tt(rand(rng, (32,), "float32", loc=1.0), "cpu", True)
    y, h = ft.rms_norm(x, w, residual=r)
    (h * 3).sum().backward()                    # only h used: gradient passes straight through
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    torch.testing.assert_close(r.grad, torch.full_like(r, 3.0))
    assert w.grad is None
    x.grad = r.grad = None
    y, h = ft.rms_norm(x, w, residual=r)
    y.sum().backward()                          # only y used
    torch.testing.assert_close(x.grad, r.grad)
    assert x.grad.data_ptr() != r.grad.data_ptr()
    x.grad.add_(1.0)                            # accumulating into one leaves the other alone
    assert not torch.equal(x.grad, r.grad)


# ------------------------------------------------------------------------------------------------
# modules

@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_module_drop_in(device):
    need_device(device)
    torch.manual_seed(1234)
    N = 781
    ref = torch.nn.LayerNorm(N, eps=1e-5, device=device)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
        ref.bias.normal_(0.0, 0.3)
    mod = ft.LayerNorm(N, eps=1e-5, device=device)
    mod.load_state_dict(ref.state_dict())
    assert set(dict(mod.named_parameters())) == {"weight", "bias"}
    assert mod.normalized_shape == ref.normalized_shape
    x = (torch.randn(4, 5, N, device=device) * 0.5 - 2.3).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(4, 5, N, device=device)
    y, y_ref = mod(x), ref(x_ref)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(mod.weight.grad, ref.weight.grad, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(mod.bias.grad, ref.bias.grad, atol=1e-3, rtol=1e-4)
    assert "781" in repr(mod) and "eps=1e-05" in repr(mod)
    mod.reset_parameters()
    assert torch.equal(mod.weight.detach(), torch.ones(N, device=device))
    assert torch.equal(mod.bias.detach(), torch.zeros(N, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_module_drop_in(device):
    need_device(device)
    torch.manual_seed(99)
    N = 1024
    ref = torch.nn.RMSNorm(N, eps=1e-6, device=device)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
    mod = ft.RMSNorm(N, eps=1e-6, device=device)
    mod.load_state_dict(ref.state_dict())
    assert set(dict(mod.named_parameters())) == {"weight"}
    x = (torch.randn(2, 3, N, device=device) + 0.5).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(2, 3, N, device=device)
    y, y_ref = mod(x), ref(x_ref)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(mod.weight.grad, ref.weight.grad, atol=1e-3, rtol=1e-4)
    r = torch.randn(2, 3, N, device=device)
    y2, h2 = mod(x, residual=r)
    torch.testing.assert_close(y2, ref(x + r), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(h2, x + r)


def test_modules_params_dtype_zero_centered_and_sequential():
    torch.manual_seed(5)
    N = 64
    ln = ft.LayerNorm(N, zero_centered_gamma=True, params_dtype=torch.float32)
    assert torch.equal(ln.weight.detach(), torch.zeros(N))  # g = weight + 1 = 1
    rms = ft.RMSNorm((N,), zero_centered_gamma=True, params_dtype=torch.bfloat16)
    assert rms.weight.dtype == torch.bfloat16 and rms.hidden_size == N
    assert "zero_centered_gamma=True" in repr(rms)
    x = torch.randn(3, N, dtype=torch.bfloat16, requires_grad=True)
    y = ln(x)                                   # fp32 params with bf16 activations
    assert y.dtype == torch.bfloat16
    y2 = rms(y)
    torch.testing.assert_close(y2.float(), rms64(y.detach().double(), None, 1e-6).float(),
                               atol=2e-2, rtol=2e-2)
    y2.float().sum().backward()
    assert ln.weight.grad.dtype == torch.float32 and rms.weight.grad.dtype == torch.bfloat16
    net = torch.nn.Sequential(torch.nn.Linear(N, N), ft.LayerNorm(N), torch.nn.GELU(), ft.RMSNorm(N))
    net(torch.randn(7, N)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    with pytest.raises(ValueError, match="last dimension"):
        ft.LayerNorm((4, N))


def test_import_fusedkit_does_not_import_torch():
    code = "import sys, fusedkit; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
