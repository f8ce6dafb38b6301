// fusedkit/cuda/common/dtypes.cuh
// Storage types and fp32 conversions for the kernels, without cuda_fp16.h / cuda_bf16.h.
//
// Why our own: NVRTC then needs no include path (the JIT hands every header to NVRTC from memory, so
// the compile cache key covers them), compiles faster, and the same code compiles on a CI machine with
// no CUDA toolkit. bf16 and fp16 are 16-bit storage structs; arithmetic is always done in fp32.
// Conversions are single PTX instructions, round-to-nearest-even (cvt.rn), sm_80 and newer.
#pragma once

namespace fk {

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<bf16> { static constexpr bool value = true; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float v) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}

// Read-only (texture-path) scalar load for any storage type.
__device__ __forceinline__ float ldg(const float* p) { return __ldg(p); }
__device__ __forceinline__ bf16 ldg(const bf16* p) { return bf16{__ldg(reinterpret_cast<const unsigned short*>(p))}; }
__device__ __forceinline__ f16 ldg(const f16* p) { return f16{__ldg(reinterpret_cast<const unsigned short*>(p))}; }

}  // namespace fk
