// fusedkit/cuda/common/act.cuh
// Activation functions and their derivatives in fp32 (GeLU tanh/erf, SiLU, ReLU, squared ReLU), shared
// by the activation kernels (activations.cu) and the fused backward casts (dact-cast-transpose).
// GeLU (tanh form) and SiLU go through sigmoid_fast (GeLU-tanh as x sigmoid(2u), the same function as
// 0.5 x (1 + tanh(u)) without its cancellation at x << 0); GeLU (erf form) keeps erff / expf. Formulas
// and derivatives as fusedkit/reference/activations.py (float64).
#pragma once
#include "common/fastmath.cuh"

namespace fk {

enum Act : int { GELU_TANH = 0, GELU_ERF = 1, SILU = 2, RELU = 3, SQUARED_RELU = 4 };

// 1 / (1 + e^-z) from the hardware exponential (ex2.approx after a log2(e) prescale) and a fast
// division: about 6 instructions against about 40 for expf plus an IEEE division, which made SwiGLU
// and GeLU issue-bound rather than memory-bound on the H200 (run 184943Z: 0.83 / 0.88 of copy).
// Relative error a few ulp (plus |z| x 2^-24 from the prescale; negligible against every output
// dtype's tolerance); e^-z = inf (z < -88) gives exactly 0, e^-z -> 0 gives 1.
__device__ __forceinline__ float sigmoid_fast(float z) {
  return __fdividef(1.f, 1.f + __expf(-z));
}

// u(x) = sqrt(2 / pi) (x + 0.044715 x^3), the argument of tanh in the tanh-approximated GeLU.
__device__ __forceinline__ float gelu_tanh_arg(float x) {
  return 0.7978845608028654f * (x + 0.044715f * x * x * x);
}

template <int ACT>
__device__ __forceinline__ float act_f(float x) {
  if constexpr (ACT == GELU_TANH) {
    return x * sigmoid_fast(2.f * gelu_tanh_arg(x));  // 0.5 (1 + tanh(u)) = sigmoid(2u)
  } else if constexpr (ACT == GELU_ERF) {
    return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
  } else if constexpr (ACT == SILU) {
    return x * sigmoid_fast(x);
  } else if constexpr (ACT == RELU) {
    return fmaxf(x, 0.f);
  } else {
    const float r = fmaxf(x, 0.f);
    return r * r;
  }
}

template <int ACT>
__device__ __forceinline__ float dact_f(float x) {
  if constexpr (ACT == GELU_TANH) {
    // d/dx x sigmoid(2u), u = k0 (x + k1 x^3): s + x s (1 - s) (b1 + b3 x^2) with s = 1 / (1 + e),
    // e = 2^(x (a1 + a2 x^2)), the constants folded (b1 = 2 k0, b3 = 3 b1 k1, a1 = -b1 log2(e), a2 = a1 k1)
    // and the tail one FFMA: the dgelu + dbias cast-transpose 2880 -> 2304 SASS instructions, 0.85-0.86
    // -> 0.90-0.91 of copy on the H100 (ab_gelu_folded_H100_2026-12-06T1450Z.json). A few ulp from the
    // unfolded form; +-inf give NaN as it did.
    constexpr float kB1 = 2.f * 0.7978845608028654f;            // d(2u)/dx = b1 + b3 x^2
    constexpr float kB3 = 3.f * kB1 * 0.044715f;
    constexpr float kA1 = -kB1 * 1.4426950408889634f;            // -2u log2(e) = x (a1 + a2 x^2)
    constexpr float kA2 = kA1 * 0.044715f;
    const float x2 = x * x;
    const float s = __fdividef(1.f, 1.f + ex2_approx(x * fmaf(kA2, x2, kA1)));
    return fmaf((x * s) * (1.f - s), fmaf(kB3, x2, kB1), s);
  } else if constexpr (ACT == GELU_ERF) {
    return 0.5f * (1.f + erff(x * 0.7071067811865476f)) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
  } else if constexpr (ACT == SILU) {
    const float s = sigmoid_fast(x);
    return s * (1.f + x * (1.f - s));
  } else if constexpr (ACT == RELU) {
    return x > 0.f ? 1.f : 0.f;
  } else {
    return 2.f * fmaxf(x, 0.f);
  }
}

}  // namespace fk
