// fusedkit/cuda/norms.cu -- LayerNorm and RMSNorm, forward and backward (one family: RMS = true drops
// the mean and the bias).
//
// Forward (norm_fwd): one group of rows per block, non-persistent grid. A row of N elements is split
// into N / VEC vectors of 16 bytes (VEC = 8 for bf16/fp16, 4 for fp32; narrower when N or a pointer's
// alignment demands, down to VEC = 1). 32 * WARPS threads own one row; thread t holds vectors t, t + T,
// ..., t + (ITEMS - 1) * T (T = 32 * WARPS), so every load of a warp is one coalesced 512-byte access.
// Blocks are 128 threads or more: RPB = 4 / WARPS rows per block when a row takes fewer than 4 warps.
// The row stays in registers as raw storage (one buffer, plain loads); load latency is hidden by the
// many resident blocks. Where N fills the config exactly (N = ITEMS * T * VEC, FULL) the per-vector
// bounds tests are compiled out. LayerNorm takes exact two-pass statistics from registers: mean, then
// sum((x - mean)^2), each one row sum (shuffles, plus, when WARPS > 1, one shared-memory round with a
// single barrier: row_sum_alternating).
// Bytes: read x (+ residual) and the weights (cached), write y (+ x + residual) and 8 bytes of
// statistics per row: 4MN for 2-byte x and y.
//
// Forward, long rows (norm_fwd_looped): rows too long for registers (beyond 16 warps x 8 vectors).
// One row per block of 1024 threads: pass 1 reads the row for Welford statistics (Chan merges across
// threads), pass 2 reads it again (mostly from L2) and writes y. 6MN bytes; correctness path.
//
// Forward with FP8 output (norm_fwd_fp8, norm_fwd_looped_fp8): the same row code (normalize_row /
// looped_row) with another output policy: the fp32 y is cast as sat(y * scale) to E4M3 / E5M2 bytes
// (common/fp8.cuh cast_fp8_vec, RNE), |y| is merged into a per-thread amax, and at the end of the block
// one block-wide max goes to *amax_out (atomicMax on the float bits; the caller zeroes it). The register
// kernel walks row groups grid-stride over the resident blocks, so that merge runs once per block rather
// than once per row group (norm_fwd_looped_fp8: one row per block); LayerNorm's (two row sums per
// group) also asks the L2 for its next group while it works on this one (PREFETCH). The scale
// is read from device memory (delayed scaling, no host sync); thread 0 of block 0 writes
// scale_inv = 1 / scale (IEEE division). The input cast of the next FP8 GEMM fused into the norm:
// read 2MN + write MN = 3MN bytes for 2-byte x (one atomic per block on top). M = 0 launches one block
// that only writes scale_inv. The fp32 values cast are bit for bit those the plain kernel with
// out_dtype float32 stores (same row code, same config); the GPU tests rely on that. The plain kernels
// instantiate the row code with PlainOut: their machine code is unchanged by the FP8 variants (see the
// output policies below).
//
// Backward: persistent grid; each block walks rows with the same thread -> column mapping as the
// forward, so every thread accumulates dweight / dbias for its own columns in fp32 across all the rows
// it sees, with no atomics. Per row: two sums (sum g*dy*xhat, sum g*dy) in one row reduction with a
// single block barrier (row_sum2_alternating), then dx = rstd * (g*dy - xhat*c1 - c2) (c2 = 0 for RMS).
// At the end each (block, row slot) writes one fp32 partial row; column_sum adds the partials of
// dweight and dbias in one launch (fixed order, so results are deterministic). PLAIN_W (host-chosen):
// weights given, gamma not zero-centred.
//   norm_bwd_staged (sm_90): x and dy of the next groups of rows arrive by bulk copies into a ring of
//     shared-memory stages (common/bulk.cuh) while the block works on the current one; the row
//     reduction's barrier also frees the stage for its refill. The statistics of the next row are
//     loaded one iteration ahead. MIN_BLOCKS: the occupancy asked of ptxas (swept; 0 = default wins).
//     CLUSTER > 1 (launched with a cluster attribute): the CTAs of a cluster add their partial rows
//     through distributed shared memory before writing one (write_cluster_partials).
//   norm_bwd_staged_pair (sm_90, where cuda_norms.TUNED_PAIR names the shape: N = 16384 in bf16 /
//     fp16): each row split over a cluster of two CTAs, the row sums exchanged through distributed
//     shared memory.
//   norm_bwd (any GPU, or unaligned pointers): loads straight to registers.
//   All keep the accumulators in registers (dbias in shared memory when a thread owns 32+ columns).
// Bytes: read x, dy, write dx = 6MN, plus P x N x 4 partials (P = resident row slots).
// Long rows use norm_bwd_looped: one row at a time per block, the block's partial row kept in global
// memory (read-modify-write, exclusive to the block): correct for any N, not bandwidth-optimal.
//
// Numerics: fp32 accumulation everywhere; rstd = rsqrt(var + eps); weights in fp32 or the input dtype,
// g = w + 1 when zero_centered_gamma. Variants measured and dropped (docs/perf_notes.rst): persistent
// forward with a register double buffer, a staged (bulk-copy) forward, a one-round Welford merge for
// LayerNorm statistics, deeper staging rings, a staged backward that re-reads x and dy from the stage
// for dx (registers freed for a third stage at N = 16384: 0.70 of copy against 0.76).
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"
#include "common/bulk.cuh"
#include "common/fp8.cuh"
#include "common/cluster.cuh"
#include "common/griddep.cuh"

// Switches of two host-chosen template flags, for A/B runs (tools/ab_nvrtc_options.py; 1 = shipped):
// FK_FULL_ROWS = 0 keeps the per-vector bounds tests where FULL says the row code is filled exactly;
// FK_FP8_FWD_PREFETCH = 0 turns off the L2 prefetch that PREFETCH asks of norm_fwd_fp8.
#ifndef FK_FULL_ROWS
#define FK_FULL_ROWS 1
#endif
#ifndef FK_FP8_FWD_PREFETCH
#define FK_FP8_FWD_PREFETCH 1
#endif
// Experiment (0 = shipped): L1 eviction priorities in the register forwards (plain and FP8). Bit 1: the
// weights (gamma, beta) load with L1::evict_last; bit 2: the row (x, residual) with L1::no_allocate
// (common/vec.cuh load_vec_l1). Why it was written: Nsight Compute of RMSNorm 16384 x 8192 reads an L1 hit
// rate of 33 % for ours against 49 % for torch.compile's kernel, on the H200 and the H100 alike
// (ncu_rms8192_H200_2026-12-07T1300Z.txt, ncu_rms8192_H100_2026-12-07T1650Z.txt), read then as a third of our
// weight loads missing. The ratios say otherwise if the stores count as misses (they fit it exactly): ours is
// x (miss), w (hit), y (miss) = 1/3, so every weight load hits already; torch.compile's two-pass kernel
// re-reads x from L1 (x, x again, w, y: 2/4). H100 A/B (ab_norm_l1_H100_2026-12-07T1515Z.json): bit 2 costs a
// point on every plain forward and on RMSNorm -> FP8 and gains 5 on LayerNorm -> FP8 at 8192 (its persistent
// prefetching kernel); bit 1 adds nothing. The H200 A/B of that one case decides whether it stays. Bit 3
// (4): bit 2 in the prefetching FP8 forwards alone (the kernels whose rows the L2 already holds), the
// plain forwards as shipped.
// A/B: AB_OPTIONS="-DFK_NORM_L1=2;-DFK_NORM_L1=4" AB_OPS=norm AB_PEERS=1
// tools/ab_nvrtc_options.py.
#ifndef FK_NORM_L1
#define FK_NORM_L1 0
#endif

namespace fk {

template <int WARPS>
struct RowsPerBlock {
  static constexpr int value = WARPS < 4 ? 4 / WARPS : 1;
};

// gamma (g = w, or w + 1 with zero_centered_gamma; 1 without weights) and beta of one vector of columns,
// in fp32, from one vector load each (the weights are shared by all rows and stay in L1/L2).
// One vector of a forward's weights (FK_NORM_L1 bit 1: evict_last in L1).
template <typename W, int VEC>
__device__ __forceinline__ Vec<W, VEC> load_weight_vec(const W* p) {
  if constexpr ((FK_NORM_L1 & 1) != 0) return load_vec_l1<true, W, VEC>(p);
  else return load_vec<W, VEC>(p);
}

template <typename W, int VEC>
__device__ __forceinline__ void load_gamma(const W* w, int v, int zero_centered, float (&g)[VEC]) {
  if (w == nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = 1.f;
    return;
  }
  const Vec<W, VEC> t = load_weight_vec<W, VEC>(w + (long long)v * VEC);
  const float add = zero_centered ? 1.f : 0.f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) g[j] = to_float(t.v[j]) + add;
}
template <typename W, int VEC>
__device__ __forceinline__ void load_beta(const W* b, int v, float (&beta)[VEC]) {
  if (b == nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) beta[j] = 0.f;
    return;
  }
  const Vec<W, VEC> t = load_weight_vec<W, VEC>(b + (long long)v * VEC);
#pragma unroll
  for (int j = 0; j < VEC; ++j) beta[j] = to_float(t.v[j]);
}

// Output policies of the forward. The row code (normalize_row, looped_row) is written once; each kernel
// picks a policy, and the row code branches on it (if constexpr) only where the results are stored:
//   PlainOut<O>: round to O and store (norm_fwd, norm_fwd_looped); no state.
//   Fp8Out<F>:   sat(v * scale) to FP8 bytes, |v| merged into the thread's amax (the *_fp8 kernels).
// The plain branch is the store code as it was before the FP8 variants existed, so the plain kernels'
// machine code did not change (the sm_90a .text sections compare equal). A put() called by both policies
// was tried first: ptxas then schedules 10-14 plain instantiations differently (values computed before
// the conversions), so the plain store stays written out in the row code.
template <typename O>
struct PlainOut {
  using Store = O;
  static constexpr bool kFp8 = false;
  struct State {};
};
template <typename F>
struct Fp8Out {
  using Store = unsigned char;
  static constexpr bool kFp8 = true;
  struct State {
    float scale, amax;
  };
  template <int VEC>
  static __device__ __forceinline__ void put(unsigned char* __restrict__ y, const float (&v)[VEC], State& s) {
    store_fp8_vec<F, VEC>(y, v, s.scale, s.amax);
  }
};

// ---------------------------------------------------------------------------------------------------
// Forward, row in registers.

// Loads this thread's vectors of `row` (x, plus residual -> also stores h = x + residual).
// FULL (a kernel template flag, chosen by the host): N == ITEMS * T_ROW * VEC, every vector slot of the
// thread holds a column, so the per-vector bounds tests go (A/B 2110Z: plain LayerNorm forward +2 %,
// LayerNorm -> FP8 +3-4 % at 4096 and 8192).
// One vector of a row: no L1 allocation (FK_NORM_L1 bit 2, or NO_L1) or the compiler's read-only load.
// (Plain ld.global instead, torch.compile's load form, tied on the H100 and the H200 and was removed:
// ab_pieces_ldg_coherent_H200_2026-12-06T2335Z.json.)
template <typename T, int VEC, bool NO_L1 = false>
__device__ __forceinline__ Vec<T, VEC> load_row_vec(const T* p) {
  if constexpr ((FK_NORM_L1 & 2) != 0 || NO_L1) return load_vec_l1<false, T, VEC>(p);
  else return load_vec<T, VEC>(p);
}

template <typename T, int VEC, int ITEMS, int T_ROW, bool FULL = false, bool NO_L1 = false>
__device__ __forceinline__ void load_row(Vec<T, VEC> (&raw)[ITEMS], const T* __restrict__ x,
                                         const T* __restrict__ residual, T* __restrict__ sum_out,
                                         long long row, bool row_ok, int N) {
  const int nvec = N / VEC;
  const long long base = row * (long long)N;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (row_ok && ((FULL && FK_FULL_ROWS) || v < nvec)) {
      raw[i] = load_row_vec<T, VEC, NO_L1>(x + base + (long long)v * VEC);
      if (residual != nullptr) {
        const Vec<T, VEC> r = load_row_vec<T, VEC, NO_L1>(residual + base + (long long)v * VEC);
        Vec<T, VEC> h;
#pragma unroll
        for (int j = 0; j < VEC; ++j) h.v[j] = from_float<T>(vec_elem(raw[i], j) + vec_elem(r, j));
        raw[i] = h;
        store_vec<T, VEC>(sum_out + base + (long long)v * VEC, h);
      }
    } else {
      vec_zero(raw[i]);
    }
  }
}

// The output of one row held in registers: y = (x - mean) * rstd * g + beta, stored by the OUT policy.
// PLAIN_W (a kernel template flag, chosen by the host): weights given (and a bias for LayerNorm), no
// zero-centred gamma: g and beta come straight from their vector loads. Otherwise load_gamma /
// load_beta supply the defaults (1, 0) and the + 1: their default values, null tests and adds cost
// about 3 instructions per element in the SASS, which the common case no longer carries. (A uniform
// branch per row instead of the flag made ptxas spill in the FP8 kernels under their register caps.)
template <bool PLAIN_W, typename T, typename W, typename OUT, int VEC, int ITEMS, int WARPS, bool RMS,
          bool FULL = false>
__device__ __forceinline__ void store_row(const Vec<T, VEC> (&raw)[ITEMS], const W* __restrict__ w,
                                          const W* __restrict__ b, typename OUT::Store* __restrict__ y,
                                          typename OUT::State& st, int nvec, float mean, float rstd,
                                          int zero_centered) {
  using O = typename OUT::Store;
  constexpr int T_ROW = 32 * WARPS;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if ((FULL && FK_FULL_ROWS) || v < nvec) {
      float g[VEC], beta[VEC];
      if constexpr (PLAIN_W) {
        const Vec<W, VEC> tw = load_weight_vec<W, VEC>(w + (long long)v * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) g[j] = vec_elem(tw, j);
        if constexpr (RMS) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) beta[j] = 0.f;
        } else {
          const Vec<W, VEC> tb = load_weight_vec<W, VEC>(b + (long long)v * VEC);
#pragma unroll
          for (int j = 0; j < VEC; ++j) beta[j] = vec_elem(tb, j);
        }
      } else {
        load_gamma<W, VEC>(w, v, zero_centered, g);
        load_beta<W, VEC>(RMS ? nullptr : b, v, beta);
      }
      if constexpr (OUT::kFp8) {
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = (vec_elem(raw[i], j) - mean) * rstd * g[j] + beta[j];
        OUT::template put<VEC>(y + (long long)v * VEC, o, st);
      } else {
        Vec<O, VEC> out;
#pragma unroll
        for (int j = 0; j < VEC; ++j) out.v[j] = from_float<O>((vec_elem(raw[i], j) - mean) * rstd * g[j] + beta[j]);
        store_vec<O, VEC>(y + (long long)v * VEC, out);
      }
    }
  }
}

// Statistics and output of one row held in registers (all threads of the block call it: barriers).
template <typename T, typename W, typename OUT, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W,
          bool FULL = false>
__device__ __forceinline__ void normalize_row(const Vec<T, VEC> (&raw)[ITEMS], const W* __restrict__ w,
                                              const W* __restrict__ b, typename OUT::Store* __restrict__ y,
                                              typename OUT::State& st, float* __restrict__ mean_out,
                                              float* __restrict__ rstd_out, long long row, bool row_ok, int N,
                                              float eps, int zero_centered, int& parity) {
  constexpr int T_ROW = 32 * WARPS;
  const int nvec = N / VEC;
  const float inv_n = 1.f / (float)N;
  // LayerNorm: exact two-pass statistics from registers (mean, then sum((x - mean)^2)). A one-round
  // Chan/Welford merge across the row was measured 20-40% slower (sweep 1601Z): its merges are serial.
  // Per-thread two-pass states merged across the row with one barrier (Chan, equal counts) lost 1-3.5
  // points on the FP8 forward and tied on the plain one (H100, ab_nvrtc_options_H100_2026-12-06T0835Z):
  // the second barrier is not what the FP8 LayerNorm waits on. Nor the adds' dependency chains: the sums
  // in 4 interleaved accumulators per thread measured the same to 0.002 on every FP8 and plain shape
  // (H100, ab_nvrtc_options_H100_2026-12-06T1056Z).
  float mean = 0.f;
  if constexpr (!RMS) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += vec_elem(raw[i], j);
    mean = row_sum_alternating<WARPS>(s, parity) * inv_n;
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if ((FULL && FK_FULL_ROWS) || threadIdx.x + i * T_ROW < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = vec_elem(raw[i], j) - mean;
        ss += d * d;
      }
    }
  }
  const float rstd = rsqrtf(row_sum_alternating<WARPS>(ss, parity) * inv_n + eps);
  if (!row_ok) return;
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
  const long long base = row * (long long)N;
  store_row<PLAIN_W, T, W, OUT, VEC, ITEMS, WARPS, RMS, FULL>(raw, w, b, y + base, st, nvec, mean, rstd,
                                                              zero_centered);
}

// One group of RPB rows per block, non-persistent grid, plain loads: the load latency is hidden by the
// many resident blocks (one register buffer each) rather than by a prefetch inside a block. MIN_BLOCKS:
// the resident blocks per SM asked of ptxas (a tuned config's fifth field; swept: LayerNorm 16384 reads
// 0.94 of copy at 3 x 512 threads (40 registers) against 0.91 at ptxas's own 56 registers, 2 blocks).
template <typename T, typename W, typename O, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W,
          int MIN_BLOCKS = 1, bool FULL = false>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value, MIN_BLOCKS)
norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
                const W* __restrict__ b, O* __restrict__ y, T* __restrict__ sum_out,
                float* __restrict__ mean_out, float* __restrict__ rstd_out, long long M, int N, float eps,
                int zero_centered) {
  const long long row = (long long)blockIdx.x * RowsPerBlock<WARPS>::value + threadIdx.y;
  Vec<T, VEC> a[ITEMS];
  load_row<T, VEC, ITEMS, 32 * WARPS, FULL>(a, x, residual, sum_out, row, row < M, N);
  typename PlainOut<O>::State st;
  int parity = 0;
  normalize_row<T, W, PlainOut<O>, VEC, ITEMS, WARPS, RMS, PLAIN_W, FULL>(a, w, b, y, st, mean_out, rstd_out, row,
                                                                       row < M, N, eps, zero_centered, parity);
}

// Occupancy hint of the FP8 forward. The FP8 cast and the amax take a few registers more than the plain
// store, and without a hint ptxas lets 512-thread blocks grow to 65-72 registers (1 resident block per
// SM instead of 2) and 256-thread RMS blocks to 44-47 (5 instead of 6). The hint caps the registers at
// about what the plain kernels use for the same row bytes per thread (measured with -Xptxas=-v), plus
// what the grid-stride loop keeps live: <= 16 B of row: 40, <= 32 B: 48 (RMS) / 56 (LayerNorm: gamma and
// beta), <= 64 B: 64, each 8 more with fp32 weights; longer register rows keep the plain hint (1 block).
// No instantiation spills under these caps (compile-all check; 8 fewer spilled up to 40 bytes).
template <typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS>
struct Fp8FwdMinBlocks {
  static constexpr int threads = 32 * WARPS * RowsPerBlock<WARPS>::value;
  static constexpr int row_bytes = ITEMS * VEC * (int)sizeof(T);
  static constexpr int w_regs = sizeof(W) == 4 ? 8 : 0;  // fp32 gamma / beta: twice the load registers
  static constexpr int regs = row_bytes <= 16 ? 40 + w_regs : row_bytes <= 32 ? (RMS ? 48 : 56) + w_regs
                            : row_bytes <= 64 ? 64 + w_regs : 0;
  static constexpr int fit = regs ? 65536 / (regs * threads) : 1;
  static constexpr int value = fit < 1 ? 1 : (fit > 2048 / threads ? 2048 / threads : fit);
};

// The same with FP8 output (F = E4M3 / E5M2): y bytes = sat(y * *scale_in); amax of the fp32 y merged
// into *amax_out; scale_inv written by block 0. Launched with at least one block (M = 0 included).
// PERSISTENT: the blocks walk the row groups grid-stride and merge the amax once per block (a barrier,
// an L2 read and maybe an atomic); the loop costs registers (63 against the plain forward's 48 for
// <bf16, 8, 4, 4>, so 8 blocks of 128 threads per SM instead of 10). Otherwise one row group per block
// (grid = the groups, as norm_fwd; 48 registers) and the amax merged per warp, without a barrier
// (warp_amax_merge). cuda_norms.FWD_FP8_WAVES picks (None: one group per block).
template <typename T, typename W, typename F, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W,
          bool PERSISTENT = true, bool FULL = false, bool PREFETCH = false>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value,
                                  (Fp8FwdMinBlocks<T, W, VEC, ITEMS, WARPS, RMS>::value))
norm_fwd_fp8(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
             const W* __restrict__ b, unsigned char* __restrict__ y, T* __restrict__ sum_out,
             float* __restrict__ mean_out, float* __restrict__ rstd_out, const float* __restrict__ scale_in,
             float* __restrict__ scale_inv_out, float* __restrict__ amax_out, long long M, int N, float eps,
             int zero_centered) {
  typename Fp8Out<F>::State st{*scale_in, 0.f};
  const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x;  // 2-D block: flat index for the amax merge
  if (blockIdx.x == 0 && tid == 0) scale_inv_out[0] = __fdiv_rn(1.f, st.scale);
  constexpr int RPB = RowsPerBlock<WARPS>::value;
  int parity = 0;  // of the row sums' shared buffers, carried across row groups
  if constexpr (!PERSISTENT) {
    const long long row = (long long)blockIdx.x * RPB + threadIdx.y;
    Vec<T, VEC> a[ITEMS];
    load_row<T, VEC, ITEMS, 32 * WARPS, FULL>(a, x, residual, sum_out, row, row < M, N);
    normalize_row<T, W, Fp8Out<F>, VEC, ITEMS, WARPS, RMS, PLAIN_W, FULL>(a, w, b, y, st, mean_out, rstd_out, row,
                                                                           row < M, N, eps, zero_centered, parity);
    warp_amax_merge(st.amax, amax_out);
    return;
  }
  // Grid-stride over groups of RPB rows (block-uniform trip count: every thread reaches the barriers).
  // A grid smaller than the groups merges the amax once per block instead of once per row group (the
  // barrier, the L2 read and the atomic at the end of every block cost a block's slot about a
  // microsecond each time).
  const int groups = (int)((M + RPB - 1) / RPB);  // < 2^31 (checked by the launcher)
  for (int g = blockIdx.x; g < groups; g += gridDim.x) {
    if constexpr (PREFETCH && FK_FP8_FWD_PREFETCH) {
      // PREFETCH (LayerNorm; chosen by the host): the block's next row group fetched into L2 while this
      // one is loaded, reduced twice and written, so its loads wait for L2 rather than DRAM. A/B 2110Z
      // (3 interleaved rounds): LayerNorm -> FP8 0.839 / 0.806 / 0.770 -> 0.848 / 0.835 / 0.840 of copy
      // at 4096 / 8192 / 14336; RMSNorm -> FP8 lost 0-7 % with it (one row sum: less to hide) and
      // goes without. Two groups ahead lost 14-15 points (H100 2026-12-06, 3 rounds: 0.868 -> 0.731 at
      // 8192, 0.900 -> 0.750 at 14336; ab_nvrtc_options_H100_2026-12-06T0818Z.json).
      const auto prefetch_rows = [&](long long r0) {  // the row group starting at row r0
        const unsigned bytes = (unsigned)((M - r0 < RPB ? M - r0 : RPB) * N * (long long)sizeof(T));
        if (((reinterpret_cast<unsigned long long>(x) | (unsigned long long)N * sizeof(T)) & 15) == 0) {
          bulk_prefetch_l2(x + r0 * N, bytes);
          if (residual != nullptr && (reinterpret_cast<unsigned long long>(residual) & 15) == 0)
            bulk_prefetch_l2(residual + r0 * N, bytes);
        }
      };
      if (tid == 0 && g + (int)gridDim.x < groups) prefetch_rows((long long)(g + gridDim.x) * RPB);
    }
    const long long row = (long long)g * RPB + threadIdx.y;
    Vec<T, VEC> a[ITEMS];
    load_row<T, VEC, ITEMS, 32 * WARPS, FULL, PREFETCH && (FK_NORM_L1 & 4) != 0>(a, x, residual, sum_out, row,
                                                                                row < M, N);
    normalize_row<T, W, Fp8Out<F>, VEC, ITEMS, WARPS, RMS, PLAIN_W, FULL>(a, w, b, y, st, mean_out, rstd_out, row,
                                                                           row < M, N, eps, zero_centered, parity);
  }
  block_amax_merge_flat(st.amax, amax_out, tid, blockDim.x * blockDim.y);
}

// ---------------------------------------------------------------------------------------------------
// Forward, long rows: one row per block (1-D block of THREADS), two passes over global memory.
// looped_row: the row `row` of the block (every thread of the block calls it: barriers).
template <typename T, typename W, typename OUT, int VEC, bool RMS>
__device__ __forceinline__ void looped_row(const T* __restrict__ x, const T* __restrict__ residual,
                                           const W* __restrict__ w, const W* __restrict__ b,
                                           typename OUT::Store* __restrict__ y, T* sum_out,  // no restrict: re-read
                                           float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                           typename OUT::State& st, long long row, int N, float eps,
                                           int zero_centered) {
  using O = typename OUT::Store;
  const long long base = row * (long long)N;
  const int nvec = N / VEC;
  // With a residual, pass 1 writes x + residual to sum_out and pass 2 reads it back from there.
  const T* src = residual != nullptr ? sum_out : x;
  Welford acc = {0.f, 0.f, 0.f};
  float ss = 0.f;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    Vec<T, VEC> a = load_vec<T, VEC>(x + base + (long long)v * VEC);
    if (residual != nullptr) {
      const Vec<T, VEC> r = load_vec<T, VEC>(residual + base + (long long)v * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) a.v[j] = from_float<T>(vec_elem(a, j) + vec_elem(r, j));
      store_vec<T, VEC>(sum_out + base + (long long)v * VEC, a);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = vec_elem(a, j);
      if constexpr (RMS) {
        ss += f * f;
      } else {
        acc.n += 1.f;
        const float d = f - acc.mean;
        acc.mean += d / acc.n;
        acc.m2 += d * (f - acc.mean);
      }
    }
  }
  float mean = 0.f, var;
  if constexpr (RMS) {
    var = block_sum2(ss, 0.f).x / (float)N;
  } else {
    const Welford t = block_welford(acc);
    mean = t.mean;
    var = t.m2 / (float)N;
  }
  const float rstd = rsqrtf(var + eps);
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    const Vec<T, VEC> a = load_vec<T, VEC>(src + base + (long long)v * VEC);
    float g[VEC], beta[VEC];
    load_gamma<W, VEC>(w, v, zero_centered, g);
    load_beta<W, VEC>(RMS ? nullptr : b, v, beta);
    if constexpr (OUT::kFp8) {
      float o[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = (vec_elem(a, j) - mean) * rstd * g[j] + beta[j];
      OUT::template put<VEC>(y + base + (long long)v * VEC, o, st);
    } else {
      Vec<O, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out.v[j] = from_float<O>((vec_elem(a, j) - mean) * rstd * g[j] + beta[j]);
      store_vec<O, VEC>(y + base + (long long)v * VEC, out);
    }
  }
}

template <typename T, typename W, typename O, int VEC, bool RMS>
__global__ void __launch_bounds__(1024)
norm_fwd_looped(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
                const W* __restrict__ b, O* __restrict__ y, T* sum_out,  // no restrict: re-read
                float* __restrict__ mean_out, float* __restrict__ rstd_out, long long M, int N,
                float eps, int zero_centered) {
  typename PlainOut<O>::State st;
  looped_row<T, W, PlainOut<O>, VEC, RMS>(x, residual, w, b, y, sum_out, mean_out, rstd_out, st, blockIdx.x, N,
                                          eps, zero_centered);
}

// FP8 output (see norm_fwd_fp8). Grid max(1, M): with M = 0 one block writes scale_inv only.
template <typename T, typename W, typename F, int VEC, bool RMS>
__global__ void __launch_bounds__(1024)
norm_fwd_looped_fp8(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
                    const W* __restrict__ b, unsigned char* __restrict__ y, T* sum_out,
                    float* __restrict__ mean_out, float* __restrict__ rstd_out, const float* __restrict__ scale_in,
                    float* __restrict__ scale_inv_out, float* __restrict__ amax_out, long long M, int N,
                    float eps, int zero_centered) {
  typename Fp8Out<F>::State st{*scale_in, 0.f};
  if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv_out[0] = __fdiv_rn(1.f, st.scale);
  if (blockIdx.x < M)  // block-uniform: the barriers inside are reached by the whole block or by none
    looped_row<T, W, Fp8Out<F>, VEC, RMS>(x, residual, w, b, y, sum_out, mean_out, rstd_out, st, blockIdx.x, N,
                                          eps, zero_centered);
  block_amax_merge(st.amax, amax_out);
}

// ---------------------------------------------------------------------------------------------------
// Backward, row in registers, persistent grid with per-thread dweight / dbias accumulators.

// LayerNorm with 32+ columns per thread: dweight + dbias accumulators plus the row would exceed 128
// registers and spill, so dbias accumulates in shared memory (RPB x N floats, dynamic; each thread
// touches only its own columns, so no barriers). Python's bwd_smem_bytes mirrors this condition.
template <int VEC, int ITEMS, bool RMS>
struct DbiasInSmem {
  static constexpr bool value = !RMS && ITEMS * VEC >= 32;
};

// A thread's dweight / dbias accumulators: fp32 registers, dbias in its own columns of a shared memory
// row instead where DB_S (DbiasInSmem; each thread touches only its own columns, so no barriers).
template <int VEC, int ITEMS, bool DB_S>
struct Accumulators {
  float dw[ITEMS][VEC], db[ITEMS][VEC];
  float* db_s;

  template <int T_ROW>
  __device__ __forceinline__ void zero(int nvec) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dw[i][j] = db[i][j] = 0.f;
        if (DB_S && v < nvec) db_s[v * VEC + j] = 0.f;
      }
    }
  }
  // Adds d * xhat and d for vector i (columns v * VEC ...).
  __device__ __forceinline__ void add(int i, int v, const float (&dxh)[VEC], const float (&d)[VEC], bool with_db) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[i][j] += dxh[j];
    if (!with_db) return;
    if constexpr (DB_S) {
      Vec<float, VEC> t = *reinterpret_cast<Vec<float, VEC>*>(db_s + v * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) t.v[j] += d[j];
      *reinterpret_cast<Vec<float, VEC>*>(db_s + v * VEC) = t;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) db[i][j] += d[j];
    }
  }
  // This thread's columns of dweight / dbias into shared-memory rows (the cluster merge below; a null
  // row is skipped). write() below does the same into a global partial row; folding either into the
  // other changed the SASS of most backward kernels (212 of 252 cluster kernels, 63 of 159 others), so
  // they stay two until a GPU A/B says the merged form costs nothing.
  template <int T_ROW>
  __device__ __forceinline__ void stage(float* dw_row, float* db_row, int N) const {
    const int nvec = N / VEC;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (v < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if (dw_row != nullptr) dw_row[v * VEC + j] = dw[i][j];
          if (db_row != nullptr) db_row[v * VEC + j] = DB_S ? db_s[v * VEC + j] : db[i][j];
        }
      }
    }
  }
  // One fp32 partial row of dweight / dbias per (block, row slot) p; column_sum adds them.
  template <int T_ROW>
  __device__ __forceinline__ void write(float* __restrict__ dw_part, float* __restrict__ db_part, long long p,
                                        int N) const {
    const int nvec = N / VEC;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (v < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const long long idx = p * N + v * VEC + j;
          if (dw_part != nullptr) dw_part[idx] = dw[i][j];
          if (db_part != nullptr) db_part[idx] = DB_S ? db_s[v * VEC + j] : db[i][j];
        }
      }
    }
  }
};

// gamma of vector i (columns v * VEC ...) in fp32 for the backward. PLAIN_W (weights given, gamma not
// zero-centred; a kernel template flag chosen by the host): from gw, the thread's weight vectors loaded
// once per block into registers (bwd_load_weights), so no row reloads them through L1 / L2; else
// load_gamma with its defaults and the + 1. (Reloading the PLAIN_W vectors per row instead was 1.5-9 %
// slower at every benchmark shape: A/B of 2026-12-03, docs/perf_notes.rst.)
template <bool PLAIN_W, typename W, int VEC, int ITEMS>
__device__ __forceinline__ void bwd_gamma(const Vec<W, VEC> (&gw)[ITEMS], int i, const W* __restrict__ w, int v,
                                          int zero_centered, float (&g)[VEC]) {
  if constexpr (PLAIN_W) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = vec_elem(gw[i], j);
  } else {
    load_gamma<W, VEC>(w, v, zero_centered, g);
  }
}

template <bool PLAIN_W, typename W, int VEC, int ITEMS, int T_ROW>
__device__ __forceinline__ void bwd_load_weights(Vec<W, VEC> (&gw)[ITEMS], const W* __restrict__ w, int N) {
  if constexpr (PLAIN_W) {
    const int nvec = N / VEC;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (v < nvec) {
        gw[i] = load_vec<W, VEC>(w + (long long)v * VEC);
      } else {
        vec_zero(gw[i]);
      }
    }
  }
}

// The backward of one row held in registers (xr = x, gr = dy), in two halves around the row reduction:
//   backward_sums: accumulates dweight += dy * xhat and dbias += dy for the thread's columns and returns
//     its part of (sum g*dy*xhat, sum g*dy);
//   backward_dx: dx = rstd * (g*dy - xhat*c1 - c2) (c1, c2: the row sums over N; c2 = 0 for RMS),
//     written as rstd * fma(x - mean, -rstd c1, g*dy - c2): per element an unpack of x, dy and gamma
//     each, a subtraction, a multiply, a subtraction (LayerNorm), an FMA and a multiply. (Distributing
//     rstd into the terms saves one more but loses exact zeros: N = 1 gave |dx| ~ 1e-5 instead of 0; so
//     does an FMA-contracted g*dy - c2, hence __fmul_rn for g*dy in both halves.)
// The kernels put the reduction between them (row_sum2_alternating: one block barrier per row, which
// also frees the row's shared-memory stage in the staged kernel).
template <bool PLAIN_W, typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS, typename Acc>
__device__ __forceinline__ float2 backward_sums(const Vec<T, VEC> (&xr)[ITEMS], const Vec<T, VEC> (&gr)[ITEMS],
                                                const Vec<W, VEC> (&gw)[ITEMS], const W* __restrict__ w,
                                                float mean, float rstd, Acc& acc, int N, int zero_centered) {
  constexpr int T_ROW = 32 * WARPS;
  const int nvec = N / VEC;
  float s_gdx = 0.f, s_gd = 0.f;  // sum g*dy*xhat, sum g*dy
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (v < nvec) {
      float g[VEC], d[VEC], dxh[VEC];
      bwd_gamma<PLAIN_W, W, VEC, ITEMS>(gw, i, w, v, zero_centered, g);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (vec_elem(xr[i], j) - mean) * rstd;
        d[j] = vec_elem(gr[i], j);
        const float gd = __fmul_rn(d[j], g[j]);  // rounded as backward_dx rounds it (exact dx = 0 at N = 1)
        s_gdx += gd * xhat;
        s_gd += gd;
        dxh[j] = d[j] * xhat;
      }
      acc.add(i, v, dxh, d, !RMS);
    }
  }
  return make_float2(s_gdx, s_gd);
}

// dx of `ncols` columns (the thread's vectors of them, as in backward_sums) written from dx_row; inv_n
// is 1 / the full row length (norm_bwd_staged_pair: each CTA of the pair holds half of the row).
// WORD_STORES: 16-byte vectors through store_floats16 (norm_bwd_staged_pair, where NVVM split the Vec
// store into 2- and 4-byte stores: 5.7x the store instructions, 0.35 of copy; the other kernels get
// STG.E.128 from the Vec store, and store_floats there was 1-2 % slower, sweep 223551Z).
template <bool PLAIN_W, typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS, bool WORD_STORES = false>
__device__ __forceinline__ void backward_dx_cols(const Vec<T, VEC> (&xr)[ITEMS], const Vec<T, VEC> (&gr)[ITEMS],
                                                 const Vec<W, VEC> (&gw)[ITEMS], const W* __restrict__ w,
                                                 float mean, float rstd, float2 sums, T* __restrict__ dx_row,
                                                 int ncols, float inv_n, int zero_centered) {
  constexpr int T_ROW = 32 * WARPS;
  const int nvec = ncols / VEC;
  const float c1 = sums.x * inv_n, c2 = RMS ? 0.f : sums.y * inv_n;
  const float k1 = -rstd * c1;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (v < nvec) {
      float g[VEC];
      bwd_gamma<PLAIN_W, W, VEC, ITEMS>(gw, i, w, v, zero_centered, g);
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xm = vec_elem(xr[i], j) - mean;
        const float gd = __fmul_rn(vec_elem(gr[i], j), g[j]);  // as in backward_sums: not contracted
        out[j] = rstd * fmaf(xm, k1, RMS ? gd : gd - c2);
      }
      if constexpr (WORD_STORES) {
        store_floats<T, VEC>(dx_row + (long long)v * VEC, out);
      } else {
        Vec<T, VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = from_float<T>(out[j]);
        store_vec<T, VEC>(dx_row + (long long)v * VEC, o);
      }
    }
  }
}

template <bool PLAIN_W, typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS>
__device__ __forceinline__ void backward_dx(const Vec<T, VEC> (&xr)[ITEMS], const Vec<T, VEC> (&gr)[ITEMS],
                                            const Vec<W, VEC> (&gw)[ITEMS], const W* __restrict__ w,
                                            float mean, float rstd, float2 sums, T* __restrict__ dx,
                                            long long row, int N, int zero_centered) {
  backward_dx_cols<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, w, mean, rstd, sums, dx + row * (long long)N,
                                                          N, 1.f / (float)N, zero_centered);
}

// Register rows (any GPU, or pointers not 16-byte aligned): loads straight to registers.
template <typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value)
norm_bwd(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
         const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
         float* __restrict__ dw_part, float* __restrict__ db_part, long long M, int N,
         int zero_centered) {
  griddep_launch_dependents();  // column_sum, launched as a dependent, waits for the partial rows
  constexpr int RPB = RowsPerBlock<WARPS>::value;
  constexpr int T_ROW = 32 * WARPS;
  extern __shared__ float dyn_smem[];
  Accumulators<VEC, ITEMS, DbiasInSmem<VEC, ITEMS, RMS>::value> acc;
  acc.db_s = dyn_smem + threadIdx.y * N;
  const int nvec = N / VEC;
  acc.template zero<T_ROW>(nvec);
  Vec<W, VEC> gw[ITEMS];
  bwd_load_weights<PLAIN_W, W, VEC, ITEMS, T_ROW>(gw, w, N);
  int flip = 0;
  for (long long row0 = (long long)blockIdx.x * RPB; row0 < M; row0 += (long long)gridDim.x * RPB, flip ^= 1) {
    const long long row = row0 + threadIdx.y;
    const bool row_ok = row < M;
    const long long base = row * (long long)N;
    Vec<T, VEC> xr[ITEMS], gr[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (row_ok && v < nvec) {
        xr[i] = load_vec_stream<T, VEC>(x + base + (long long)v * VEC);
        gr[i] = load_vec_stream<T, VEC>(dy + base + (long long)v * VEC);
      } else {
        vec_zero(xr[i]);
        vec_zero(gr[i]);
      }
    }
    const float mean = (RMS || !row_ok) ? 0.f : mean_in[row];
    const float rstd = row_ok ? rstd_in[row] : 0.f;
    const float2 part = backward_sums<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, w, mean, rstd, acc, N, zero_centered);
    const float2 sums = row_sum2_alternating<WARPS, false>(part.x, part.y, flip);
    if (row_ok) backward_dx<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, w, mean, rstd, sums, dx, row, N, zero_centered);
  }
  acc.template write<T_ROW>(dw_part, RMS ? nullptr : db_part, (long long)blockIdx.x * RPB + threadIdx.y, N);
}

// ---------------------------------------------------------------------------------------------------
// Staged variants (sm_90): the same row math, with rows arriving through a ring of shared-memory stages
// filled by bulk copies (common/bulk.cuh). A stage holds one group of RPB consecutive rows (one
// contiguous copy per input). Persistent grid: block b takes groups b, b + grid, ...; `stages` groups
// are in flight per block. Needs N * sizeof(T) and the input pointers 16-byte aligned (checked in
// Python). Shared memory: stages x inputs x RPB x N x sizeof(T) (+ the dbias rows of DbiasInSmem).

// Issues the bulk copies of the k-th group of this block into stage s = k % stages (producer only).
template <typename T, int RPB>
__device__ __forceinline__ void issue_group(const StageRing& ring, T* ring_base, const T* a, const T* b,
                                            int k, int s, long long M, int N) {
  const long long g = blockIdx.x + (long long)k * gridDim.x;
  if (g * RPB >= M) return;
  const long long r0 = g * RPB, group = (long long)RPB * N;
  const unsigned bytes = (unsigned)((M - r0 < RPB ? M - r0 : RPB) * N * (long long)sizeof(T));
  T* dst = ring_base + s * (b != nullptr ? 2 : 1) * group;
  ring.expect(s, b != nullptr ? 2 * bytes : bytes);
  bulk_load(dst, a + r0 * N, bytes, ring.bar(s));
  if (b != nullptr) bulk_load(dst + group, b + r0 * N, bytes, ring.bar(s));
}

template <typename T, int VEC, int ITEMS, int T_ROW>
__device__ __forceinline__ void read_stage(Vec<T, VEC> (&raw)[ITEMS], const T* src, bool row_ok, int N) {
  const int nvec = N / VEC;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (row_ok && v < nvec) {
      raw[i] = *reinterpret_cast<const Vec<T, VEC>*>(src + v * VEC);
    } else {
      vec_zero(raw[i]);
    }
  }
}

// The partial rows of a cluster's CTAs added before they leave the SM (norm_bwd_staged with
// CLUSTER > 1, norm_bwd_staged_pair with MERGE > 1): GROUP CTAs hold the same `ncols` columns, ranks
// h, h + STRIDE, ..., h + (GROUP - 1) * STRIDE (h = rank % STRIDE: the staged kernel has one group of
// all its CTAs, STRIDE 1; the pair kernel one group per half row, STRIDE 2). Each CTA stages its RPB
// rows of dweight (and dbias) in its own shared memory (`red`, the ring, idle once the row loop is
// over), a cluster barrier, then the m-th CTA of a group (m = rank / STRIDE) adds slice m of the
// columns over the group's rows (rank order, then row slot: a fixed order, deterministic) from
// distributed shared memory and writes it to the group's output row (dw_row / db_row: at the group's
// first column; null: not wanted). GROUP x RPB times fewer partial rows written here and read by
// column_sum.
template <int VEC, int ITEMS, int T_ROW, int RPB, int GROUP, int STRIDE, class Acc>
__device__ __forceinline__ void write_cluster_partials(const Acc& acc, float* red, float* __restrict__ dw_row,
                                                       float* __restrict__ db_row, int ncols) {
  __syncthreads();  // every thread is past its last read of the ring (and every issued copy landed)
  acc.template stage<T_ROW>(dw_row != nullptr ? red + threadIdx.y * ncols : nullptr,
                            db_row != nullptr ? red + (RPB + threadIdx.y) * ncols : nullptr, ncols);
  cluster_arrive();
  cluster_wait();
  const unsigned rank = cluster_ctarank(), h = rank % STRIDE;
  const int nq = ncols / 4;  // float4 columns (the staged kernels have 16-byte rows: ncols % 4 == 0)
  const int per = (nq + GROUP - 1) / GROUP;
  const int q0 = (int)(rank / STRIDE) * per, q1 = min(nq, q0 + per);
  for (int q = q0 + threadIdx.y * T_ROW + threadIdx.x; q < q1; q += T_ROW * RPB) {
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      float* out = o == 0 ? dw_row : db_row;
      if (out == nullptr) continue;
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int c = 0; c < GROUP; ++c) {
#pragma unroll
        for (int r = 0; r < RPB; ++r) {
          const float4 v = ld_cluster_f4(cluster_map_shared(red + (o * RPB + r) * ncols + 4 * q, h + c * STRIDE));
          s.x += v.x;
          s.y += v.y;
          s.z += v.z;
          s.w += v.w;
        }
      }
      *reinterpret_cast<float4*>(out + 4 * q) = s;
    }
  }
  cluster_arrive();  // no CTA exits while another reads its rows
  cluster_wait();
}

// MIN_BLOCKS: the occupancy asked of ptxas (blocks per SM; 0: 2 for blocks of <= 256 threads, else 1).
// More resident blocks are more rows in work per SM, which is what this latency-bound loop lacks
// (docs/perf_notes.rst); the cap they put on registers must not make ptxas spill (compile-all check).
template <int THREADS, int MIN_BLOCKS>
struct BwdMinBlocks {
  static constexpr int value = MIN_BLOCKS > 0 ? MIN_BLOCKS : (THREADS <= 256 ? 2 : 1);
};

template <typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W, int MIN_BLOCKS,
          int CLUSTER = 1>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value,
                                  (BwdMinBlocks<32 * WARPS * RowsPerBlock<WARPS>::value, MIN_BLOCKS>::value))
norm_bwd_staged(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
                float* __restrict__ dw_part, float* __restrict__ db_part, long long M, int N,
                int zero_centered, int stages) {
  griddep_launch_dependents();  // column_sum, launched as a dependent, waits for the partial rows
  constexpr int RPB = RowsPerBlock<WARPS>::value;
  constexpr int T_ROW = 32 * WARPS;
  __shared__ unsigned long long bars[kMaxStages];
  extern __shared__ __align__(128) unsigned char staged_smem[];
  T* ring_base = reinterpret_cast<T*>(staged_smem);
  const long long ngroups = (M + RPB - 1) / RPB, group = (long long)RPB * N;
  // Accumulators in registers (dbias rows after the ring when DbiasInSmem). Both in shared memory was
  // measured 5-25% slower (sweep 1631Z).
  Accumulators<VEC, ITEMS, DbiasInSmem<VEC, ITEMS, RMS>::value> acc;
  acc.db_s = reinterpret_cast<float*>(ring_base + (long long)stages * 2 * group) + threadIdx.y * N;
  const StageRing ring(bars, stages);
  const bool producer = threadIdx.x == 0 && threadIdx.y == 0;
  const int nvec = N / VEC;
  acc.template zero<T_ROW>(nvec);
  Vec<W, VEC> gw[ITEMS];
  bwd_load_weights<PLAIN_W, W, VEC, ITEMS, T_ROW>(gw, w, N);
  if (producer) ring.init();
  __syncthreads();
  if (producer)
    for (int k = 0; k < stages; ++k) issue_group<T, RPB>(ring, ring_base, x, dy, k, k, M, N);
  // The statistics of the next group are loaded one iteration ahead (their latency is not hidden by
  // the ring).
  long long row = (long long)blockIdx.x * RPB + threadIdx.y;
  float mean = (!RMS && row < M) ? mean_in[row] : 0.f, rstd = row < M ? rstd_in[row] : 0.f;
  int s = 0;
  unsigned phase = 0;
  for (int k = 0; blockIdx.x + (long long)k * gridDim.x < ngroups; ++k, ring.next(s, phase)) {
    const bool row_ok = row < M;
    const long long next = row + (long long)gridDim.x * RPB;
    const float next_mean = (!RMS && next < M) ? mean_in[next] : 0.f;
    const float next_rstd = next < M ? rstd_in[next] : 0.f;
    const T* xs = ring_base + s * 2 * group + threadIdx.y * (long long)N;
    ring.wait(s, phase);
    Vec<T, VEC> xr[ITEMS], gr[ITEMS];
    read_stage<T, VEC, ITEMS, T_ROW>(xr, xs, row_ok, N);
    read_stage<T, VEC, ITEMS, T_ROW>(gr, xs + group, row_ok, N);
    const float2 part = backward_sums<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, w, mean, rstd, acc, N, zero_centered);
    // One barrier per row: the reduction's, after which every thread has read stage s (refill it).
    const float2 sums = row_sum2_alternating<WARPS, true>(part.x, part.y, k & 1);
    if (producer) issue_group<T, RPB>(ring, ring_base, x, dy, k + stages, s, M, N);
    if (row_ok) backward_dx<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, w, mean, rstd, sums, dx, row, N, zero_centered);
    row = next;
    mean = next_mean;
    rstd = next_rstd;
  }
  if constexpr (CLUSTER > 1) {  // 1-D clusters of consecutive blocks: one partial row per cluster
    const long long p = (long long)(blockIdx.x / CLUSTER) * N;
    write_cluster_partials<VEC, ITEMS, T_ROW, RPB, CLUSTER, 1>(acc, reinterpret_cast<float*>(staged_smem),
                                                               dw_part != nullptr ? dw_part + p : nullptr,
                                                               (RMS || db_part == nullptr) ? nullptr : db_part + p, N);
  } else {
    acc.template write<T_ROW>(dw_part, RMS ? nullptr : db_part, (long long)blockIdx.x * RPB + threadIdx.y, N);
  }
}

// Dispatched where cuda_norms.TUNED_PAIR names the shape (N = 16384): each row split over a cluster of two
// CTAs, each holding half the columns (the config of the half-row width, e.g. N = 16384 runs two
// 8192-column CTAs: that kernel reads 0.87 / 0.91 of copy where the 16384 one reads 0.76 / 0.85). Per
// row each CTA reduces its half (one block barrier) and sends its two sums to the peer through a
// ClusterMailbox (st.async into the peer's shared memory, completing the peer's mbarrier); both add the
// two halves' sums and write dx for their columns (backward_dx_cols with WORD_STORES: NVVM split the
// Vec stores of dx into 2- and 4-byte stores here, which held the first runs to 0.28-0.37 of copy,
// sweeps 2219Z / 2228Z; a cluster barrier per row instead of the mailbox also waits for the previous
// row's dx stores, barrier.cluster.arrive.release). PIPE: the local sums of the next
// row are computed before waiting for the peer's sums of this row (two rows in registers). Ring,
// weights and accumulators as norm_bwd_staged over the CTA's columns; one partial row per pair (each
// CTA writes its half), or with MERGE > 1 a cluster of MERGE pairs (2 x MERGE CTAs) that adds its pairs'
// partial rows first (write_cluster_partials) and writes one. Needs N a multiple of 2 x VEC and
// 16-byte aligned pointers. SPLIT = 4: each row over four CTAs (quarters; the cluster is 4 x MERGE
// CTAs), every CTA sending its sums to all four (itself included), each adding the four in rank order
// (the same bits in every CTA).
template <typename T>
__device__ __forceinline__ void issue_row_part(const StageRing& ring, T* ring_base, const T* a, const T* b,
                                               long long row, int s, long long M, int N, int part, int col0) {
  if (row >= M) return;
  const unsigned bytes = (unsigned)(part * sizeof(T));
  T* dst = ring_base + (long long)s * 2 * part;
  ring.expect(s, 2 * bytes);
  bulk_load(dst, a + row * N + col0, bytes, ring.bar(s));
  bulk_load(dst + part, b + row * N + col0, bytes, ring.bar(s));
}

template <typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS, bool PLAIN_W, int MIN_BLOCKS,
          bool PIPE, int MERGE = 1, int SPLIT = 2>
__global__ void FK_CLUSTER_DIMS(SPLIT * MERGE)
    __launch_bounds__(32 * WARPS, (BwdMinBlocks<32 * WARPS, MIN_BLOCKS>::value))
norm_bwd_staged_pair(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                     const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
                     float* __restrict__ dw_part, float* __restrict__ db_part, long long M, int N,
                     int zero_centered, int stages) {
  griddep_launch_dependents();  // column_sum, launched as a dependent, waits for the partial rows
  static_assert(WARPS >= 4, "one row part per block");
  static_assert(SPLIT == 2 || SPLIT == 4, "rows in halves or quarters");
  constexpr int T_ROW = 32 * WARPS;
  __shared__ unsigned long long bars[kMaxStages];
  // (sum g*dy*xhat, sum g*dy) per row: the peer's (SPLIT = 2), or every CTA's of the row by rank
  __shared__ ClusterMailbox<float2, SPLIT == 2 ? 1 : SPLIT, 4> peer_sums;
  extern __shared__ __align__(128) unsigned char staged_smem[];
  T* ring_base = reinterpret_cast<T*>(staged_smem);
  // MERGE groups of SPLIT CTAs per cluster (ranks SPLIT m ... SPLIT m + SPLIT - 1: group m, each sharing
  // its rows); cid: this group's index, ncl: the groups ("pairs" below for SPLIT = 2).
  const unsigned crank = cluster_ctarank(), rank = MERGE == 1 ? crank : crank % SPLIT;
  const long long cid = MERGE == 1 ? (long long)cluster_index() : (long long)cluster_index() * MERGE + crank / SPLIT;
  const long long ncl = (long long)cluster_count() * MERGE;
  const int half = N / SPLIT, col0 = (int)rank * half;  // `half`: this CTA's part of the row
  Accumulators<VEC, ITEMS, DbiasInSmem<VEC, ITEMS, RMS>::value> acc;
  acc.db_s = reinterpret_cast<float*>(ring_base + (long long)stages * 2 * half);
  const StageRing ring(bars, stages);
  const bool producer = threadIdx.x == 0;
  acc.template zero<T_ROW>(half / VEC);
  const W* wh = w != nullptr ? w + col0 : nullptr;
  Vec<W, VEC> gw[ITEMS];
  bwd_load_weights<PLAIN_W, W, VEC, ITEMS, T_ROW>(gw, wh, half);
  if (producer) {
    ring.init();
    peer_sums.init();
  }
  __syncthreads();
  cluster_arrive();  // every CTA's mailbox is initialized before any sends
  cluster_wait();
  if (producer)
    for (int k = 0; k < stages; ++k) issue_row_part<T>(ring, ring_base, x, dy, cid + k * ncl, k, M, N, half, col0);
  int s = 0;
  unsigned phase = 0;
  // Row r (the k-th of this pair) from its stage into registers, this CTA's sums of it (one block
  // barrier, after which the stage is refilled with row r + stages pairs on).
  auto local_sums = [&](Vec<T, VEC>(&xr)[ITEMS], Vec<T, VEC>(&gr)[ITEMS], long long r, float mean_r,
                        float rstd_r, int k) -> float2 {
    const T* xs = ring_base + (long long)s * 2 * half;
    ring.wait(s, phase);
    read_stage<T, VEC, ITEMS, T_ROW>(xr, xs, true, half);
    read_stage<T, VEC, ITEMS, T_ROW>(gr, xs + half, true, half);
    const float2 part = backward_sums<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS>(xr, gr, gw, wh, mean_r, rstd_r, acc,
                                                                           half, zero_centered);
    const float2 mine = row_sum2_alternating<WARPS, true>(part.x, part.y, k & 1);
    if (producer) issue_row_part<T>(ring, ring_base, x, dy, r + (long long)stages * ncl, s, M, N, half, col0);
    ring.next(s, phase);
    return mine;
  };
  const float inv_n = 1.f / (float)N;
  const unsigned peer = crank ^ 1u, group0 = crank - rank;
  auto send_sums = [&](float2 v, int k) {  // thread 0
    if constexpr (SPLIT == 2) {
      peer_sums.send(v, k, peer, 0);
    } else {
#pragma unroll
      for (int j = 0; j < SPLIT; ++j) peer_sums.send(v, k, group0 + j, rank);
    }
  };
  // The row's sums from this CTA's (cur) and the mailbox's: one order in every CTA (float addition
  // commutes, so the pair's two CTAs get the same bits; quarters add the four in rank order).
  auto row_sums = [&](float2 cur, int k) -> float2 {
    const float2* got = peer_sums.receive(k);
    if constexpr (SPLIT == 2) {
      const float2 other = got[0];
      if (producer) peer_sums.rearm(k);
      return make_float2(cur.x + other.x, cur.y + other.y);
    } else {
      float2 t = got[0];
#pragma unroll
      for (int j = 1; j < SPLIT; ++j) {
        t.x += got[j].x;
        t.y += got[j].y;
      }
      if (producer) peer_sums.rearm(k);
      return t;
    }
  };
  // cid < M for every pair when MERGE = 1 (the host launches <= M pairs); with MERGE > 1 the pairs are
  // a multiple of MERGE, so a pair may have no row: it skips the loop and adds zeros to the merge.
  if (MERGE == 1 || cid < M) {
    long long row = cid;
    float mean = RMS ? 0.f : mean_in[row], rstd = rstd_in[row];
    Vec<T, VEC> xr[ITEMS], gr[ITEMS], xr1[ITEMS], gr1[ITEMS];
    float2 mine = local_sums(xr, gr, row, mean, rstd, 0);
    if (producer) send_sums(mine, 0);
    for (int k = 0;; ++k) {  // every CTA of the group walks the same rows
      const long long next = row + ncl;
      const bool has_next = next < M;
      const float next_mean = (!RMS && has_next) ? mean_in[next] : 0.f;
      const float next_rstd = has_next ? rstd_in[next] : 0.f;
      const float2 cur = mine;
      if (PIPE && has_next) mine = local_sums(xr1, gr1, next, next_mean, next_rstd, k + 1);
      backward_dx_cols<PLAIN_W, T, W, VEC, ITEMS, WARPS, RMS, true>(xr, gr, gw, wh, mean, rstd, row_sums(cur, k),
                                                              dx + row * N + col0, half, inv_n, zero_centered);
      if (!has_next) break;
      // Sent after the block barrier of row k + 1's sums; with PIPE that barrier precedes receive(k), so
      // the send of row k + 1 can pass a slow warp's receive(k): the 4 slots keep slot k % 4 unwritten
      // until this CTA sends row k + 3, after row k + 2's barrier.
      if (!PIPE) mine = local_sums(xr1, gr1, next, next_mean, next_rstd, k + 1);
      if (producer) send_sums(mine, k + 1);
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        xr[i] = xr1[i];
        gr[i] = gr1[i];
      }
      row = next;
      mean = next_mean;
      rstd = next_rstd;
    }
  }
  if constexpr (MERGE > 1) {  // one partial row per cluster, each part added over the cluster's groups
    const long long p = (long long)cluster_index() * N + col0;
    write_cluster_partials<VEC, ITEMS, T_ROW, 1, MERGE, SPLIT>(acc, reinterpret_cast<float*>(staged_smem),
                                                               dw_part != nullptr ? dw_part + p : nullptr,
                                                               (RMS || db_part == nullptr) ? nullptr : db_part + p,
                                                               half);
  } else {
    cluster_arrive();  // no CTA exits while a send to it may be in flight (each is received; kept as a guard)
    cluster_wait();
    const long long p = cid * (long long)N + col0;
    acc.template write<T_ROW>(dw_part != nullptr ? dw_part + p : nullptr,
                              (RMS || db_part == nullptr) ? nullptr : db_part + p, 0, half);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward, long rows: one row at a time per block, partial dweight / dbias row in global memory.
template <typename T, typename W, int VEC, bool RMS>
__global__ void __launch_bounds__(512, 1)
norm_bwd_looped(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                T* __restrict__ dx, float* __restrict__ dw_part, float* __restrict__ db_part,
                long long M, int N, int zero_centered) {
  griddep_launch_dependents();  // column_sum, launched as a dependent, waits for the partial rows
  const int nvec = N / VEC;
  const float inv_n = 1.f / (float)N;
  float* dwp = dw_part != nullptr ? dw_part + (long long)blockIdx.x * N : nullptr;
  float* dbp = db_part != nullptr ? db_part + (long long)blockIdx.x * N : nullptr;
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
    if (dwp != nullptr) dwp[c] = 0.f;
    if (dbp != nullptr) dbp[c] = 0.f;
  }
  for (long long row = blockIdx.x; row < M; row += gridDim.x) {
    const long long base = row * (long long)N;
    const float mean = RMS ? 0.f : mean_in[row];
    const float rstd = rstd_in[row];
    float s_gdx = 0.f, s_gd = 0.f;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      const Vec<T, VEC> xv = load_vec<T, VEC>(x + base + (long long)v * VEC);
      const Vec<T, VEC> gv = load_vec<T, VEC>(dy + base + (long long)v * VEC);
      float g[VEC];
      load_gamma<W, VEC>(w, v, zero_centered, g);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (vec_elem(xv, j) - mean) * rstd;
        const float gd = vec_elem(gv, j) * g[j];
        s_gdx += gd * xhat;
        s_gd += gd;
      }
    }
    const float2 s = block_sum2(s_gdx, s_gd);
    const float c1 = s.x * inv_n, c2 = RMS ? 0.f : s.y * inv_n;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      const Vec<T, VEC> xv = load_vec<T, VEC>(x + base + (long long)v * VEC);
      const Vec<T, VEC> gv = load_vec<T, VEC>(dy + base + (long long)v * VEC);
      float g[VEC];
      load_gamma<W, VEC>(w, v, zero_centered, g);
      Vec<T, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int col = v * VEC + j;
        const float xhat = (vec_elem(xv, j) - mean) * rstd;
        const float d = vec_elem(gv, j);
        out.v[j] = from_float<T>(rstd * (d * g[j] - xhat * c1 - c2));
        if (dwp != nullptr) dwp[col] += d * xhat;
        if (dbp != nullptr) dbp[col] += d;
      }
      store_vec<T, VEC>(dx + base + (long long)v * VEC, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// out[c] = sum_p part[p, c] for up to two partial-row buffers in one launch: blockIdx.y = 0 sums part
// into out0, blockIdx.y = 1 sums part + P * N into out1 (dweight and dbias of the LayerNorm backward).
// Block 32 x LANES: x picks the column, y strides over p with four loads in flight per thread (four
// accumulators, then the LANES sums in a fixed order: deterministic). The partials were just written,
// so they come from L2 and the sum is latency-bound: lanes and loads in flight, not bytes, set its time
// (sweep_norm_bwd_small 1813Z: 32 lanes against 8 took 13 us off the RMSNorm 131072 x 1024 backward).
// Launched as the backward kernel's programmatic dependent (common/griddep.cuh): its blocks start as
// the backward's last CTAs run, and wait for them before the first load.
// Splitting the rows over a cluster of 2-8 CTAs (more SMs at N = 1024, rank 0 adding their sums from
// distributed shared memory) was measured and dropped: within +-1 % at 131072 x 1024, up to 2x slower
// at the small shapes (sweep_norm_bwd_small 1825Z).
template <typename W, int LANES>
__global__ void __launch_bounds__(32 * LANES)
column_sum(const float* __restrict__ part, long long P, int N, W* __restrict__ out0, W* __restrict__ out1) {
  __shared__ float tile[LANES][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const float* src = part + blockIdx.y * P * N + col;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  griddep_wait();  // the backward kernel just before wrote the partials (coherent loads below)
  if (col < N) {
    long long p = threadIdx.y;
    for (; p + 3 * LANES < P; p += 4 * LANES) {
#pragma unroll
      for (int k = 0; k < 4; ++k) s[k] += __ldcg(src + (p + k * LANES) * N);
    }
    for (; p < P; p += LANES) s[0] += __ldcg(src + p * N);
  }
  tile[threadIdx.y][threadIdx.x] = (s[0] + s[1]) + (s[2] + s[3]);
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < LANES; ++i) t += tile[i][threadIdx.x];
    (blockIdx.y ? out1 : out0)[col] = from_float<W>(t);
  }
}

}  // namespace fk
