// fusedkit/cuda/common/lse_stats.cuh
// Log-sum-exp statistics of a row with two side sums: (m, s, a, b) where s = sum exp(v - m) (the online
// softmax pair of common/online_softmax.cuh) and a, b are plain fp32 sums carried through the same
// reduction round (cross-entropy: a = sum of (x - x_0) for label smoothing, b = the target logit, held
// by one thread and 0 elsewhere). Merged across a warp (xor butterfly), the warps of a row (one shared
// memory round, then a butterfly over WARPS lanes) and the CTAs of a cluster (distributed shared
// memory: one float4 slot per CTA read with mapa + ld.shared::cluster, butterfly over CLUSTER lanes).
//
// Determinism: lse_stats_merge is commutative bit for bit (max_sum_merge is, and fp32 additions of
// the same two terms), so every lane of a butterfly, and every CTA of a cluster, gets the same bits.
// (Added with the cross-entropy kernels; a candidate to merge with online_softmax.cuh / cluster.cuh.)
#pragma once
#include "common/online_softmax.cuh"
#include "common/cluster.cuh"

namespace fk {

struct LseStats {
  float m, s, a, b;
};

__device__ __forceinline__ LseStats lse_stats_identity() { return {-__int_as_float(0x7f800000), 0.f, 0.f, 0.f}; }

__device__ __forceinline__ LseStats lse_stats_merge(const LseStats& x, const LseStats& y) {
  const MaxSum ms = max_sum_merge(MaxSum{x.m, x.s}, MaxSum{y.m, y.s});
  return {ms.m, ms.s, x.a + y.a, x.b + y.b};
}

template <int WIDTH = 32>
__device__ __forceinline__ LseStats warp_lse_stats(LseStats v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) {
    LseStats o;
    o.m = __shfl_xor_sync(0xffffffffu, v.m, off);
    o.s = __shfl_xor_sync(0xffffffffu, v.s, off);
    o.a = __shfl_xor_sync(0xffffffffu, v.a, off);
    o.b = __shfl_xor_sync(0xffffffffu, v.b, off);
    v = lse_stats_merge(v, o);
  }
  return v;
}

__device__ __forceinline__ LseStats shfl_lse_stats(const LseStats& v, int lane) {
  return {__shfl_sync(0xffffffffu, v.m, lane), __shfl_sync(0xffffffffu, v.s, lane),
          __shfl_sync(0xffffffffu, v.a, lane), __shfl_sync(0xffffffffu, v.b, lane)};
}

// Merge over the 32 * WARPS threads of this thread's row (blockDim.x = 32 * WARPS, threadIdx.y picks the
// row in the block). One call per kernel (no barrier before the shared-memory write); with WARPS > 1
// every thread of the block must call it.
template <int WARPS>
__device__ __forceinline__ LseStats row_lse_stats(LseStats v) {
  v = warp_lse_stats<32>(v);
  if constexpr (WARPS == 1) {
    return v;
  } else {
    __shared__ float4 lse_partial[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = threadIdx.y * WARPS;
    if (lane == 0) lse_partial[base + warp] = make_float4(v.m, v.s, v.a, v.b);
    __syncthreads();
    LseStats r = lse_stats_identity();
    if (lane < WARPS) {
      const float4 p = lse_partial[base + lane];
      r = LseStats{p.x, p.y, p.z, p.w};
    }
    r = warp_lse_stats<WARPS>(r);
    return shfl_lse_stats(r, 0);
  }
}

// The float4 at `local` (a 16-byte aligned __shared__ address of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ float4 ld_dsmem_f4(const void* local, unsigned rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
#else
  __trap();
#endif
  return v;
}

// Merge of the CTAs' statistics (identical in every thread of a CTA) over a cluster of CLUSTER CTAs
// (1-D cluster, rank = blockIdx.x % CLUSTER). Every thread of every CTA must call it. Protocol of
// common/cluster.cuh: afterwards the caller calls cluster_arrive() once its remote reads are done and
// cluster_wait() before the CTA exits.
template <int CLUSTER>
__device__ __forceinline__ LseStats cluster_lse_stats(LseStats v, float4* slot) {
  if (threadIdx.x == 0 && threadIdx.y == 0) *slot = make_float4(v.m, v.s, v.a, v.b);
  cluster_arrive();
  cluster_wait();
  const int lane = threadIdx.x & 31;
  LseStats r = lse_stats_identity();
  if (lane < CLUSTER) {
    const float4 p = ld_dsmem_f4(slot, lane);
    r = LseStats{p.x, p.y, p.z, p.w};
  }
  r = warp_lse_stats<CLUSTER>(r);
  return shfl_lse_stats(r, 0);
}

}  // namespace fk
