// fusedkit/cuda/common/act.cuh
// Activation functions and their derivatives in fp32 (GeLU tanh/erf, SiLU, ReLU, squared ReLU), shared
// by the activation kernels (activations.cu) and the fused backward casts (dact-cast-transpose).
// IEEE-accurate library functions (tanhf, erff, expf), no fast-math; formulas and derivatives as
// fusedkit/reference/activations.py.
#pragma once

namespace fk {

enum Act : int { GELU_TANH = 0, GELU_ERF = 1, SILU = 2, RELU = 3, SQUARED_RELU = 4 };

template <int ACT>
__device__ __forceinline__ float act_f(float x) {
  if constexpr (ACT == GELU_TANH) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  } else if constexpr (ACT == GELU_ERF) {
    return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
  } else if constexpr (ACT == SILU) {
    return x / (1.f + expf(-x));
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
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    const float t = tanhf(k0 * (x + k1 * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k0 * (1.f + 3.f * k1 * x * x);
  } else if constexpr (ACT == GELU_ERF) {
    return 0.5f * (1.f + erff(x * 0.7071067811865476f)) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
  } else if constexpr (ACT == SILU) {
    const float s = 1.f / (1.f + expf(-x));
    return s * (1.f + x * (1.f - s));
  } else if constexpr (ACT == RELU) {
    return x > 0.f ? 1.f : 0.f;
  } else {
    return 2.f * fmaxf(x, 0.f);
  }
}

}  // namespace fk
