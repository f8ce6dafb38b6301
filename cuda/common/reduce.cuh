// fusedkit/cuda/common/reduce.cuh
// Sums across the threads that share one row: a warp by shuffles, several warps through shared memory.
// Layout assumed by the row sums: blockDim.x = 32 * WARPS threads own one row, threadIdx.y picks the row
// within the block, so at most 32 warps (1024 threads) take part. Every thread gets the full sum.
#pragma once

namespace fk {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum of v over the 32 * WARPS threads of this thread's row, with one block barrier: the partial sums
// alternate between two shared buffers by `parity`, which the call flips, so consecutive calls (within
// a row or across the rows of a loop) never write the buffer the previous call's readers may still read
// (same argument as row_sum2_alternating below). Every thread of the block calls it with the same
// parity; WARPS == 1 has no barrier. A kernel that reduces once starts from parity 0.
template <int WARPS>
__device__ __forceinline__ float row_sum_alternating(float v, int& parity) {
  v = warp_sum(v);
  if constexpr (WARPS == 1) {
    return v;
  } else {
    __shared__ float partial_x2[2][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = threadIdx.y * WARPS;
    if (lane == 0) partial_x2[parity][base + warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) s += partial_x2[parity][base + i];
    parity ^= 1;
    return s;
  }
}

// Sums of two values over the row with one block barrier, for a loop that calls it once per iteration: the
// partial sums alternate between two shared buffers (`flip`: the iteration's parity), so no barrier has
// to guard the previous call's readers (a thread writes buffer b again only after the barrier of the
// call in between, which every reader of b reached after reading it). With BLOCK_SYNC the barrier is
// kept for WARPS == 1 too: on return the whole block has passed one barrier, so shared memory that
// every thread read before the call may be refilled.
template <int WARPS, bool BLOCK_SYNC>
__device__ __forceinline__ float2 row_sum2_alternating(float a, float b, int flip) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  if constexpr (WARPS == 1) {
    if constexpr (BLOCK_SYNC) __syncthreads();
    return make_float2(a, b);
  } else {
    __shared__ float2 partial2x2[2][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = threadIdx.y * WARPS;
    if (lane == 0) partial2x2[flip][base + warp] = make_float2(a, b);
    __syncthreads();
    float2 s = make_float2(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < WARPS; ++i) {
      const float2 t = partial2x2[flip][base + i];
      s.x += t.x;
      s.y += t.y;
    }
    return s;
  }
}

// Chan's merge of two (count, mean, M2) Welford states: numerically stable variance in one pass.
struct Welford {
  float n, mean, m2;
};
__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean;
  const float fb = b.n / n;
  Welford r;
  r.n = n;
  r.mean = a.mean + d * fb;
  r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
  return r;
}
__device__ __forceinline__ Welford warp_welford(Welford w) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Welford o;
    o.n = __shfl_xor_sync(0xffffffffu, w.n, off);
    o.mean = __shfl_xor_sync(0xffffffffu, w.mean, off);
    o.m2 = __shfl_xor_sync(0xffffffffu, w.m2, off);
    w = welford_merge(w, o);
  }
  return w;
}
// Whole-block Welford merge (1-D block, blockDim.x a multiple of 32, at most 1024 threads).
__device__ __forceinline__ Welford block_welford(Welford w) {
  __shared__ Welford part[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  w = warp_welford(w);
  __syncthreads();
  if (lane == 0) part[warp] = w;
  __syncthreads();
  Welford r = part[0];
  for (int i = 1; i < nwarps; ++i) r = welford_merge(r, part[i]);
  return r;
}
// Whole-block sum (1-D block).
__device__ __forceinline__ float2 block_sum2(float a, float b) {
  __shared__ float2 part[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  __syncthreads();
  if (lane == 0) part[warp] = make_float2(a, b);
  __syncthreads();
  float2 s = make_float2(0.f, 0.f);
  for (int i = 0; i < nwarps; ++i) {
    s.x += part[i].x;
    s.y += part[i].y;
  }
  return s;
}

}  // namespace fk
