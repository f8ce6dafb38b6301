"""Activations on the CPU (NumPy + Numba for erf), same signatures as ``fusedkit.gelu`` and friends.

Numerics follow cuda/activations.cu: x (and bias) as stored, x + bias in fp32, the activation as an
fp32 value (GeLU-tanh and SiLU computed in float64 and rounded once, the value the kernels' fast
sigmoid approximates to a few ulp), one rounding to the output dtype. Gated forms (SwiGLU, GeGLU, ReGLU) split the last dim in halves,
``a, g = x[..., :H], x[..., H:]``, and return ``act(a) * g`` of last dim H (Transformer Engine's layout).

Derivatives (used by the ``*_backward`` functions):
  gelu (tanh):  u = k0 (x + k1 x^3), t = tanh(u): 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2)
  gelu (erf):   0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
  silu:         s (1 + x (1 - s)), s = sigmoid(x)
  relu:         1 for x > 0, else 0;   squared relu: 2 max(x, 0)
"""
from __future__ import annotations

import math

import numpy as np

F32 = np.float32
K0 = F32(math.sqrt(2.0 / math.pi))
K1 = F32(0.044715)
INV_SQRT2 = F32(1.0 / math.sqrt(2.0))
INV_SQRT_2PI = F32(1.0 / math.sqrt(2.0 * math.pi))

ACTS = ("gelu_tanh", "gelu_erf", "silu", "relu", "squared_relu")
GATED = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_erf": "gelu_erf", "reglu": "relu"}

_erf = None


def erf(x):
    """fp32 erf elementwise (Numba-vectorized math.erf, computed in float64 then rounded)."""
    global _erf
    if _erf is None:
        import numba

        @numba.vectorize(["float32(float32)"], cache=False)
        def _e(v):
            return math.erf(v)
        _erf = _e
    return _erf(np.asarray(x, F32))


def _sigmoid64(z):
    """float64 sigmoid (no overflow warnings: e^-z = inf gives 0)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def _u64(x):
    """The tanh argument of the tanh-approximated GeLU, in float64."""
    x = np.asarray(x, np.float64)
    return math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)


def act(x, kind):
    """fp32 activation of fp32 x. GeLU (tanh) and SiLU are evaluated in float64 and rounded once:
    0.5 x (1 + tanh(u)) in fp32 cancels at x << 0 (thousands of ulp), while the kernels evaluate the
    same function as x sigmoid(2u), accurate to a few ulp (cuda/common/act.cuh)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "gelu_tanh":
            return (np.asarray(x, np.float64) * _sigmoid64(2.0 * _u64(x))).astype(F32)
        if kind == "gelu_erf":
            return F32(0.5) * x * (F32(1) + erf(x * INV_SQRT2))
        if kind == "silu":
            return (np.asarray(x, np.float64) * _sigmoid64(np.asarray(x, np.float64))).astype(F32)
        if kind == "relu":
            return np.maximum(x, F32(0))
        if kind == "squared_relu":
            r = np.maximum(x, F32(0))
            return r * r
    raise ValueError(f"unknown activation {kind!r}")


def dact(x, kind):
    """fp32 derivative of the activation at fp32 x."""
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "gelu_tanh":  # float64, rounded once (see act)
            x64 = np.asarray(x, np.float64)
            sg = _sigmoid64(2.0 * _u64(x64))
            du = math.sqrt(2.0 / math.pi) * (1.0 + 3.0 * 0.044715 * x64 * x64)
            return (sg + 2.0 * x64 * sg * (1.0 - sg) * du).astype(F32)
        if kind == "gelu_erf":
            return F32(0.5) * (F32(1) + erf(x * INV_SQRT2)) + x * np.exp(F32(-0.5) * x * x) * INV_SQRT_2PI
        if kind == "silu":  # float64, rounded once (see act)
            x64 = np.asarray(x, np.float64)
            sg = _sigmoid64(x64)
            return (sg * (1.0 + x64 * (1.0 - sg))).astype(F32)
        if kind == "relu":
            return (x > 0).astype(F32)
        if kind == "squared_relu":
            return F32(2) * np.maximum(x, F32(0))
    raise ValueError(f"unknown activation {kind!r}")


def _input(x, bias):
    xf = x.astype(F32)
    if bias is not None:
        xf = xf + bias.astype(F32)
    return xf


def forward(x, kind, bias=None, out_dtype=None):
    """act(x + bias) (non-gated) or act(a) * g (gated kinds, halves of the last dim)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    xf = _input(x, bias)
    if kind in GATED:
        H = x.shape[-1] // 2
        return (act(xf[..., :H], GATED[kind]) * xf[..., H:]).astype(out_dtype)
    return act(xf, kind).astype(out_dtype)


def backward(dy, x, kind, bias=None):
    """Gradient with respect to x (the bias gradient is its sum over the leading dims)."""
    xf = _input(x, bias)
    d = dy.astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        if kind in GATED:
            H = x.shape[-1] // 2
            a, g = xf[..., :H], xf[..., H:]
            inner = GATED[kind]
            dx = np.concatenate([d * g * dact(a, inner), d * act(a, inner)], axis=-1)
        else:
            dx = d * dact(xf, kind)
    return dx.astype(x.dtype)
