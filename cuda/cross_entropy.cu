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
//      before any CTA of the cluster writes, which makes the in-place gradient safe). Shuffles, one
//      shared-memory round across warps, and across the cluster one float4 slot per CTA read through
//      distributed shared memory (barrier.cluster arrive.release / wait.acquire, mapa +
//      ld.shared::cluster) and merged by a butterfly, so every CTA gets identical bits.
//   2. The gradient from the registers, written once (over the logits when grad == logits), and the
//      per-token loss / lse by one thread. The cluster's closing barrier is split around the writes.
// Bytes: read the logits once + write the gradient once = 4MN for 2-byte logits (+ 4-8 bytes per token
// of targets, loss, lse). Forward only (grad == nullptr): 2MN.
//
// Long rows without a cluster (GPUs before sm_90, rows beyond 8 CTAs x 512 threads x 32 registers of
// data, e.g. fp32 at 262144): ce_fwd_looped, one row per 512-thread block, an online (m, s) pass over
// global memory, then a second pass that re-reads the row (mostly from L2) and writes the gradient:
// 6MN bytes, correct for any N.
//
// Backward from a saved lse (ce_bwd): read logits, write the gradient (4MN); a 2-D block walks rows.
// Reductions (ce_reduce, ce_reduce_final): the count of non-ignored tokens (needed by "mean" before any
// gradient is scaled: a tiny pre-kernel over the T targets) and the sum (or mean) of the per-token
// losses, in a fixed order (fixed 65536-token chunks per block, fixed trees; no float atomics), so
// results are bit-for-bit reproducible run to run and across GPUs.
//
// Numerics: fp32 math. Exponentials are exp2f((x - m) * log2(e)), the subtraction first, so logits
// with offsets of 1e4 lose nothing to a prescaled x * log2(e); p_j = exp2f((x_j - m) log2(e) - log2(s)),
// lse - x_t = (m - x_t) + ln(s) and lse - mean x = (m - x_0) + ln(s) - a / N are formed from small
// differences. One rounding to the gradient's dtype. NaN or +inf logits give NaN; a row of -inf gives
// NaN (as torch).
// Variants considered: two reduction rounds (max, then the sums) -- one more cluster barrier per row;
// rows staged in shared memory by bulk copies (lost to registers for the norm forward, not retried);
// keeping exp(x - m) in fp32 registers between the passes (doubles the register footprint); the
// target column found in registers (a compare per element) instead of one scalar load.
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/online_softmax.cuh"
#include "common/cluster.cuh"

namespace fk {

constexpr float kCeLn2 = 0.6931471805599453f;
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

// What a row needs before its logits: target, whether its logits are read, its gradient scale.
struct CeRow {
  long long t;
  bool valid;     // row exists and is not ignored: logits are read, loss and lse are written
  bool in_range;  // valid and 0 <= t < N
  float g;        // gradient scale of the row (0 without a gradient)
};

__device__ __forceinline__ CeRow ce_row(const void* target, int t32, long long row, bool row_ok, int N,
                                        long long ignore_index, const int* count, float grad_scale) {
  CeRow r;
  r.t = row_ok ? ce_target(target, t32, row) : ignore_index;
  r.valid = row_ok && r.t != ignore_index;
  r.in_range = r.valid && r.t >= 0 && r.t < (long long)N;
  float g = grad_scale;
  if (count != nullptr) g = g / (float)(*count);  // mean: count > 0 whenever a row is valid
  r.g = r.in_range ? g : 0.f;
  return r;
}

// Per-token loss and lse from the merged statistics (lse of an ignored token: 0).
__device__ __forceinline__ void ce_write_loss(float* __restrict__ loss, float* __restrict__ lse_out, long long row,
                                              const CeRow& r, const LseStats& st, float x0, int N,
                                              float smoothing, float z_loss) {
  float l = 0.f, lse = 0.f;
  if (r.valid) {
    const float ln_s = logf(st.s);
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

// The gradient of one vector (columns col0 ... col0 + VEC - 1) of a valid row.
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

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> zero_vec() {
  Vec<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) o.v[j] = from_float<T>(0.f);
  return o;
}

#define FK_CE_FWD_PARAMS                                                                                  \
  const T *logits, const void *__restrict__ target, T *grad, float *__restrict__ loss,                    \
      float *__restrict__ lse_out, const int *__restrict__ count, long long M, int N, int t32,           \
      long long ignore_index, float smoothing, float z_loss, float grad_scale

// ---------------------------------------------------------------------------------------------------
// Fused forward + gradient, row (or a cluster's chunk of it) in registers. logits and grad may alias
// (in-place gradient): every element is read into registers before the first write of its row.

template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER>
__device__ __forceinline__ void ce_fwd_row(FK_CE_FWD_PARAMS, long long row, bool row_ok, int v0, int vend,
                                           bool leader, float4* slot) {
  constexpr int T_ROW = 32 * WARPS;
  const long long base = row * (long long)N;
  const CeRow r = ce_row(target, t32, row, row_ok, N, ignore_index, count, grad_scale);
  const bool smooth = smoothing != 0.f;

  Vec<T, VEC> raw[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + (int)threadIdx.x + i * T_ROW;
    raw[i] = (r.valid && v < vend) ? load_vec<T, VEC>(logits + base + (long long)v * VEC) : zero_vec<T, VEC>();
  }
  // x_0 (reference for the smoothing sum) by every thread, the target logit by the leader.
  const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
  const float xt = (leader && r.in_range) ? to_float(logits[base + r.t]) : 0.f;

  float m = ce_neg_inf();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (r.valid && v0 + (int)threadIdx.x + i * T_ROW < vend)
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, to_float(raw[i].v[j]));
  const float m_loc = m == ce_neg_inf() ? 0.f : m;
  float s = 0.f, a = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (r.valid && v0 + (int)threadIdx.x + i * T_ROW < vend) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float x = to_float(raw[i].v[j]);
        s += exp_shifted(x, m_loc);
        if (smooth) a += x - x0;
      }
    }
  }
  LseStats st = row_merge<WARPS>(LseStats{m, s, a, xt});
  if constexpr (CLUSTER > 1) {
    st = cluster_merge<CLUSTER>(st, slot);
    cluster_arrive();  // done reading the other CTAs' slots (the kernel waits before it exits)
  }
  if (!row_ok) return;
  if (leader) ce_write_loss(loss, lse_out, row, r, st, x0, N, smoothing, z_loss);
  if (grad == nullptr) return;
  const float log2_s = log2f(st.s);
  const float lse = st.m + log2_s * kCeLn2;
  const float coef = r.g * (1.f + 2.f * z_loss * lse);
  const float cbase = r.g * smoothing / (float)N, tgt = r.g * (1.f - smoothing);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + (int)threadIdx.x + i * T_ROW;
    if (v < vend) {
      const Vec<T, VEC> o = r.valid ? ce_grad_vec<T, VEC>(raw[i], (long long)v * VEC, r.t, st.m, log2_s, coef, cbase, tgt)
                                    : zero_vec<T, VEC>();
      store_vec<T, VEC>(grad + base + (long long)v * VEC, o);
    }
  }
}

template <typename T, int VEC, int ITEMS, int WARPS>
__global__ void __launch_bounds__(32 * WARPS * CeRowsPerBlock<WARPS>::value,
                                  CeMinBlocks<T, VEC, ITEMS, 32 * WARPS * CeRowsPerBlock<WARPS>::value>::value)
ce_fwd(FK_CE_FWD_PARAMS) {
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
  __shared__ float4 slot;
  const long long row = blockIdx.x / CLUSTER;
  const int rank = blockIdx.x % CLUSTER;
  const int nvec = N / VEC, chunk = (nvec + CLUSTER - 1) / CLUSTER;
  const int v0 = min(rank * chunk, nvec), vend = min(v0 + chunk, nvec);
  ce_fwd_row<T, VEC, ITEMS, WARPS, CLUSTER>(logits, target, grad, loss, lse_out, count, M, N, t32, ignore_index,
                                            smoothing, z_loss, grad_scale, row, row < M, v0, vend,
                                            rank == 0 && threadIdx.x == 0, &slot);
  cluster_wait();  // every CTA has read this CTA's slot
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
  const CeRow r = ce_row(target, t32, row, true, N, ignore_index, count, grad_scale);
  const bool smooth = smoothing != 0.f;
  const float x0 = (r.valid && smooth) ? to_float(logits[base]) : 0.f;
  const float xt = (threadIdx.x == 0 && r.in_range) ? to_float(logits[base + r.t]) : 0.f;
  float m = ce_neg_inf(), s = 0.f, a = 0.f;
  if (r.valid) {
    for (int v = threadIdx.x; v < nvec; v += kCeLoopedThreads) {
      const Vec<T, VEC> x = load_vec<T, VEC>(logits + base + (long long)v * VEC);
      float vm = m;
#pragma unroll
      for (int j = 0; j < VEC; ++j) vm = fmaxf(vm, to_float(x.v[j]));
      s = rescale_sum(s, m, vm);
      m = vm;
      const float m_loc = m == ce_neg_inf() ? 0.f : m;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = to_float(x.v[j]);
        s += exp_shifted(f, m_loc);
        if (smooth) a += f - x0;
      }
    }
  }
  const LseStats st = row_merge<WARPS>(LseStats{m, s, a, xt});
  if (threadIdx.x == 0) ce_write_loss(loss, lse_out, row, r, st, x0, N, smoothing, z_loss);
  if (grad == nullptr) return;
  const float log2_s = log2f(st.s);
  const float lse = st.m + log2_s * kCeLn2;
  const float coef = r.g * (1.f + 2.f * z_loss * lse);
  const float cbase = r.g * smoothing / (float)N, tgt = r.g * (1.f - smoothing);
  for (int v = threadIdx.x; v < nvec; v += kCeLoopedThreads) {
    Vec<T, VEC> o;
    if (r.valid) {
      const Vec<T, VEC> x = load_vec<T, VEC>(logits + base + (long long)v * VEC);
      o = ce_grad_vec<T, VEC>(x, (long long)v * VEC, r.t, st.m, log2_s, coef, cbase, tgt);
    } else {
      o = zero_vec<T, VEC>();
    }
    store_vec<T, VEC>(grad + base + (long long)v * VEC, o);
  }
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
  for (long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y; row < M;
       row += (long long)gridDim.x * blockDim.y) {
    const long long base = row * (long long)N;
    CeRow r = ce_row(target, t32, row, true, N, ignore_index, count, grad_scale);
    if (grad_loss != nullptr) r.g *= grad_loss[per_token ? row : 0];
    const float lse = r.valid ? lse_in[row] : 0.f;
    const float coef = r.g * (1.f + 2.f * z_loss * lse);
    const float cbase = r.g * smoothing / (float)N, tgt = r.g * (1.f - smoothing);
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      Vec<T, VEC> o;
      if (r.valid) {
        const Vec<T, VEC> x = load_vec<T, VEC>(logits + base + (long long)v * VEC);
        o = ce_grad_vec<T, VEC>(x, (long long)v * VEC, r.t, lse, 0.f, coef, cbase, tgt);
      } else {
        o = zero_vec<T, VEC>();
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
  const long long start = (long long)blockIdx.x * kCeReduceChunk;
  const long long end = min(T, start + kCeReduceChunk);
  float s = 0.f;
  int n = 0;
  for (long long i = start + threadIdx.x; i < end; i += kCeReduceThreads) {
    if (loss != nullptr) s += loss[i];
    n += ce_target(target, t32, i) != ignore_index ? 1 : 0;
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
