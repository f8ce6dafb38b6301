// fusedkit/cuda/common/online_softmax.cuh
// Online-softmax statistics: a (max, sum) pair where sum = sum_k exp(v_k - max), merged across threads,
// warps and CTAs in one reduction round (instead of a max reduction followed by a sum reduction).
//
// Numerics: exponentials are exp2f((v - m) * log2(e)); the subtraction comes first so that inputs with
// large offsets (|v| ~ 1e4) lose nothing to the rounding of a prescaled v * log2(e). A pair with
// m = -inf (every value masked) has s = 0 and is the identity of the merge; merging never forms
// -inf - (-inf). NaN inputs propagate into s (fmaxf drops NaN from m, the exponentials keep it).
//
// Determinism: max_sum_merge is commutative bit for bit (fmaxf, and fp32 addition of the same two
// terms), so an xor-butterfly gives every lane the same result, and every CTA of a cluster that
// merges the same inputs in the same tree gets the same bits.
#pragma once

namespace fk {

constexpr float kLog2e = 1.4426950408889634f;

// 2^t for t <= 0 (the exponentials of softmax and cross-entropy). exp2f compiles to MUFU.EX2 plus a
// test and two multiplies that keep subnormal results (t < -126); FK_FAST_EXP=1 (experiment:
// FUSEDKIT_NVRTC_OPTIONS=-DFK_FAST_EXP=1) uses ex2.approx.ftz alone: the same approximation (2 ulp) for
// normal results, 0 for results below 2^-126, which change neither a row sum (>= 1) nor a probability
// by more than 1.2e-38. These kernels run about 30 instructions per element, so issue rate, not only
// bandwidth, bounds them; the H200 measurement decides the default.
#ifndef FK_FAST_EXP
#define FK_FAST_EXP 0
#endif
__device__ __forceinline__ float exp2_nonpos(float t) {
#if FK_FAST_EXP
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
#else
  return exp2f(t);
#endif
}

// exp(v - m) for v <= m (v = -inf gives 0).
__device__ __forceinline__ float exp_shifted(float v, float m) { return exp2_nonpos((v - m) * kLog2e); }

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum max_sum_identity() { return {-__int_as_float(0x7f800000), 0.f}; }

// s = sum exp(v - from), re-expressed relative to `to` >= from (s stays as it is when from == to,
// which also covers from == to == -inf).
__device__ __forceinline__ float rescale_sum(float s, float from, float to) {
  return from == to ? s : s * exp2_nonpos((from - to) * kLog2e);
}

__device__ __forceinline__ MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, rescale_sum(a.s, a.m, m) + rescale_sum(b.s, b.m, m)};
}

// Butterfly merge over the lanes of a warp whose xor distance is below WIDTH (a power of two <= 32).
template <int WIDTH = 32>
__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) {
    MaxSum o;
    o.m = __shfl_xor_sync(0xffffffffu, v.m, off);
    o.s = __shfl_xor_sync(0xffffffffu, v.s, off);
    v = max_sum_merge(v, o);
  }
  return v;
}

// Merge over the 32 * WARPS threads of this thread's row (layout of row_sum in reduce.cuh: blockDim.x =
// 32 * WARPS threads own one row, threadIdx.y picks the row in the block). With WARPS > 1 every thread
// of the block must call it (barriers). The cross-warp step is a butterfly over WARPS lanes, so it costs
// log2(WARPS) merges, not WARPS - 1.
template <int WARPS>
__device__ __forceinline__ MaxSum row_max_sum(MaxSum v) {
  v = warp_max_sum<32>(v);
  if constexpr (WARPS == 1) {
    return v;
  } else {
    __shared__ MaxSum ms_partial[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = threadIdx.y * WARPS;
    __syncthreads();  // the previous call's readers are done with ms_partial
    if (lane == 0) ms_partial[base + warp] = v;
    __syncthreads();
    MaxSum r = lane < WARPS ? ms_partial[base + lane] : max_sum_identity();
    r = warp_max_sum<WARPS>(r);
    r.m = __shfl_sync(0xffffffffu, r.m, 0);
    r.s = __shfl_sync(0xffffffffu, r.s, 0);
    return r;
  }
}

}  // namespace fk
