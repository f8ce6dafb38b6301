// fusedkit/cuda/common/fastmath.cuh
// The hardware's approximate transcendental, shared by the activations (common/act.cuh) and the
// softmax / cross-entropy exponentials (common/online_softmax.cuh).
#pragma once

namespace fk {

// 2^z by ex2.approx.ftz (one MUFU.EX2; about 2 ulp for normal results; subnormal inputs and results
// flush to 0).
__device__ __forceinline__ float ex2_approx(float z) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(z));
  return r;
}

}  // namespace fk
