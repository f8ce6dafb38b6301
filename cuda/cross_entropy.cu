// fusedkit/cuda/cross_entropy.cu -- fused cross-entropy over the last dimension (LM-head logits):
// per-token loss, log-sum-exp and the gradient of the reduced loss in one pass over the logits, plus a
// backward from a saved lse, and the deterministic reductions (count of non-ignored tokens, sum/mean).
//
// Math, per token with logits x (N = vocab), target t, smoothing e, z-loss weight z:
//   lse  = m + ln(s),  m = max x,  s = sum exp(x - m)
//   loss = (1 - e) (lse - x_t) + e (lse - mean x) + z lse^2          (torch's label smoothing; PaLM z-loss)
//   dloss/dx_j = g (p_j (1 + 2 z lse) - e / N - (1 - e) [j == t]),  p_j = exp(x_j - lse)
// g is the row's share of the upstream gradient: 1 / (count of non-ignored tokens) for "mean", 1 for
// "sum" and "none" (times grad_scale, or the saved grad_loss in the backward). Ignored tokens (target ==
// ignore_index): loss 0, lse 0, gradient row 0, and their logits are not read. A target outside [0, N)
// (not checked on the host: that would need a sync) gets a NaN loss (so a mean or sum turns NaN) and a
// zero gradient row; no read or write leaves the row.
//
// Fused forward + gradient, row staged in shared memory (ce_fwd_staged, sm_90+, the default for rows of
// 16-byte vectors from 32 KB): each CTA bulk-copies its chunk of the row (<= 64 KB) into shared memory
// on one mbarrier, takes its max (packed max.bf16x2) and keyed sum from there, merges across the
// cluster when the row is split (131072: 4 CTAs, 262144: 8), and writes the gradient from shared memory.
// Up to three CTAs per SM, each in its own phase, keep loads in flight; measured on the H200 (sweeps
// 2026-12-03): 0.87 of copy at 32768 (one CTA per row), 0.755 / 0.731 at 131072 / 262144 (clusters,
// merged through a ClusterMailbox; 0.70 / 0.67 with a cluster barrier per row).
//
// Fused forward + gradient, row in registers (ce_fwd, and ce_fwd_cluster on sm_90+): the thread
// mapping of norm_fwd (cuda/norms.cu). A row is split into 16-byte vectors (VEC = 8 for bf16/fp16, 4 for
// fp32; narrower when N or a pointer's alignment demands); 32 * WARPS threads own one row, thread t
// holding vectors v0 + t, v0 + t + T, ... (T = 32 * WARPS), so each warp access is 512 contiguous bytes.
// Short rows pack RPB = 4 / WARPS rows per block. Rows too long for one block's registers are split over
// a thread-block cluster of C CTAs (2, 4 or 8; CTA r holds the contiguous chunk of vectors
// [r * ceil(nvec / C), ...)): 32768 bf16 = 2 CTAs x 512 threads x 32 elements, 131072 = 8 x 512 x 32,
// 262144 = 8 x 512 x 64. The row is loaded once into registers (raw storage), then:
//   1. ONE reduction round of (m, s, a, b) (LseStats, common/online_softmax.cuh): each thread's max and sum of
//      exp(x - max) merged online, a = sum (x - x_0) (label smoothing only) and b = the target logit
//      (loaded by one thread, 0 elsewhere, so the sum delivers it to every thread: its load is complete
//      before its CTA sends its statistics, and every CTA writes only after receiving all of them,
//      which makes the in-place gradient safe). Shuffles, one shared-memory round across warps, and
//      across the cluster a mailbox (common/cluster.cuh: each CTA st.async-stores its float4 into
//      every CTA's shared memory, completing the receiver's mbarrier) merged by a butterfly in rank
//      order, so every CTA gets identical bits.
//   2. The gradient from the registers, written once (over the logits when grad == logits), and the
//      per-token loss / lse by one thread. The cluster's closing barrier is split around the writes.
// Bytes: read the logits once + write the gradient once = 4MN for 2-byte logits (+ 4-8 bytes per token
// of targets, loss, lse). Forward only (grad == nullptr): 2MN.
//
// Persistent, row in registers, next row staged (ce_fwd_persistent, sm_90; the 8192 x 131072 default):
// the register mapping above in a grid of at most the resident clusters; each CTA's chunk of the next
// row arrives by one bulk copy while it finishes the current row (common/staged.cuh), as the softmax
// forward does for its long rows. Same bits as ce_fwd_cluster of the same split.
//
// Long rows without a cluster (GPUs before sm_90, rows beyond 8 CTAs x 512 threads x 32 registers of
// data, e.g. fp32 at 262144): ce_fwd_looped, one row per 512-thread block, an online (m, s) pass over
// global memory, then a second pass that re-reads the row (mostly from L2) and writes the gradient:
// 6MN bytes, correct for any N.
//
// Backward from a saved lse (ce_bwd): read logits, write the gradient (4MN); a 2-D block walks rows.
// Reductions (ce_reduce, ce_reduce_final): the count of non-ignored tokens (needed by "mean" before any
// gradient is scaled: a tiny pre-kernel over the T targets) and the sum (or mean) of the per-token
// losses. The kernel after each of them on the stream is launched as its programmatic dependent
// (common/griddep.cuh): the fused kernel starts while the count runs and waits for it only before its
// first gradient (ce_grad_scale), the final sum starts as the fused kernel's last CTAs do. Sums in a
// fixed order (fixed 65536-token chunks per block, fixed trees; no float atomics), so results are
// bit-for-bit reproducible run to run and across GPUs.
//
// Numerics: fp32 math on keyed sums (common/online_softmax.cuh): s = sum 2^(fma(x, log2 e, -K)), K =
// fl(m log2 e) the key of the max, one FFMA per exponential (the product is exact inside it, so logits
// with offsets of 1e4 lose nothing) and merges by exact key differences; p_j = 2^(fma(x_j, log2 e, -K))
// / s, so the gradient is cs * 2^(...) - cbase with cs = coef / s (an FFMA, an exponential and an FFMA
// per element); ln s relative to m itself adds the key's exact rounding residual, so lse - x_t =
// (m - x_t) + ln(s) and lse - mean x = (m - x_0) + ln(s) - a / N are formed from small differences.
// One rounding to the gradient's dtype. NaN or +inf logits give NaN; a row of -inf gives
// NaN (as torch).
// Variants considered: two reduction rounds (max, then the sums) -- one more cluster barrier per row;
// the staged kernel persistent and double-buffered (BUFFERS = 2: slower, fewer CTAs fit); 32 KB chunks
// over twice the cluster CTAs (slower: a cluster costs more than the smaller chunk buys); keeping
// exp(x - m) in fp32 registers between the passes (doubles the register footprint); a column test per
// vector for the target (now the writer of the target's vector rewrites that one element); in the
// persistent kernel, thread 0 reading each refill's target one step early (H100: equal at 131072, 0.6
// points slower for the 262144 persistent candidate, 2026-12-07).
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/online_softmax.cuh"
#include "common/cluster.cuh"
#include "common/bulk.cuh"
#include "common/staged.cuh"
#include "common/griddep.cuh"

namespace fk {

constexpr int kCeLoopedThreads = 512;
constexpr int kCeReduceThreads = 1024;
constexpr long long kCeReduceChunk = 65536;  // tokens per block of ce_reduce (fixed: determinism)

__device__ __forceinline__ float ce_neg_inf() { return __int_as_float(0xff800000); }

template <int WARPS>
struct CeRowsPerBlock {
  static constexpr int value = WARPS < 4 ? 4 / WARPS : 1;
};

// Blocks per SM asked of ptxas: up to 16 registers of row data per thread keep 1024 threads per SM
// (<= 64 registers each: 32 bf16 values need ~61); more (up to 32: 64 bf16 values, ~104 registers) get
// one 512-thread block per SM, with twice the bytes in flight per block. (Must match regs_per_thread()
// in fusedkit/backends/cuda_cross_entropy.py.)
template <typename T, int VEC, int ITEMS, int THREADS>
struct CeMinBlocks {
  static constexpr int regs = ITEMS * (VEC * (int)sizeof(T) >= 4 ? VEC * (int)sizeof(T) / 4 : 1);
  static constexpr int value = (regs <= 16 && THREADS <= 1024) ? 1024 / THREADS : 1;
};

__device__ __forceinline__ long long ce_target(const void* target, int t32, long long i) {
  return t32 ? (long long)static_cast<const int*>(target)[i] : static_cast<const long long*>(target)[i];
}

// What a row needs before its logits: target, and whether its logits are read.
struct CeRow {
  long long t;
  bool valid;     // row exists and is not ignored: logits are read, loss and lse are written
  bool in_range;  // valid and 0 <= t < N (a row out of range gets a NaN loss and a zero gradient)
};

__device__ __forceinline__ CeRow ce_row(const void* target, int t32, long long row, bool row_ok, int N,
                                        long long ignore_index) {
  CeRow r;
  r.t = row_ok ? ce_target(target, t32, row) : ignore_index;
  r.valid = row_ok && r.t != ignore_index;
  r.in_range = r.valid && r.t >= 0 && r.t < (long long)N;
  return r;
}

// The gradient scale of every in-range row: grad_scale, divided by the count of non-ignored tokens for
// "mean" (count > 0 whenever a row is valid). The count is written by the kernel launched just before
// (ce_reduce), and the fused kernels are launched as its programmatic dependents (common/griddep.cuh):
// they start while it runs, so each thread waits for it here, as late as it can: after its first row's
// loads and statistics (register kernels), after its first bulk copies (persistent, staged). The kernels
// that walk rows read it once per CTA, before their first row's gradient (read in every row, the load and
// the division stayed inside the persistent and staged loops: ptxas did not hoist them past the barriers).
__device__ __forceinline__ float ce_grad_scale(const int* count, float grad_scale) {
  if (count == nullptr) return grad_scale;
  griddep_wait();
  return grad_scale / (float)__ldcg(count);
}

// Per-token loss and lse from the merged statistics (lse of an ignored token: 0).
__device__ __forceinline__ void ce_write_loss(float* __restrict__ loss, float* __restrict__ lse_out, long long row,
                                              const CeRow& r, const LseStats& st, float x0, int N,
                                              float smoothing, float z_loss) {
  float l = 0.f, lse = 0.f;
  if (r.valid) {
    const float ln_s = kLn2 * log2_sum_at(st.s, st.m);
    lse = st.m + ln_s;
    if (!r.in_range) {
      l = __int_as_float(0x7fc00000);  // NaN: the target is outside [0, N)
    } else {
      const float ce = (st.m - st.b) + ln_s;  // lse - x_t
      l = ce;
      if (smoothing != 0.f) l = (1.f - smoothing) * ce + smoothing * ((st.m - x0) + ln_s - st.a / (float)N);
      if (z_loss != 0.f) l += z_loss * lse * lse;
    }
  }
  loss[row] = l;
  if (lse_out != nullptr) lse_out[row] = lse;
}

// What the fused kernels need for the gradient of a valid row, from its merged statistics:
//   dx_j = cs 2^(fma(x_j, log2 e, -key)) - cbase - [j == t] tgt,  cs = coef / s
// (the keyed sum s of common/online_softmax.cuh, so p_j = 2^(...) / s): an FFMA, an exponential and an
// FFMA per element. The target's term is not in ce_store_grad: the thread that wrote the target's vector
// rewrites that one element afterwards (ce_fix_target; program order makes its write the last), which
// saves a column test per vector.
struct CeGrad {
  float key, cs, cbase, tgt;
};

// g: ce_grad_scale's value (the row's scale if its target is in range, else 0: a zero gradient row).
__device__ __forceinline__ CeGrad ce_grad_params(const CeRow& r, float g, const LseStats& st, int N,
                                                 float smoothing, float z_loss) {
  const float gr = r.in_range ? g : 0.f;
  const float lse = st.m + kLn2 * log2_sum_at(st.s, st.m);
  const float coef = gr * (1.f + 2.f * z_loss * lse);
  return {lse_key(st.m), coef / st.s, gr * smoothing / (float)N, gr * (1.f - smoothing)};
}

// The gradient of one vector, stored at p: a 16-byte vector as whole words (store_floats).
template <typename T, int VEC>
__device__ __forceinline__ void ce_store_grad(T* p, const Vec<T, VEC>& x, const CeGrad& g) {
  float f[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) f[j] = fmaf(g.cs, exp_keyed(vec_elem(x, j), g.key), -g.cbase);
  store_floats<T, VEC>(p, f);
}

// A vector of zero gradient (an ignored row).
template <typename T, int VEC>
__device__ __forceinline__ void ce_store_zero(T* p) {
  if constexpr (VEC * sizeof(T) == 16) {
    st_global_v4(p, 0u, 0u, 0u, 0u);
  } else {
    Vec<T, VEC> z;
    vec_zero(z);
    store_vec<T, VEC>(p, z);
  }
}

template <typename T>
__device__ __forceinline__ void ce_fix_target(T* __restrict__ grad_elem, float xt, const CeGrad& g) {
  *grad_elem = from_float<T>(fmaf(g.cs, exp_keyed(xt, g.key), -g.cbase) - g.tgt);
}

// The gradient of one vector (columns col0 ... col0 + VEC - 1) of a valid row from a saved lse (ce_bwd).
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> ce_grad_vec(const Vec<T, VEC>& x, long long col0, long long t, float m,
                                                   float log2_s, float coef, float base, float tgt) {
  float f[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    f[j] = fmaf(coef, exp2_nonpos(fmaf(to_float(x.v[j]) - m, kLog2e, -log2_s)), -base);
  const long long d = t - col0;
  if (d >= 0 && d < VEC) {
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (j == d) f[j] -= tgt;
  }
  Vec<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) o.v[j] = from_float<T>(f[j]);
  return o;
}

#define FK_CE_FWD_PARAMS                                                                                  \
  const T *logits, const void *__restrict__ target, T *grad, float *__restrict__ loss,                    \
      float *__restrict__ lse_out, const int *__restrict__ count, long long M, int N, int t32,           \
      long long ignore_index, float smoothing, float z_loss, float grad_scale

// ---------------------------------------------------------------------------------------------------
// Fused forward + gradient, row (or a cluster's chunk of it) in registers. logits and grad may alias
// (in-place gradient): every element is read into registers before the first write of its row.

// Statistics, merge, loss and gradient of a row whose vectors [v0, vend) sit in registers (zeros past
// vend and in rows that are not read). x0: the row's first logit (label smoothing), xt: the target logit
// (the leader's; 0 elsewhere: the merged sum delivers it to every thread). count, grad_scale: what
// ce_grad_scale takes, called here before the first gradient store (a kernel that walks rows passes the
// scale it computed once, with a null count).
template <typename T, int VEC, int ITEMS, int WARPS, typename MERGE>
__device__ __forceinline__ void ce_fwd_finish(const Vec<T, VEC> (&raw)[ITEMS], const CeRow& r, float x0, float xt,
                                              T* grad, float* __restrict__ loss, float* __restrict__ lse_out,
                                              long long row, bool row_ok, bool leader, int N, int v0, int vend,
                                              float smoothing, float z_loss, const int* count, float grad_scale,
                                              const MERGE& merge) {
  constexpr int T_ROW = 32 * WARPS;
  const long long base = row * (long long)N;
  const bool smooth = smoothing != 0.f;
  float m = ce_neg_inf();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (r.valid && v0 + (int)threadIdx.x + i * T_ROW < vend)
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, vec_elem(raw[i], j));
  const float key = lse_key(m);
  float s = 0.f, a = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (r.valid && v0 + (int)threadIdx.x + i * T_ROW < vend) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float x = vec_elem(raw[i], j);
        s += exp_keyed(x, key);
        if (smooth) a += x - x0;
      }
    }
  }
  int parity = 0;  // one reduction per row slot
  const LseStats st = merge(row_merge<WARPS>(LseStats{m, s, a, xt}, parity));
  if (!row_ok) return;
  if (leader) ce_write_loss(loss, lse_out, row, r, st, x0, N, smoothing, z_loss);
  if (grad == nullptr) return;
  const CeGrad gp = ce_grad_params(r, ce_grad_scale(count, grad_scale), st, N, smoothing, z_loss);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + (int)threadIdx.x + i * T_ROW;
    if (v < vend) {
      if (r.valid) {
        ce_store_grad<T, VEC>(grad + base + (long long)v * VEC, raw[i], gp);
      } else {
        ce_store_zero<T, VEC>(grad + base + (long long)v * VEC);
      }
    }
  }
  if (r.in_range) {  // the target's vector is this thread's: rewrite its element (st.b = x_t, merged)
    const int vt = (int)(r.t / VEC);
    if (vt >= v0 && vt < vend && (vt - v0) % T_ROW == (int)threadIdx.x) ce_fix_target(grad + base + r.t, st.b, gp);
  }
}

template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER>
__device__ __forceinline__ void ce_fwd_row(FK_CE_FWD_PARAMS, long long row, bool row_ok, int v0, int vend,
                                           bool leader, StatsBox<CLUSTER>* box) {
  constexpr int T_ROW = 32 * WARPS;
  const long long base = row * (long long)N;
  const CeRow r = ce_row(target, t32, row, row_ok, N, ignore_index);
  const bool smooth = smoothing != 0.f;

  Vec<T, VEC> raw[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + (int)threadIdx.x + i * T_ROW;
    if (r.valid && v < vend) {
      raw[i] = load_vec<T, VEC>(logits + base + (long long)v * VEC);
    } else {
      vec_zero(raw[i]);
    }
  }
  // x_0 (reference for the smoothing sum) by every thread, the target logit by the leader.
  const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
  const float xt = (leader && r.in_range) ? to_float(logits[base + r.t]) : 0.f;
  ce_fwd_finish<T, VEC, ITEMS, WARPS>(raw, r, x0, xt, grad, loss, lse_out, row, row_ok, leader, N, v0, vend,
                                      smoothing, z_loss, count, grad_scale, OneShotMerge<CLUSTER>{box});
}

template <typename T, int VEC, int ITEMS, int WARPS>
__global__ void __launch_bounds__(32 * WARPS * CeRowsPerBlock<WARPS>::value,
                                  CeMinBlocks<T, VEC, ITEMS, 32 * WARPS * CeRowsPerBlock<WARPS>::value>::value)
ce_fwd(FK_CE_FWD_PARAMS) {
  griddep_launch_dependents();
  const long long row = (long long)blockIdx.x * CeRowsPerBlock<WARPS>::value + threadIdx.y;
  ce_fwd_row<T, VEC, ITEMS, WARPS, 1>(logits, target, grad, loss, lse_out, count, M, N, t32, ignore_index,
                                      smoothing, z_loss, grad_scale, row, row < M, 0, N / VEC,
                                      threadIdx.x == 0, nullptr);
}

// One row per cluster of CLUSTER CTAs (grid = M * CLUSTER, 1-D blocks of 32 * WARPS threads; the launch
// sets the cluster shape (CLUSTER, 1, 1)).
template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER>
__global__ void __launch_bounds__(32 * WARPS, CeMinBlocks<T, VEC, ITEMS, 32 * WARPS>::value)
ce_fwd_cluster(FK_CE_FWD_PARAMS) {
  griddep_launch_dependents();
  __shared__ StatsBox<CLUSTER> box;
  cluster_merge_open(&box);
  const long long row = blockIdx.x / CLUSTER;
  const int rank = blockIdx.x % CLUSTER;
  const ClusterChunk<CLUSTER> part(N / VEC, rank);
  ce_fwd_row<T, VEC, ITEMS, WARPS, CLUSTER>(logits, target, grad, loss, lse_out, count, M, N, t32, ignore_index,
                                            smoothing, z_loss, grad_scale, row, row < M, part.v0, part.vend,
                                            rank == 0 && threadIdx.x == 0, &box);
  cluster_wait();  // no CTA exits before every CTA is done with the merge
}

// FK_CE_PERSISTENT_MINB: blocks per SM asked of ptxas for ce_fwd_persistent (default: 1024 threads per
// SM, i.e. <= 64 registers: 8 vectors of 16-bit logits a thread fit without spills, and two 512-thread
// CTAs per SM double the staged bytes in flight; -DFK_CE_PERSISTENT_MINB=1 gives ~96 registers, one CTA).
#ifndef FK_CE_PERSISTENT_MINB
#define FK_CE_PERSISTENT_MINB (32 * WARPS >= 1024 ? 1 : 1024 / (32 * WARPS))
#endif
// Persistent, row in registers, next row staged (ce_fwd_persistent, sm_90; cuda_cross_entropy
// TUNED_PERSISTENT: 8192 x 131072 reads 0.885 of copy, H200 sweep 2026-12-05). The scheme of softmax_fwd_staged
// (common/staged.cuh): at most the resident clusters, each walking rows; a CTA's chunk of the next row
// arrives by one bulk copy into shared memory while it reduces and writes the current row from
// registers, so unlike ce_fwd_staged (one row per cluster, three passes over shared memory) the loads
// of row k + G overlap the merge and the gradient stores of row k.
// Same per-thread mapping and sums as ce_fwd_cluster with the same (ITEMS, WARPS, CLUSTER): the same
// bits. Ignored rows are neither loaded nor waited for (thread 0 reads the next row's target before it
// issues the copy, every thread the current one's before it waits). In place (grad == logits): a copy
// reads row k + G while row k is written; x_0 and x_t of row k are read before its statistics are sent,
// and every CTA writes only after receiving all of them. Needs 16-byte vectors (the host checks);
// dynamic shared memory = STAGES x ceil(N / VEC / CLUSTER) x 16 bytes (STAGES > 1: a ring that loads
// that many rows ahead, common/staged.cuh).
template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER, int STAGES = 1>
__global__ void __launch_bounds__(32 * WARPS, FK_CE_PERSISTENT_MINB)
ce_fwd_persistent(FK_CE_FWD_PARAMS) {
  constexpr int T_ROW = 32 * WARPS;
  extern __shared__ __align__(16) unsigned char ce_stage[];
  using Chunk = StagedChunk<T, VEC, CLUSTER, 1, ITEMS, T_ROW, STAGES>;
  __shared__ unsigned long long bars[STAGES];
  __shared__ ClusterMailbox<float4, CLUSTER, 2> box;  // CLUSTER > 1: every CTA's row statistics
  const T* inputs[1] = {logits};
  Chunk ch(inputs, ce_stage, bars, N);
  const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
  const bool leader = rank == 0 && threadIdx.x == 0;
  const bool smooth = smoothing != 0.f;
  griddep_launch_dependents();
  auto read = [&](long long row) { return ce_row(target, t32, row, true, N, ignore_index); };
  long long row = blockIdx.x / CLUSTER;  // < M: the host launches at most M clusters
  staged_open<CLUSTER>(ch, box, row, M, [&](long long r) { return read(r).valid; });
  const float g_row = ce_grad_scale(count, grad_scale);  // the first rows' copies are in flight
  for (int step = 0; row < M; row += ch.G, ++step) {
    const long long base = row * (long long)N;
    const CeRow r = read(row);
    Vec<T, VEC> in[1][ITEMS];
    // the row of this buffer's next turn is loaded only if it is read (thread 0 decides; ignored rows
    // are skipped)
    const long long next = ch.ahead(row);
    ch.take_row(in, r.valid, threadIdx.x == 0 && next < M && read(next).valid ? next : -1);
    auto& raw = in[0];
    const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
    const float xt = (leader && r.in_range) ? to_float(logits[base + r.t]) : 0.f;
    ce_fwd_finish<T, VEC, ITEMS, WARPS>(raw, r, x0, xt, grad, loss, lse_out, row, true, leader, N, ch.v0, ch.vend,
                                        smoothing, z_loss, nullptr, g_row, MailboxStep<CLUSTER>{&box, step, rank});
  }
  staged_close<CLUSTER>();
}

// ---------------------------------------------------------------------------------------------------
// Fused forward + gradient, row (or a cluster's chunk of it) staged in shared memory by bulk copies
// (sm_90+). Grid = G * CLUSTER 1-D blocks of THREADS threads; cluster g takes rows g, g + G, ...; CTA
// `rank` of a cluster owns the 16-byte vectors [v0, v0 + nloc) of each row (nloc <= chunk =
// ceil(N / VEC / CLUSTER)). Dynamic shared memory = BUFFERS chunks.
//   BUFFERS = 1 (G = M as launched: one row per cluster): many small CTAs per SM, in different phases,
//     keep the loads in flight.
//   BUFFERS = 2 (persistent, G = the resident clusters): while a CTA reduces and writes row k from one
//     buffer, the bulk copy of row k + G fills the other. Measured slower (sweep 12:16Z: 0.61 against
//     0.74 at 131072): half as many CTAs fit, and one prefetch per CTA puts fewer bytes in flight.
// A buffer is refilled only after the __syncthreads that ends the row read from it.
// Needs N % VEC == 0 and 16-byte aligned logits and grad (the host checks). Ignored rows are neither
// loaded nor waited for (producer and consumer both skip them; each buffer keeps its own phase bit).
// logits and grad may alias: a CTA writes only its own chunk of the row it holds in shared memory; x_0
// (global) feeds the statistics a CTA sends, so its load is complete before the send, and CTA 0 (x_0's
// writer) writes only after it received every CTA's statistics of the row. Cluster merge through a
// ClusterMailbox (common/cluster.cuh): thread 0 of each CTA stores the CTA's float4 into every CTA's slot
// set of the row with st.async, each CTA waits on its own mbarrier and merges the CLUSTER values in rank
// order (identical bits everywhere). It replaced a cluster barrier per row, whose arrive.release waits
// for the CTA's earlier global stores (the previous row's gradient) in the persistent form. Slot sets
// alternate between rows: a CTA sends row k + 2 only after receiving row k + 1 from every CTA, which
// each sends after the __syncthreads that ends its row k.
template <typename T, int THREADS, int CLUSTER, int BUFFERS>
__global__ void __launch_bounds__(THREADS) ce_fwd_staged(FK_CE_FWD_PARAMS) {
  static_assert(BUFFERS == 1 || BUFFERS == 2, "one or two row buffers");
  constexpr int VEC = 16 / (int)sizeof(T);
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char ce_stage[];
  __shared__ unsigned long long bars[2];
  __shared__ ClusterMailbox<float4, CLUSTER, 2> stats_box;  // CLUSTER > 1: every CTA's row statistics
  const long long G = gridDim.x / CLUSTER;
  const long long row0 = blockIdx.x / CLUSTER;
  const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
  const ClusterChunk<CLUSTER> part(N / VEC, rank);
  const int chunk = part.chunk, v0 = part.v0, nloc = part.vend - part.v0;
  const unsigned bytes = (unsigned)nloc * 16u;
  const bool smooth = smoothing != 0.f;
  griddep_launch_dependents();
  const StageRing ring(bars, BUFFERS);
  // the copy of row `row` into buffer b, if the row is read at all (thread 0)
  auto fill = [&](long long row, int b) {
    if (nloc > 0 && ce_row(target, t32, row, true, N, ignore_index).valid) {
      ring.expect(b, bytes);
      bulk_load(ce_stage + (size_t)b * chunk * 16, logits + row * (long long)N + (long long)v0 * VEC, bytes,
                ring.bar(b));
    }
  };
  if (threadIdx.x == 0) {
    ring.init();
    if constexpr (CLUSTER > 1) stats_box.init();
    if (row0 < M) fill(row0, 0);
  }
  __syncthreads();  // the barriers' init is visible
  if constexpr (CLUSTER > 1) {  // and every CTA's mailbox is initialized before any CTA sends
    cluster_arrive();
    cluster_wait();
  }
  const float g_row = ce_grad_scale(count, grad_scale);  // the first row's copy is in flight
  unsigned phases = 0;  // bit b: parity of buffer b's next fill
  int merge_parity = 0;  // row_merge's shared buffer, alternating by row
  int b = 0, step = 0;
  for (long long row = row0; row < M; row += G, b = (b + 1) % BUFFERS, ++step) {
    // the other buffer's last reader finished the previous row
    if (BUFFERS == 2 && threadIdx.x == 0 && row + G < M) fill(row + G, b ^ 1);
    const V* stage = reinterpret_cast<const V*>(ce_stage + (size_t)b * chunk * 16);
    const long long base = row * (long long)N;
    const CeRow r = ce_row(target, t32, row, true, N, ignore_index);
    const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
    if (r.valid && nloc > 0) {
      ring.wait(b, (phases >> b) & 1u);
      phases ^= 1u << b;
    }
    // pass 1: this thread's max (packed for 16-bit types); pass 2: its keyed sum (and the smoothing sum)
    RunningMax<T, VEC> mx;
    if (r.valid) {
#pragma unroll 4
      for (int v = threadIdx.x; v < nloc; v += THREADS) mx.add(stage[v]);
    }
    const float m = mx.value();
    const float key = lse_key(m);
    float s = 0.f, a = 0.f;
    if (r.valid) {
      if (smooth) {
#pragma unroll 2
        for (int v = threadIdx.x; v < nloc; v += THREADS) {
          const V x = stage[v];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float f = vec_elem(x, j);
            s += exp_keyed(f, key);
            a += f - x0;
          }
        }
      } else {
#pragma unroll 4
        for (int v = threadIdx.x; v < nloc; v += THREADS) {
          const V x = stage[v];
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += exp_keyed(vec_elem(x, j), key);
        }
      }
    }
    // the target logit, from this chunk's copy (the CTA that holds it)
    const long long tl = r.t - (long long)v0 * VEC;
    const bool owner = r.in_range && tl >= 0 && tl < (long long)nloc * VEC;
    const float xt = owner ? to_float(reinterpret_cast<const T*>(stage)[tl]) : 0.f;
    LseStats st = row_merge<THREADS / 32>(LseStats{m, s, a, threadIdx.x == 0 ? xt : 0.f}, merge_parity);
    if constexpr (CLUSTER > 1) {  // each CTA's statistics to every CTA (itself included), merged in rank order
      if (threadIdx.x == 0) stats_box.send_all(StatsOps<LseStats>::pack(st), step, rank);
      st = merge_ranks<CLUSTER, LseStats>(stats_box.receive(step));
      if (threadIdx.x == 0) stats_box.rearm(step);
    }
    if (rank == 0 && threadIdx.x == 0) ce_write_loss(loss, lse_out, row, r, st, x0, N, smoothing, z_loss);
    if (grad != nullptr) {
      T* g = grad + base + (long long)v0 * VEC;
      if (r.valid) {
        const CeGrad gp = ce_grad_params(r, g_row, st, N, smoothing, z_loss);
#pragma unroll 4
        for (int v = threadIdx.x; v < nloc; v += THREADS) ce_store_grad<T, VEC>(g + (long long)v * VEC, stage[v], gp);
        if (owner && (int)(tl / VEC) % THREADS == (int)threadIdx.x) ce_fix_target(g + tl, xt, gp);
      } else {
#pragma unroll 4
        for (int v = threadIdx.x; v < nloc; v += THREADS) ce_store_zero<T, VEC>(g + (long long)v * VEC);
      }
    }
    __syncthreads();  // buffer b is read: it may be refilled
    if (BUFFERS == 1 && threadIdx.x == 0 && row + G < M) fill(row + G, 0);
  }
  if constexpr (CLUSTER > 1) {  // no CTA exits while another may still read its slots
    cluster_arrive();
    cluster_wait();
  }
}

// Rows too long for registers: one row per block, an online (m, s) pass, then a second pass that
// re-reads the row and writes the gradient (each vector read and written by the same thread).
template <typename T, int VEC>
__global__ void __launch_bounds__(kCeLoopedThreads)
ce_fwd_looped(FK_CE_FWD_PARAMS) {
  constexpr int WARPS = kCeLoopedThreads / 32;
  const long long row = blockIdx.x;
  const long long base = row * (long long)N;
  const int nvec = N / VEC;
  griddep_launch_dependents();
  const CeRow r = ce_row(target, t32, row, true, N, ignore_index);
  const bool smooth = smoothing != 0.f;
  const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
  const float xt = (threadIdx.x == 0 && r.in_range) ? to_float(logits[base + r.t]) : 0.f;
  float m = ce_neg_inf(), s = 0.f, a = 0.f;
  if (r.valid) {
    for (int v = threadIdx.x; v < nvec; v += kCeLoopedThreads) {
      const Vec<T, VEC> x = load_vec<T, VEC>(logits + base + (long long)v * VEC);
      float vm = m;
#pragma unroll
      for (int j = 0; j < VEC; ++j) vm = fmaxf(vm, vec_elem(x, j));
      s = rescale_keyed(s, m, vm);
      m = vm;
      const float key = lse_key(m);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = vec_elem(x, j);
        s += exp_keyed(f, key);
        if (smooth) a += f - x0;
      }
    }
  }
  int parity = 0;
  const LseStats st = row_merge<WARPS>(LseStats{m, s, a, xt}, parity);
  if (threadIdx.x == 0) ce_write_loss(loss, lse_out, row, r, st, x0, N, smoothing, z_loss);
  if (grad == nullptr) return;
  const CeGrad gp = ce_grad_params(r, ce_grad_scale(count, grad_scale), st, N, smoothing, z_loss);
  for (int v = threadIdx.x; v < nvec; v += kCeLoopedThreads) {
    if (r.valid) {
      ce_store_grad<T, VEC>(grad + base + (long long)v * VEC, load_vec<T, VEC>(logits + base + (long long)v * VEC), gp);
    } else {
      ce_store_zero<T, VEC>(grad + base + (long long)v * VEC);
    }
  }
  if (r.in_range && (int)(r.t / VEC) % kCeLoopedThreads == (int)threadIdx.x)
    ce_fix_target(grad + base + r.t, st.b, gp);
}

// ---------------------------------------------------------------------------------------------------
// Backward from a saved lse: grad = g (exp(x - lse) (1 + 2 z lse) - e / N - (1 - e) [j == t]).
// Block (TX, TY) = (32 * 2^k, 256 / TX): threadIdx.y picks a row, TX threads stride over its vectors;
// the grid strides over rows. g = grad_scale * grad_loss[per_token ? row : 0] (grad_loss may be null)
// / *count (mean). logits and grad may alias (each vector is read and written by one thread).
template <typename T, int VEC>
__global__ void __launch_bounds__(256)
ce_bwd(const float* __restrict__ grad_loss, const T* logits, const void* __restrict__ target,
       const float* __restrict__ lse_in, T* grad, const int* __restrict__ count, long long M, int N, int t32,
       int per_token, long long ignore_index, float smoothing, float z_loss, float grad_scale) {
  const int nvec = N / VEC;
  const float g_row = ce_grad_scale(count, grad_scale);
  for (long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (long long)gridDim.x * blockDim.y) {
    const long long base = row * (long long)N;
    const CeRow r = ce_row(target, t32, row, true, N, ignore_index);
    float g = r.in_range ? g_row : 0.f;
    if (grad_loss != nullptr) g *= grad_loss[per_token ? row : 0];
    const float lse = r.valid ? lse_in[row] : 0.f;
    const float coef = g * (1.f + 2.f * z_loss * lse);
    const float cbase = g * smoothing / (float)N, tgt = g * (1.f - smoothing);
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      Vec<T, VEC> o;
      if (r.valid) {
        const Vec<T, VEC> x = load_vec<T, VEC>(logits + base + (long long)v * VEC);
        o = ce_grad_vec<T, VEC>(x, (long long)v * VEC, r.t, lse, 0.f, coef, cbase, tgt);
      } else {
        vec_zero(o);
      }
      store_vec<T, VEC>(grad + base + (long long)v * VEC, o);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Deterministic reductions over the T tokens: block b sums the per-token losses (loss may be null) and
// counts the non-ignored targets of tokens [b * chunk, (b + 1) * chunk) in a fixed order. One block:
// it writes the result (out = sum, or sum / count with `mean` (0 / 0 = NaN when every token is ignored,
// as torch); out_count = count; either may be null). Several blocks: partials, then ce_reduce_final.

__device__ __forceinline__ void ce_block_sum(float& s, int& n) {
  __shared__ float ps[32];
  __shared__ int pn[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, off);
    n += __shfl_xor_sync(0xffffffffu, n, off);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    ps[warp] = s;
    pn[warp] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s = 0.f;
    n = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
      s += ps[w];
      n += pn[w];
    }
  }
}

__device__ __forceinline__ void ce_reduce_out(float s, int n, float* out, int* out_count, int mean) {
  if (out != nullptr) *out = mean ? s / (float)n : s;
  if (out_count != nullptr) *out_count = n;
}

__global__ void __launch_bounds__(kCeReduceThreads)
ce_reduce(const float* __restrict__ loss, const void* __restrict__ target, int t32, long long T,
          long long ignore_index, float* __restrict__ psum, int* __restrict__ pcount, float* __restrict__ out,
          int* __restrict__ out_count, int mean) {
  griddep_launch_dependents();  // the fused kernel after a count starts at once (it waits for the count)
  const long long start = (long long)blockIdx.x * kCeReduceChunk;
  const long long end = min(T, start + kCeReduceChunk);
  int n = 0;  // the targets are the call's input: counted while the fused kernel before may still run
  for (long long i = start + threadIdx.x; i < end; i += kCeReduceThreads)
    n += ce_target(target, t32, i) != ignore_index ? 1 : 0;
  float s = 0.f;
  if (loss != nullptr) {
    griddep_wait();  // the losses come from the fused kernel just before
    for (long long i = start + threadIdx.x; i < end; i += kCeReduceThreads) s += __ldcg(loss + i);
  }
  ce_block_sum(s, n);
  if (threadIdx.x != 0) return;
  if (gridDim.x == 1) {
    ce_reduce_out(s, n, out, out_count, mean);
  } else {
    psum[blockIdx.x] = s;
    pcount[blockIdx.x] = n;
  }
}

__global__ void __launch_bounds__(kCeReduceThreads)
ce_reduce_final(const float* __restrict__ psum, const int* __restrict__ pcount, int P, float* __restrict__ out,
                int* __restrict__ out_count, int mean) {
  griddep_launch_dependents();
  float s = 0.f;
  int n = 0;
  for (int i = threadIdx.x; i < P; i += kCeReduceThreads) {
    s += psum[i];
    n += pcount[i];
  }
  ce_block_sum(s, n);
  if (threadIdx.x == 0) ce_reduce_out(s, n, out, out_count, mean);
}

}  // namespace fk
