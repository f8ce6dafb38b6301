// fusedkit/cuda/common/online_softmax.cuh
// Online-softmax statistics: a (max, sum) pair where sum = sum_k exp(v_k - max), merged across threads,
// warps and CTAs in one reduction round (instead of a max reduction followed by a sum reduction).
//
// Numerics: sums are kept relative to a key, the rounded log2-unit image of their max (MaxSum, LseStats
// below): each term is 2^(fma(v, c, -key)), one FFMA whose product is exact, so inputs with large
// offsets (|v| ~ 1e4) lose nothing, and a merge rescales each partial sum by 2^(key - K) (the keys' exact
// difference) to the group's key K, so the keys' own rounding cancels in every ratio. A pair whose max
// is -inf (every value masked) has s = 0 and adds nothing; a group whose key is -inf takes key 0, so a
// merge never forms -inf - (-inf). NaN inputs propagate into s (fmaxf drops NaN from the max, the
// exponentials keep it).
//
// The merge is flat (warp_merge): the group's key first (one redux.sync over a warp, max shuffles over
// fewer lanes), then every member rescales its own sum once, then the sums add by xor shuffles. The
// pairwise form (merge two pairs, rescaling whichever has the smaller key, five times per warp) spent
// 19 % of the long-row forward's instructions on branches around the rescales; flat, the softmax forward
// at 2048 x 65536 went from 0.867 to 0.928 of copy and 512 x 262144 from 0.824 to 0.861, cross-entropy
// 131072 / 262144 from 0.800 / 0.766 to 0.828 / 0.791 (benchmarks/results/NVIDIA-H200_2026-12-04T142113Z
// _experiment.json against 142231Z; the masked forward needed the redux: max shuffles, its one-warp rows
// lost 2 %, 142333Z_experiment).
//
// Determinism: the key is a max, and the sums add the same two terms in either order, so every lane of
// an xor butterfly ends with the same bits, and every CTA of a cluster that merges the same inputs in
// the same tree gets the same bits. The same holds for LseStats (the pair plus two fp32 sums).
// warp_merge / row_merge here and cluster_merge (common/cluster.cuh) serve both types through StatsOps.
#pragma once
#include "common/fastmath.cuh"

namespace fk {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^t for t <= 0 (the exponentials of softmax and cross-entropy). FK_FAST_EXP=1 (the default) uses
// ex2.approx.ftz alone: exp2f's approximation (2 ulp) for normal results, 0 for results below 2^-126,
// which change neither a row sum (>= 1) nor a probability by more than 1.2e-38. exp2f (FK_FAST_EXP=0,
// through FUSEDKIT_NVRTC_OPTIONS=-DFK_FAST_EXP=0) adds a test and two multiplies per call to keep
// subnormal results. These kernels are issue-bound (about 30 instructions per element); on the H200
// (benchmarks/results/ab_fast_exp_2026-12-03T0818Z.json, same machine, two rounds) the fast form took
// the softmax forward from 0.73 to 0.90 of copy at 131072 x 1024, 0.69 to 0.86 at 32768 x 4096, 0.64 to
// 0.67 at 512 x 262144, and cross-entropy forward+backward from 0.50 to 0.58 at 16384 x 32768.
#ifndef FK_FAST_EXP
#define FK_FAST_EXP 1
#endif
__device__ __forceinline__ float exp2_nonpos(float t) {
#if FK_FAST_EXP
  return ex2_approx(t);
#else
  return exp2f(t);
#endif
}

// Keyed sums (the cross-entropy statistics, LseStats): a sum kept relative to the key K(m) = fl(m log2 e)
// of its max m (0 for m = -inf, a thread with no values) as s = sum 2^(fma(v, log2 e, -K(m))). Each term
// costs one FFMA before its exponential (the product inside the FFMA is exact, so offsets of 1e4 lose
// nothing to a prescaled v * log2 e), against a subtraction and a multiply for (v - m) * log2 e; merges
// rescale by 2^(K(from) - K(to)), so every partial sum stays relative to the rounded key of its own max
// and the keys cancel in every ratio (a probability p_j = 2^(fma(x_j, log2 e, -K(m))) / s). Where the
// absolute value matters (lse = m + ln s_m, s_m the sum relative to m itself): log2 s_m = log2 s -
// fma(m, log2 e, -K(m)), the key's rounding residual (below 2^-11 for |m| < 1e4), computed exactly.
// __fmul_rn: never contracted into an FMA with a later subtraction (K(a) - K(b) must be the difference of
// the two rounded keys; contracted, the merge was off by a key's rounding, 3e-4 relative at |m| ~ 1e4).
__device__ __forceinline__ float lse_key(float m) {
  return m == -__int_as_float(0x7f800000) ? 0.f : __fmul_rn(m, kLog2e);
}
__device__ __forceinline__ float exp_keyed(float v, float key) { return exp2_nonpos(fmaf(v, kLog2e, -key)); }
// s relative to K(from), re-expressed relative to K(to) for to >= from: the running sum of one thread's
// online pass (cross_entropy.cu's looped kernel). A sum with from = -inf is 0, or NaN: fmaxf keeps the
// key at -inf through NaN values while the sum takes them in, and s * 0 keeps that NaN.
__device__ __forceinline__ float rescale_keyed(float s, float from, float to) {
  const float f = from == -__int_as_float(0x7f800000) ? 0.f : exp2_nonpos(lse_key(from) - lse_key(to));
  return from == to ? s : s * f;
}
// log2 of the sum relative to m itself, from a keyed sum s.
__device__ __forceinline__ float log2_sum_at(float s, float m) {
  return log2f(s) - fmaf(m, kLog2e, -lse_key(m));
}

// The softmax statistics, in log2 units: k = the key of the max, fl(max_j x_j * C) with C = fl(scale *
// log2 e) (-inf when there is no value), and s = sum_j 2^(fma(x_j, C, -k)). One FFMA and an exponential
// per term on the raw input (no separate multiply by the scale, no subtraction), and the key cancels in
// every ratio: y_j = 2^(fma(x_j, C, -k)) / s and log y_j = ln 2 (fma(x_j, C, -k) - log2 s) do not depend
// on how k was rounded, as long as every term and merge of a row uses the same keys.
struct MaxSum {
  float k, s;
};

// The cross-entropy statistics: the max m and the keyed sum s (above) plus two plain fp32 sums carried
// through the same reduction round (a = sum of (x - x_0) for label smoothing, b = the target logit, held
// by one thread and 0 elsewhere).
struct LseStats {
  float m, s, a, b;
};

__device__ __forceinline__ MaxSum max_sum_identity() { return {-__int_as_float(0x7f800000), 0.f}; }

// s relative to key `from`, re-expressed relative to key `to` >= from: the running sum of one thread's
// online pass (softmax.cu's looped kernel). From -inf the factor is 2^(-inf) = 0, which keeps a NaN sum
// (NaN values leave the key at -inf; returning 0 there made the NaN of a row's first values vanish).
__device__ __forceinline__ float rescale_key(float s, float from, float to) {
  return from == to ? s : s * exp2_nonpos(from - to);
}

// What the generic merges below need of a statistics type S: its identity; its key; rebase(v, K), the
// pair re-expressed relative to a group key K >= v's key (a member with key -inf has s = 0, or NaN when
// its values were NaN: the factor 0 keeps it; K = -inf, a group without any, counts as key 0); add, of
// two pairs on one key; xor shuffles of the sums; and a float4 image for shuffles and shared-memory
// slots (unused lanes of the image are 0).
template <typename S> struct StatsOps;

template <>
struct StatsOps<MaxSum> {
  static __device__ __forceinline__ MaxSum identity() { return max_sum_identity(); }
  static __device__ __forceinline__ float4 pack(MaxSum v) { return make_float4(v.k, v.s, 0.f, 0.f); }
  static __device__ __forceinline__ MaxSum unpack(float4 p) { return {p.x, p.y}; }
  static __device__ __forceinline__ MaxSum shfl(MaxSum v, int lane) {
    return {__shfl_sync(0xffffffffu, v.k, lane), __shfl_sync(0xffffffffu, v.s, lane)};
  }
  static __device__ __forceinline__ float key(MaxSum v) { return v.k; }
  static __device__ __forceinline__ MaxSum rebase(MaxSum v, float K) {
    return {K, v.s * exp2_nonpos(v.k - (K == -__int_as_float(0x7f800000) ? 0.f : K))};
  }
  static __device__ __forceinline__ MaxSum add(MaxSum a, MaxSum b) { return {a.k, a.s + b.s}; }
  static __device__ __forceinline__ MaxSum shfl_xor_sums(MaxSum v, int off) {
    return {v.k, __shfl_xor_sync(0xffffffffu, v.s, off)};
  }
};

template <>
struct StatsOps<LseStats> {
  static __device__ __forceinline__ LseStats identity() { return {-__int_as_float(0x7f800000), 0.f, 0.f, 0.f}; }
  static __device__ __forceinline__ float4 pack(const LseStats& v) { return make_float4(v.m, v.s, v.a, v.b); }
  static __device__ __forceinline__ LseStats unpack(float4 p) { return {p.x, p.y, p.z, p.w}; }
  static __device__ __forceinline__ LseStats shfl(const LseStats& v, int lane) {
    return {__shfl_sync(0xffffffffu, v.m, lane), __shfl_sync(0xffffffffu, v.s, lane),
            __shfl_sync(0xffffffffu, v.a, lane), __shfl_sync(0xffffffffu, v.b, lane)};
  }
  static __device__ __forceinline__ float key(const LseStats& v) { return v.m; }
  static __device__ __forceinline__ LseStats rebase(const LseStats& v, float M) {
    const float s = v.s * (v.m == -__int_as_float(0x7f800000) ? 0.f : exp2_nonpos(lse_key(v.m) - lse_key(M)));
    return {M, s, v.a, v.b};
  }
  static __device__ __forceinline__ LseStats add(const LseStats& x, const LseStats& y) {
    return {x.m, x.s + y.s, x.a + y.a, x.b + y.b};
  }
  static __device__ __forceinline__ LseStats shfl_xor_sums(const LseStats& v, int off) {
    return {v.m, __shfl_xor_sync(0xffffffffu, v.s, off), __shfl_xor_sync(0xffffffffu, v.a, off),
            __shfl_xor_sync(0xffffffffu, v.b, off)};
  }
};

// The max of a float over the 32 lanes of a warp in one redux.sync: floats map to ints of the same order
// (a negative float's magnitude bits flipped). A NaN key with the sign bit clear wins, one with it set
// loses: either way the row's sum is NaN already (a thread's key is NaN only if its values are).
__device__ __forceinline__ float warp_max_redux(float f) {
  const int i = __float_as_int(f);
  const int o = __reduce_max_sync(0xffffffffu, i >= 0 ? i : i ^ 0x7fffffff);
  return __int_as_float(o >= 0 ? o : o ^ 0x7fffffff);
}

// Flat merge over the lanes of a warp whose xor distance is below WIDTH (a power of two <= 32): the
// group's key, one rescale per lane, then the sums by an xor butterfly (every lane gets the result).
template <int WIDTH = 32, typename S>
__device__ __forceinline__ S warp_merge(S v) {
  float key = StatsOps<S>::key(v);
  if constexpr (WIDTH == 32) {
    key = warp_max_redux(key);
  } else {
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off >>= 1) key = fmaxf(key, __shfl_xor_sync(0xffffffffu, key, off));
  }
  v = StatsOps<S>::rebase(v, key);
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) v = StatsOps<S>::add(v, StatsOps<S>::shfl_xor_sums(v, off));
  return v;
}

// Merge over the 32 * WARPS threads of this thread's row (layout of row_sum_alternating in reduce.cuh:
// blockDim.x = 32 * WARPS threads own one row, threadIdx.y picks the row in the block). With WARPS > 1
// every thread of the block must call it, with the same `parity`, which the call flips: the partials
// alternate between two shared buffers, so one block barrier per call suffices, in a loop too (the
// argument of row_sum_alternating). The cross-warp step is warp_merge over WARPS lanes (log2(WARPS)
// shuffle steps, not WARPS - 1).
template <int WARPS, typename S>
__device__ __forceinline__ S row_merge(S v, int& parity) {
  v = warp_merge<32>(v);
  if constexpr (WARPS == 1) {
    return v;
  } else {
    __shared__ float4 partial_x2[2][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = threadIdx.y * WARPS;
    if (lane == 0) partial_x2[parity][base + warp] = StatsOps<S>::pack(v);
    __syncthreads();
    S r = lane < WARPS ? StatsOps<S>::unpack(partial_x2[parity][base + lane]) : StatsOps<S>::identity();
    parity ^= 1;
    r = warp_merge<WARPS>(r);
    return StatsOps<S>::shfl(r, 0);
  }
}

}  // namespace fk
