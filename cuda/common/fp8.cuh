// fusedkit/cuda/common/fp8.cuh
// fp32 -> FP8 (E4M3 "fn", E5M2) with round-to-nearest-even and saturation to the max finite value,
// matching Transformer Engine (and fusedkit.reference.fp8): +-inf -> +-max, NaN -> NaN.
// sm_89 and newer use the hardware conversion (cvt.rn.satfinite.{e4m3,e5m2}x2.f32); older targets a
// bit-exact software path (same results by construction; the GPU tests compare both with the CPU).
#pragma once
#include "common/vec.cuh"

namespace fk {

struct E4M3 {
  static constexpr int MAN = 3, BIAS = 7;
  static constexpr float MAX = 448.f;
  static constexpr unsigned MAX_CODE = 0x7E, NAN_CODE = 0x7F;
};
struct E5M2 {
  static constexpr int MAN = 2, BIAS = 15;
  static constexpr float MAX = 57344.f;
  static constexpr unsigned MAX_CODE = 0x7B, NAN_CODE = 0x7F;
};

// Software conversion: exact RNE from the float's own bits (rintf rounds to nearest even).
template <typename F>
__device__ __forceinline__ unsigned char fp8_from_float_sw(float f) {
  const unsigned sign = (__float_as_uint(f) >> 24) & 0x80u;
  const float a = fabsf(f);
  if (a != a) return (unsigned char)(sign | F::NAN_CODE);
  if (a >= F::MAX) return (unsigned char)(sign | F::MAX_CODE);
  const int min_normal_exp = 1 - F::BIAS;
  int e = (int)((__float_as_uint(a) >> 23) & 0xFF) - 127;
  unsigned code;
  if (e < min_normal_exp) {  // subnormal (or rounds up to the smallest normal: codes are contiguous)
    code = (unsigned)rintf(ldexpf(a, F::MAN - min_normal_exp));
  } else {
    const float m = ldexpf(a, -e);                     // [1, 2)
    unsigned q = (unsigned)rintf((m - 1.f) * (float)(1 << F::MAN));
    if (q == (1u << F::MAN)) { q = 0; ++e; }
    code = ((unsigned)(e + F::BIAS) << F::MAN) | q;
  }
  if (code > F::MAX_CODE) code = F::MAX_CODE;
  return (unsigned char)(sign | code);
}

// Two values -> two FP8 bytes (lo in the low byte).
template <typename F>
__device__ __forceinline__ unsigned short fp8x2_from_float(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  if constexpr (F::MAN == 3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (unsigned short)(fp8_from_float_sw<F>(lo) | (fp8_from_float_sw<F>(hi) << 8));
#endif
}

// Four values -> one word of FP8 bytes (byte k = value k). On sm_89+ both conversions write the halves
// of the word directly (no zero-extension of 16-bit results, no byte permute).
template <typename F>
__device__ __forceinline__ unsigned fp8x4_from_float(float v0, float v1, float v2, float v3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned r;
  if constexpr (F::MAN == 3) {
    asm("{.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};}" : "=r"(r) : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
  } else {
    asm("{.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};}" : "=r"(r) : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
  }
  return r;
#else
  return (unsigned)fp8x2_from_float<F>(v0, v1) | ((unsigned)fp8x2_from_float<F>(v2, v3) << 16);
#endif
}

// VEC fp32 values -> FP8 bytes sat(v * scale) (RNE, pairs through fp8x2_from_float); |v| is merged
// into amax (NaN ignored, as fmaxf does).
template <typename F, int VEC>
__device__ __forceinline__ Vec<unsigned char, VEC> cast_fp8_vec(const float (&v)[VEC], float scale, float& amax) {
  Vec<unsigned char, VEC> q;
  if constexpr (VEC == 1) {
    amax = fmaxf(amax, fabsf(v[0]));
    q.v[0] = (unsigned char)(fp8x2_from_float<F>(__fmul_rn(v[0], scale), 0.f) & 0xFF);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; j += 2) {
      amax = fmaxf(amax, fmaxf(fabsf(v[j]), fabsf(v[j + 1])));
      const unsigned short p = fp8x2_from_float<F>(__fmul_rn(v[j], scale), __fmul_rn(v[j + 1], scale));
      q.v[j] = (unsigned char)(p & 0xFF);
      q.v[j + 1] = (unsigned char)(p >> 8);
    }
  }
  return q;
}

// cast_fp8_vec stored straight to p (VEC-byte aligned): for VEC % 4 == 0 four values at a time become
// one 32-bit word (fp8x4_from_float) and the words are stored. Returning the
// bytes in a Vec<unsigned char, VEC> instead makes the compiler split them into bytes and reassemble
// them (about 3 integer instructions per element; the SASS of norm_fwd_fp8<bf16, bf16, E4M3, 8, 4, 4>
// went from 1784 to 1608 instructions with this). Same bytes, same amax.
template <typename F, int VEC>
__device__ __forceinline__ void store_fp8_vec(unsigned char* p, const float (&v)[VEC], float scale, float& amax) {
  if constexpr (VEC % 4 == 0) {
    Vec<unsigned, VEC / 4> w;
#pragma unroll
    for (int j = 0; j < VEC; j += 4) {
      amax = fmaxf(amax, fmaxf(fabsf(v[j]), fabsf(v[j + 1])));
      amax = fmaxf(amax, fmaxf(fabsf(v[j + 2]), fabsf(v[j + 3])));
      w.v[j / 4] = fp8x4_from_float<F>(__fmul_rn(v[j], scale), __fmul_rn(v[j + 1], scale),
                                       __fmul_rn(v[j + 2], scale), __fmul_rn(v[j + 3], scale));
    }
    store_vec<unsigned, VEC / 4>(reinterpret_cast<unsigned*>(p), w);
  } else {
    store_vec<unsigned char, VEC>(p, cast_fp8_vec<F, VEC>(v, scale, amax));
  }
}

// Block-wide max of v (>= 0 values; NaN ignored as fmaxf does) merged into *amax_out with an atomicMax
// on the float's bits (valid for non-negative floats; order-independent, so deterministic). Any block
// shape: tid is the flat thread index, nthreads the block size (a multiple of 32, at most 1024); every
// thread calls it (one barrier).
__device__ __forceinline__ void block_amax_merge_flat(float v, float* amax_out, unsigned tid, unsigned nthreads) {
  __shared__ float part[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = tid >> 5, lane = tid & 31;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (tid == 0) {
    float m = part[0];
    for (int i = 1; i < (int)(nthreads >> 5); ++i) m = fmaxf(m, part[i]);
    // Only a block that raises the current value issues the atomic (written !(m <= cur) so a NaN still
    // goes through): the max is monotone, so skipping is exact, and a grid of one block per row (the
    // norm forward: 32768 blocks) no longer queues tens of thousands of same-address atomics at one L2
    // slice.
    if (!(m <= __ldcg(amax_out))) atomicMax(reinterpret_cast<unsigned int*>(amax_out), __float_as_uint(m));
  }
}

// The same for 1-D blocks.
__device__ __forceinline__ void block_amax_merge(float v, float* amax_out) {
  block_amax_merge_flat(v, amax_out, threadIdx.x, blockDim.x);
}
// Warp-wide max of v merged into *amax_out by lane 0, without a block barrier: one redux.sync over the
// float bits (v >= +0 and never NaN, a per-thread fmaxf chain of |y| from 0, so the bits order as the
// values), then the atomic only where it raises the current value (as above). For kernels of one row
// group per block, whose blocks would otherwise each pay a barrier for the merge. Every lane of the
// warp calls it; lane 0 is threadIdx.x % 32 (blockDim.x a multiple of 32).
__device__ __forceinline__ void warp_amax_merge(float v, float* amax_out) {
  const unsigned m = __reduce_max_sync(0xffffffffu, __float_as_uint(v));
  if ((threadIdx.x & 31) == 0 && m > __float_as_uint(__ldcg(amax_out)))
    atomicMax(reinterpret_cast<unsigned int*>(amax_out), m);
}

}  // namespace fk
