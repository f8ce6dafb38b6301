// fusedkit/cuda/norms.cu -- LayerNorm and RMSNorm, forward and backward (one family: RMS = true drops
// the mean and the bias).
//
// Forward, row kept in registers (norm_fwd, persistent, next row prefetched): a row of N elements is split into N / VEC vectors of
// 16 bytes (VEC = 8 for bf16/fp16, 4 for fp32; VEC = 1 when N is odd). 32 * WARPS threads own one row;
// thread t holds vectors t, t + T, ..., t + (ITEMS - 1) * T (T = 32 * WARPS), so every load of the warp
// is one coalesced 512-byte transaction. The row stays in registers as raw storage (4 registers per
// vector whatever the dtype) and is converted to fp32 when used. LayerNorm takes the exact two-pass
// statistics from registers: mean, then sum((x - mean)^2); each is one row_sum (shuffles, plus one
// shared-memory round when WARPS > 1). Blocks are 128 threads or more: RPB = 4 / WARPS rows per block
// when a row takes fewer than 4 warps.
// Bytes: read x (+ residual) and the weights (cached), write y (+ x + residual) and 8 bytes of
// statistics per row: 4MN for 2-byte x and y.
//
// Forward, long rows (norm_fwd_looped): rows too long for registers (beyond 32 warps x 4 vectors).
// One row per block of 1024 threads: pass 1 reads the row for Welford statistics (Chan merges across
// threads), pass 2 reads it again (mostly from L2) and writes y. 6MN bytes; correctness path.
//
// Backward (norm_bwd): persistent grid (a few blocks per SM); each block walks rows with the same
// thread -> column mapping as the forward, so every thread accumulates dweight / dbias for its own
// columns in fp32 registers across all the rows it sees, with no atomics. Per row: two sums
// (sum g*dy*xhat, sum g*dy) in one row_sum2, then dx = rstd * (g*dy - xhat*c1 - c2) (c2 = 0 for RMS).
// At the end each (block, row slot) writes one fp32 partial row; column_sum adds the partials (fixed
// order, so results are deterministic). Bytes: read x, dy, write dx = 6MN, plus P x N x 4 partials.
// Long rows use norm_bwd_looped: one row at a time per block, the block's partial row kept in global
// memory (read-modify-write, exclusive to the block): correct for any N, not bandwidth-optimal.
//
// Numerics: fp32 accumulation everywhere; rstd = rsqrt(var + eps); weights in fp32 or the input dtype,
// g = w + 1 when zero_centered_gamma. Variants tried: see docs/perf_notes.rst.
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"

namespace fk {

template <int WARPS>
struct RowsPerBlock {
  static constexpr int value = WARPS < 4 ? 4 / WARPS : 1;
};

// gamma (g = w, or w + 1 with zero_centered_gamma; 1 without weights) and beta of one vector of columns,
// in fp32, from one vector load each (the weights are shared by all rows and stay in L1/L2).
template <typename W, int VEC>
__device__ __forceinline__ void load_gamma(const W* w, int v, int zero_centered, float (&g)[VEC]) {
  if (w == nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = 1.f;
    return;
  }
  const Vec<W, VEC> t = load_vec<W, VEC>(w + (long long)v * VEC);
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
  const Vec<W, VEC> t = load_vec<W, VEC>(b + (long long)v * VEC);
#pragma unroll
  for (int j = 0; j < VEC; ++j) beta[j] = to_float(t.v[j]);
}

// ---------------------------------------------------------------------------------------------------
// Forward, row in registers, persistent grid: while a block normalizes one row it already has the
// loads of its next row in flight (register double buffer), so memory never waits on the reductions.

// Loads this thread's vectors of `row` (x, plus residual -> also stores h = x + residual).
template <typename T, int VEC, int ITEMS, int T_ROW>
__device__ __forceinline__ void load_row(Vec<T, VEC> (&raw)[ITEMS], const T* __restrict__ x,
                                         const T* __restrict__ residual, T* __restrict__ sum_out,
                                         long long row, bool row_ok, int N) {
  const int nvec = N / VEC;
  const long long base = row * (long long)N;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (row_ok && v < nvec) {
      raw[i] = load_vec_stream<T, VEC>(x + base + (long long)v * VEC);
      if (residual != nullptr) {
        const Vec<T, VEC> r = load_vec_stream<T, VEC>(residual + base + (long long)v * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) raw[i].v[j] = from_float<T>(to_float(raw[i].v[j]) + to_float(r.v[j]));
        store_vec<T, VEC>(sum_out + base + (long long)v * VEC, raw[i]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) raw[i].v[j] = from_float<T>(0.f);
    }
  }
}

// Statistics and output of one row held in registers (all threads of the block call it: barriers).
template <typename T, typename W, typename O, int VEC, int ITEMS, int WARPS, bool RMS>
__device__ __forceinline__ void normalize_row(const Vec<T, VEC> (&raw)[ITEMS], const W* __restrict__ w,
                                              const W* __restrict__ b, O* __restrict__ y,
                                              float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                              long long row, bool row_ok, int N, float eps, int zero_centered) {
  constexpr int T_ROW = 32 * WARPS;
  const int nvec = N / VEC;
  const float inv_n = 1.f / (float)N;
  float mean = 0.f;
  if constexpr (!RMS) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += to_float(raw[i].v[j]);
    mean = row_sum<WARPS>(s) * inv_n;
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (threadIdx.x + i * T_ROW < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = to_float(raw[i].v[j]) - mean;
        ss += d * d;
      }
    }
  }
  const float rstd = rsqrtf(row_sum<WARPS>(ss) * inv_n + eps);
  if (!row_ok) return;
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
  const long long base = row * (long long)N;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (v < nvec) {
      float g[VEC], beta[VEC];
      load_gamma<W, VEC>(w, v, zero_centered, g);
      load_beta<W, VEC>(RMS ? nullptr : b, v, beta);
      Vec<O, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out.v[j] = from_float<O>((to_float(raw[i].v[j]) - mean) * rstd * g[j] + beta[j]);
      store_vec<O, VEC>(y + base + (long long)v * VEC, out);
    }
  }
}

// Two register buffers in ping-pong (no copies between them, so the prefetched loads really stay in
// flight while the other row is normalized).
template <typename T, typename W, typename O, int VEC, int ITEMS, int WARPS, bool RMS>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value)
norm_fwd(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
         const W* __restrict__ b, O* __restrict__ y, T* __restrict__ sum_out,
         float* __restrict__ mean_out, float* __restrict__ rstd_out, long long M, int N, float eps,
         int zero_centered) {
  constexpr int RPB = RowsPerBlock<WARPS>::value;
  constexpr int T_ROW = 32 * WARPS;
  const long long stride = (long long)gridDim.x * RPB;
  long long row = (long long)blockIdx.x * RPB + threadIdx.y;
  Vec<T, VEC> a[ITEMS], c[ITEMS];
  load_row<T, VEC, ITEMS, T_ROW>(a, x, residual, sum_out, row, row < M, N);
  // row0 is uniform across the block, so every thread takes the same branches (barriers inside).
  for (long long row0 = (long long)blockIdx.x * RPB; row0 < M; row0 += 2 * stride, row += 2 * stride) {
    const bool has_next = row0 + stride < M;
    if (has_next) load_row<T, VEC, ITEMS, T_ROW>(c, x, residual, sum_out, row + stride, row + stride < M, N);
    normalize_row<T, W, O, VEC, ITEMS, WARPS, RMS>(a, w, b, y, mean_out, rstd_out, row, row < M, N, eps, zero_centered);
    if (!has_next) break;
    if (row0 + 2 * stride < M)
      load_row<T, VEC, ITEMS, T_ROW>(a, x, residual, sum_out, row + 2 * stride, row + 2 * stride < M, N);
    normalize_row<T, W, O, VEC, ITEMS, WARPS, RMS>(c, w, b, y, mean_out, rstd_out, row + stride,
                                                   row + stride < M, N, eps, zero_centered);
  }
}

// ---------------------------------------------------------------------------------------------------
// Forward, long rows: one row per block (1-D block of THREADS), two passes over global memory.
template <typename T, typename W, typename O, int VEC, bool RMS>
__global__ void __launch_bounds__(1024)
norm_fwd_looped(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ w,
                const W* __restrict__ b, O* __restrict__ y, T* sum_out,  // no restrict: re-read
                float* __restrict__ mean_out, float* __restrict__ rstd_out, long long M, int N,
                float eps, int zero_centered) {
  const long long row = blockIdx.x;
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
      for (int j = 0; j < VEC; ++j) a.v[j] = from_float<T>(to_float(a.v[j]) + to_float(r.v[j]));
      store_vec<T, VEC>(sum_out + base + (long long)v * VEC, a);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_float(a.v[j]);
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
    Vec<O, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_float<O>((to_float(a.v[j]) - mean) * rstd * g[j] + beta[j]);
    store_vec<O, VEC>(y + base + (long long)v * VEC, out);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward, row in registers, persistent grid with per-thread dweight / dbias accumulators.
template <typename T, typename W, int VEC, int ITEMS, int WARPS, bool RMS>
__global__ void __launch_bounds__(32 * WARPS * RowsPerBlock<WARPS>::value)
norm_bwd(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
         const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
         float* __restrict__ dw_part, float* __restrict__ db_part, long long M, int N,
         int zero_centered) {
  constexpr int RPB = RowsPerBlock<WARPS>::value;
  constexpr int T_ROW = 32 * WARPS;
  // LayerNorm with 32+ columns per thread: dweight + dbias accumulators plus the row would exceed 128
  // registers and spill, so dbias accumulates in shared memory (RPB x N floats, dynamic; each thread
  // touches only its own columns, so no barriers). Python's bwd_smem_bytes mirrors this condition.
  constexpr bool DB_SMEM = !RMS && ITEMS * VEC >= 32;
  extern __shared__ float dyn_smem[];
  float* db_s = dyn_smem + threadIdx.y * N;
  const int nvec = N / VEC;
  const float inv_n = 1.f / (float)N;
  float dw_acc[ITEMS][VEC], db_acc[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw_acc[i][j] = db_acc[i][j] = 0.f;
  if constexpr (DB_SMEM) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (v < nvec)
#pragma unroll
        for (int j = 0; j < VEC; ++j) db_s[v * VEC + j] = 0.f;
    }
  }

  for (long long row0 = (long long)blockIdx.x * RPB; row0 < M; row0 += (long long)gridDim.x * RPB) {
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
#pragma unroll
        for (int j = 0; j < VEC; ++j) xr[i].v[j] = gr[i].v[j] = from_float<T>(0.f);
      }
    }
    const float mean = (RMS || !row_ok) ? 0.f : mean_in[row];
    const float rstd = row_ok ? rstd_in[row] : 0.f;
    float s_gdx = 0.f, s_gd = 0.f;  // sum g*dy*xhat, sum g*dy
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = threadIdx.x + i * T_ROW;
      if (v < nvec) {
        float g[VEC];
        load_gamma<W, VEC>(w, v, zero_centered, g);
        Vec<float, VEC> dbs;
        if constexpr (DB_SMEM) dbs = *reinterpret_cast<Vec<float, VEC>*>(db_s + v * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xhat = (to_float(xr[i].v[j]) - mean) * rstd;
          const float d = to_float(gr[i].v[j]);
          const float gd = d * g[j];
          s_gdx += gd * xhat;
          s_gd += gd;
          dw_acc[i][j] += d * xhat;
          if constexpr (DB_SMEM) dbs.v[j] += d;
          else if constexpr (!RMS) db_acc[i][j] += d;
        }
        if constexpr (DB_SMEM) *reinterpret_cast<Vec<float, VEC>*>(db_s + v * VEC) = dbs;
      }
    }
    const float2 s = row_sum2<WARPS>(s_gdx, s_gd);
    const float c1 = s.x * inv_n, c2 = RMS ? 0.f : s.y * inv_n;
    if (row_ok) {
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int v = threadIdx.x + i * T_ROW;
        if (v < nvec) {
          float g[VEC];
          load_gamma<W, VEC>(w, v, zero_centered, g);
          Vec<T, VEC> out;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xhat = (to_float(xr[i].v[j]) - mean) * rstd;
            out.v[j] = from_float<T>(rstd * (to_float(gr[i].v[j]) * g[j] - xhat * c1 - c2));
          }
          store_vec<T, VEC>(dx + base + (long long)v * VEC, out);
        }
      }
    }
  }
  // One partial row per (block, row slot).
  const long long p = (long long)blockIdx.x * RPB + threadIdx.y;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = threadIdx.x + i * T_ROW;
    if (v < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const long long idx = p * N + v * VEC + j;
        if (dw_part != nullptr) dw_part[idx] = dw_acc[i][j];
        if (!RMS && db_part != nullptr) db_part[idx] = DB_SMEM ? db_s[v * VEC + j] : db_acc[i][j];
      }
    }
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
        const float xhat = (to_float(xv.v[j]) - mean) * rstd;
        const float gd = to_float(gv.v[j]) * g[j];
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
        const float xhat = (to_float(xv.v[j]) - mean) * rstd;
        const float d = to_float(gv.v[j]);
        out.v[j] = from_float<T>(rstd * (d * g[j] - xhat * c1 - c2));
        if (dwp != nullptr) dwp[col] += d * xhat;
        if (dbp != nullptr) dbp[col] += d;
      }
      store_vec<T, VEC>(dx + base + (long long)v * VEC, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// out[c] = sum_p part[p, c] in a fixed order (block 32 x 8: x picks the column, y strides over p).
template <typename W>
__global__ void __launch_bounds__(256)
column_sum(const float* __restrict__ part, long long P, int N, W* __restrict__ out) {
  __shared__ float tile[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < N)
    for (long long p = threadIdx.y; p < P; p += 8) s += part[p * N + col];
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) t += tile[i][threadIdx.x];
    out[col] = from_float<W>(t);
  }
}

}  // namespace fk
