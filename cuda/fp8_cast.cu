// fusedkit/cuda/fp8_cast.cu -- FP8 quantization of a contiguous tensor: per-tensor, cast-transpose (with
// dbias and activation backward fused), MXFP8 (row- and column-wise) and block scaling (issue 4).
//
// fp8_quantize<T, F, VEC, CURRENT, UNROLL>: one read of x in 16-byte vectors (VEC = 8 for bf16/fp16,
// 4 for fp32, 1 for odd sizes), UNROLL vectors per thread in one pass (see fp8_amax). Each
// element: f = float(x); amax = fmaxf(amax, |f|) (NaN is ignored, as fmaxf does); byte = sat_rn(f *
// scale). The block's amax is merged into *amax_out with an atomicMax on the float's bits (valid for
// values >= 0; order-independent, so deterministic).
// Block 0 writes scale_inv = 1 / scale (and, with CURRENT, the scale it used).
//   Delayed scaling (CURRENT = false): scale = *scale_in (from the amax history, no host sync).
//   Current scaling (CURRENT = true): fp8_amax first writes the tensor's amax; every block then derives
//   the same scale from it (fusedkit.fp8.recipes.current_scale rules, fp32, IEEE division).
// Bytes: delayed 3MN for 2-byte input (read x, write bytes); current 5MN (x read twice).
// Numerics: casts RNE with saturation (common/fp8.cuh), x * scale in fp32 without contraction, as the
// CPU reference (fusedkit/reference/fp8.py) does.
// fp8_cast_transpose<T, F, VEC, VT, CURRENT>: x viewed as 2-D (M x N) -> row-wise bytes (M x N) and
// transposed bytes (N x M) in one pass, same scale, amax fused. One block of 256 threads per 64 x 64
// tile: each thread loads two 16-byte vectors of the tile (VEC = 16 / sizeof(T) when N allows, else 1),
// casts them, stores the row-wise bytes (VEC bytes per store) and parks them in a shared-memory tile;
// after one barrier each thread gathers 8 bytes down a tile column and writes them as one 8-byte store
// of the transposed output (VT = 8 when M % 8 == 0, else byte stores). Bytes: 2MN read + 2 x MN
// written = 4MN for 2-byte input. Shared tile rows are padded by 8 bytes against bank conflicts.
// fp8_quantize_blocks<T, F, BLOCK, VEC, MX>: block scaling along the last dim of x (rows of K): MXFP8
// (BLOCK = 32, MX = true: E8M0 scale byte e + 127, e = ceil(log2(amax / fp8_max)) clamped to
// [-127, 127], data = sat(x * 2^-e)) or 1 x 128 blocks (BLOCK = 128, MX = false: fp32 scale_inv,
// scale = 2^floor(log2(fp8_max / amax)), 1 for an all-zero block or one holding inf (TE's rule),
// data = sat(x * scale)). Each thread
// owns 8 consecutive elements of a row (one 16-byte vector for 2-byte input; VEC = 1 when K % 8 != 0),
// BLOCK / 8 neighbouring lanes share one block and reduce its amax with shuffles; a partial block at
// the end of a row counts only its real elements (as the zero-padded reference does). Rows are walked
// warp by warp (grid-stride on whole warps, so the shuffles always see full warps). Bytes: 2MK read,
// MK written, plus MK / BLOCK scales.
// fp8_quantize_mx_cols<T, F, VEC>: column-wise MXFP8 (blocks of 32 rows of a column, Transformer
// Engine's columnwise layout: data in x's (M, N) layout, E8M0 scales (ceil(M / 32), N)); see the kernel.
// fp8_quantize_blocks_2d<T, F, VEC>: 128 x 128 blocks (DeepSeek weights): one block of 256 threads per
// tile, 16 threads x 8 elements per tile row, 16 rows per pass, the tile's 64 values per thread kept in
// registers as the raw input words (Raw8), all eight loads issued before the first use; amax (on the
// bits for 16-bit input) by shuffles and one shared-memory round; scale = 2^floor(log2(fp8_max / amax)) (1
// for an all-zero tile), fp32 scale_inv per tile. Bytes 2MK read + MK written.
// fp8_ct_tile<T, F, ACT, SUMS, VEC>: the fast cast-transpose, also fused with the bias gradient
// (cast_transpose_dbias) and with an activation's backward (dact_cast_transpose: g = dy * act'(x),
// ACT from common/act.cuh; ACT = -1 casts x itself; ACT = kGated + inner: a gated activation's backward,
// g = [dy * b * act'(a) | dy * act(a)] for x = [a | b] of N = 2H columns and dy of H, each thread's 8
// columns in one half, b loaded for the first half only: Transformer Engine's dswiglu / dgeglu
// cast-transpose with dbias; ACT = kGatedPaired + inner, the same without dbias: the grid covers dy's H
// columns and each thread writes both output sub-tiles, columns c and H + c, from one load of a, b and
// dy: 6MH bytes read instead of 8MH, 0.80 -> 0.95 of copy on the H100,
// ab_unroll_H100_2026-12-06T0803Z). The 64 x 64 kernel above moved every byte through shared memory
// one at a time (8 STS.U8 + 8 LDS.U8 per 16 input bytes, a barrier per tile, 32 B of loads in flight
// per thread) and reached 0.69-0.71 of copy on the H200. Here no data goes through
// shared memory:
//   Thread mapping: a block of 256 threads owns a 128 x 128 tile (one tile per block; with SUMS and a
//   dbias, 4 tiles down the rows, stride gridDim.y, so the partial sums stay few). A grid of 1-4 waves
//   of resident blocks walking their strip's tiles (the amax merged once per block) measured slower:
//   0.67-0.82 of copy against 0.85-0.87 (sweep_fp8_grid_2026-12-03T0949Z.json): block turnover hides
//   the load latency of a tile better than the loop inside a block. Warp w covers rows
//   32 (w & 3) .. +32 and columns 64 (w >> 2) .. +64 of the tile; lane = 8 rg + cg owns the 8 x 8
//   sub-tile at rows 8 rg, columns 8 cg of the warp's. Per sub-tile: 8 row loads of 16 B (fp32: 2 x 16
//   B) issued before any use (128 B in flight per thread; 1024 threads per SM: 128 KB per SM), the cast
//   (pairs through cvt.rn.satfinite, common/fp8.cuh), 8 row-wise 8-byte stores, an in-register 8 x 8
//   byte transpose (four 4 x 4 transposes of 8 byte-permutes each), 8 transposed 8-byte chunks.
//   Coalescing: a row-load instruction of a warp reads 4 rows x 128 contiguous bytes; a row-wise store
//   writes 4 rows x 64 B; the transposed chunks of a full tile go through shared memory and leave as one
//   128-byte line per out_t row (FK_CT_SMEM_T below); at the edges a transposed store writes 8 out_t
//   rows x 32 contiguous bytes (the 4 lanes of a column group), and the 4 row-warps of a block complete
//   each out_t row's 128-byte line of the tile. Why 128 x 128 and not 64 x 256: both output streams
//   then leave the block as whole 128-byte lines (row-wise 128 B per row, transposed 128 B per out_t
//   row) and the reads are 256 B per row.
//   Edges: M arbitrary (rows past M are masked; out_t stores narrow to 4 bytes or bytes when M % 8 != 0
//   and at the last row group); VEC = 8 needs N % 8 == 0 and 16-byte aligned inputs, VEC = 1 loads
//   scalars (any N, any alignment) and serves cast_transpose_dbias; the plain cast keeps the 64 x 64
//   kernel there, and dact_cast_transpose first writes g in fp32 (fp8_dact_values) and casts that with
//   fp8_ct_tile<float, F, -1, true, 1> (14MN instead of 6MN on those rare shapes, 30 fewer
//   instantiations to compile).
//   Scaling: delayed (scale_in) or current (amax_in given: scale from the amax pass, fp8_amax or
//   fp8_dact_values) decided at run time (one branch per block: half the instantiations of a template
//   flag). amax of the cast values (x, or g) merged per block with one atomicMax.
//   dbias (SUMS): each thread keeps fp32 sums of its 8 columns over its rows; per block they are added
//   across the warp's row groups (shuffles) and the 4 row-warps (shared memory) in a fixed order into
//   one fp32 partial row (blockIdx.y of a (gridDim.y, N) scratch); the last block of each 128-column
//   strip (a ticket counter per strip, zeroed by the caller) adds the gridDim.y partials in a fixed
//   order and writes dbias in T: deterministic, no second launch. SUMS is a template flag because a
//   run-time test inside the loop makes the compiler clone the loop (registers over the cap of 4
//   blocks per SM); dact instantiations always have it (a run-time null dbias skips only the final sum).
//   Bytes (2-byte T): cast 4MN, + dbias 4MN + (M / 512) x N x 8 partials, dact 6MN (read dy and x).
//   Instructions per element of the plain cast (PTX): about 6 (unpack 1, amax 1, scale 1, cvt 0.5,
//   selects 0.5, byte-permutes 0.75, stores and addresses the rest). Registers (sm_90a): plain 64
//   (4 blocks per SM), dbias 80 (3), dact about 100-128 (2; fp32 dact loads one row at a time, GeLU-erf
//   4 rows, to stay within 128 without spills).
//   Variants considered for dbias: atomicAdd of the block sums (not deterministic), a second column-sum
//   kernel over one partial row per 128-row tile (another launch and its tail, 16x more partials).
// Status: every kernel here is byte-exact against the CPU reference on the H200 (tests/test_fp8_quantize.py,
// test_fp8_cast_transpose.py, test_fp8_dact.py, test_fp8_blocks.py; GPU runs of 2026-12-03 and -04).
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/fp8.cuh"
#include "common/act.cuh"
#include "common/griddep.cuh"

namespace fk {

__device__ __forceinline__ float current_scale(float amax, float fp8_max, float eps, int pow2) {
  if (isfinite(amax)) amax = fmaxf(amax, eps);
  if (!isfinite(amax) || amax == 0.f) return 1.f;
  float s = __fdiv_rn(fp8_max, amax);
  if (isinf(s)) s = 3.402823466e38f;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & 0x7F800000u);
  return s;
}

// FK_AMAX_REVERSE = 1: the amax pass walks x from its end to its start, so the last tens of MB it reads
// (the head of x) are still in L2 when the cast that follows (fp8_quantize, fp8_ct_tile: both from the
// head) reads them again: up to the L2's ~50 MB of the second read of x come from L2 instead of DRAM
// (5MN -> ~5MN - 50 MB). Measured on the H200 (2026-12-05, ab_amax_reverse_softmax_full_2026-12-05T0428Z.json,
// 3 rounds, same bytes): +0.8-1.1 points of copy for current-scaling quantize / cast-transpose at
// 32768 x 4096 and 16384 x 8192, neutral for quantize at 16384 x 14336. The max does not depend on the
// order: same bits. On by default; 0 restores the forward walk.
#ifndef FK_AMAX_REVERSE
#define FK_AMAX_REVERSE 1
#endif

// The walk of fp8_amax and fp8_quantize over x's vectors (one pass, as cuda/activations.cu walks): block b
// owns UNROLL * blockDim.x consecutive vectors, thread t takes vectors t, t + blockDim.x, ... of them and
// issues all its loads before the first use; the host launches ceil(nvec / (UNROLL * blockDim.x)) blocks
// (cuda_fp8.onepass_blocks; a smaller grid still covers every vector: the chunks stride by the grid).
// It replaced a grid-stride loop over the resident blocks with two loads in flight per thread: on an
// H100 (tools/ab_unroll.py, 2026-12-06) delayed quantize 0.905 -> 0.957 of copy, current 0.947 -> 0.987
// (UNROLL = 2; 4 the same within 0.005), as the activations had gained 0.88 -> 0.95 leaving that loop.
template <typename T, int VEC, int UNROLL>
__global__ void __launch_bounds__(256)
fp8_amax(const T* __restrict__ x, float* __restrict__ amax_out, long long n) {
  griddep_launch_dependents();  // the cast after it starts at once and waits for the amax (common/griddep.cuh)
  const long long nvec = n / VEC;
  // vector v of the walk is x's vector at(v) (the walk's order: see FK_AMAX_REVERSE)
  auto at = [&](long long v) { return FK_AMAX_REVERSE ? x + (nvec - 1 - v) * VEC : x + v * VEC; };
  float m = 0.f;
  const long long chunk = (long long)blockDim.x * UNROLL;
  for (long long c = (long long)blockIdx.x * chunk + threadIdx.x; c < nvec; c += (long long)gridDim.x * chunk) {
    Vec<T, VEC> a[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k)
      if (c + (long long)k * blockDim.x < nvec) a[k] = load_vec<T, VEC>(at(c + (long long)k * blockDim.x));
#pragma unroll
    for (int k = 0; k < UNROLL; ++k)
      if (c + (long long)k * blockDim.x < nvec)
#pragma unroll
        for (int j = 0; j < VEC; ++j) m = fmaxf(m, fabsf(to_float(a[k].v[j])));
  }
  block_amax_merge(m, amax_out);
}

// One loaded vector cast to FP8 bytes at out, |x| merged into m. 16-byte vectors (VEC % 4 == 0): four
// values to a word (common/fp8.cuh store_fp8_vec: two F2FP per word, no byte inserts); odd sizes
// (VEC 1 or 2) pairwise.
template <typename T, typename F, int VEC>
__device__ __forceinline__ void quantize_vec(const Vec<T, VEC>& a, unsigned char* __restrict__ out, float scale,
                                             float& m) {
  if constexpr (VEC % 4 == 0) {
    float f[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = to_float(a.v[j]);
    store_fp8_vec<F, VEC>(out, f, scale, m);
  } else {
    Vec<unsigned char, VEC> q;
    if constexpr (VEC == 1) {
      const float f = to_float(a.v[0]);
      m = fmaxf(m, fabsf(f));
      q.v[0] = (unsigned char)(fp8x2_from_float<F>(__fmul_rn(f, scale), 0.f) & 0xFF);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; j += 2) {
        const float f0 = to_float(a.v[j]), f1 = to_float(a.v[j + 1]);
        m = fmaxf(m, fmaxf(fabsf(f0), fabsf(f1)));
        const unsigned short p = fp8x2_from_float<F>(__fmul_rn(f0, scale), __fmul_rn(f1, scale));
        q.v[j] = (unsigned char)(p & 0xFF);
        q.v[j + 1] = (unsigned char)(p >> 8);
      }
    }
    store_vec<unsigned char, VEC>(out, q);
  }
}

template <typename T, typename F, int VEC, bool CURRENT, int UNROLL>
__global__ void __launch_bounds__(256)
fp8_quantize(const T* __restrict__ x, unsigned char* __restrict__ out, const float* __restrict__ scale_in,
             const float* __restrict__ amax_in, float* __restrict__ scale_out, float* __restrict__ scale_inv_out,
             float* __restrict__ amax_out, long long n, float amax_epsilon, int pow2) {
  // current scaling: launched as the amax pass's programmatic dependent, so the scale is read after the
  // first chunk's loads are issued (x is the call's input) and the wait for the amax pass (ce_grad_scale
  // in cuda/cross_entropy.cu does the same with its count)
  auto current = [&] {
    griddep_wait();
    return current_scale(__ldcg(amax_in), F::MAX, amax_epsilon, pow2);
  };
  float scale = CURRENT ? 0.f : *scale_in;
  bool scaled = !CURRENT;
  const long long nvec = n / VEC;
  float m = 0.f;
  const long long chunk = (long long)blockDim.x * UNROLL;
  for (long long c = (long long)blockIdx.x * chunk + threadIdx.x; c < nvec; c += (long long)gridDim.x * chunk) {
    Vec<T, VEC> a[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k)
      if (c + (long long)k * blockDim.x < nvec) a[k] = load_vec<T, VEC>(x + (c + (long long)k * blockDim.x) * VEC);
    if (!scaled) {
      scale = current();
      scaled = true;
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const long long v = c + (long long)k * blockDim.x;
      if (v < nvec) quantize_vec<T, F, VEC>(a[k], out + v * VEC, scale, m);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (!scaled) scale = current();
    scale_inv_out[0] = __fdiv_rn(1.f, scale);
    if (CURRENT && scale_out != nullptr) scale_out[0] = scale;
  }
  if (amax_out != nullptr) block_amax_merge(m, amax_out);
}

// 2^-e as an fp32 (e in [-127, 127]; 2^-127... 2^127 exactly, 2^-127 subnormal).
__device__ __forceinline__ float exp2_neg(int e) {
  const int b = 127 - e;  // biased exponent of 2^-e
  return b >= 1 ? __uint_as_float((unsigned)b << 23) : __uint_as_float(0x00400000u >> (-b));
}

// Smallest e with 2^e >= v (v > 0 normal fp32), from the bits.
__device__ __forceinline__ int pow2_ceil_exponent(float v) {
  const unsigned bits = __float_as_uint(v);
  const int e = (int)((bits >> 23) & 0xFF) - 127;
  return (bits & 0x7FFFFFu) ? e + 1 : e;
}

// MXFP8 block exponent e (scale 2^e, E8M0 byte e + 127) of a block with amax am: ceil(log2(am / fp8_max))
// clamped to [-127, 127]; an all-zero block -127, a block holding inf 127.
template <typename F>
__device__ __forceinline__ int mx_exponent(float am) {
  int e;
  if (isinf(am)) e = 127;
  else if (am > 0.f) e = pow2_ceil_exponent(fmaxf(__fdiv_rn(am, F::MAX), 1.17549435e-38f));
  else e = -127;
  return max(-127, min(127, e));
}

// The multiplier of one thread's 8 values of a row chunk under block scaling: the amax of its block over
// the block's LANES = BLOCK / 8 neighbouring lanes (shuffles: every lane of the warp takes part, an idle
// one with zeros) and the block's power-of-two scale, written by the block's first lane (`lead`) to
// scale slot `slot` (MXFP8: the E8M0 byte; 1 x 128: the fp32 scale_inv). Both walks below use it.
template <typename F, int BLOCK, bool MX>
__device__ __forceinline__ float block_scale(const float (&v)[8], void* scales, bool lead, long long slot) {
  constexpr int LANES = BLOCK / 8;
  float am = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(v[j]));
#pragma unroll
  for (int off = LANES / 2; off > 0; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
  float mul;
  if constexpr (MX) {
    const int e = mx_exponent<F>(am);
    mul = exp2_neg(e);
    if (lead) static_cast<unsigned char*>(scales)[slot] = (unsigned char)(e + 127);
  } else {
    float q = (am > 0.f && !isinf(am)) ? __fdiv_rn(F::MAX, am) : 1.f;  // zero or inf block: 1
    if (isinf(q)) q = 3.402823466e38f;
    mul = __uint_as_float(__float_as_uint(q) & 0x7F800000u);  // power of two <= q
    if (lead) static_cast<float*>(scales)[slot] = __fdiv_rn(1.f, mul);
  }
  return mul;
}

// UNROLL = 0: the walk described at the top (grid-stride over whole warps, any K). UNROLL > 0
// (cuda_fp8.BLOCKS_UNROLL = 2, the host's pick for VEC = 8 and K % BLOCK == 0, rows made of whole
// blocks): x is then a flat run of n / 8 vectors in which vector v's block is v / LANES, so no row or
// column is derived (the walk above divides a 64-bit index per step); one pass as fp8_quantize walks
// (block b owns UNROLL x blockDim.x consecutive vectors, all loads first), the loop bound uniform per
// block so that the shuffles always see whole warps. H100 (2026-12-06, tools/ab_unroll.py, 3 rounds):
// MXFP8 0.75-0.77 -> 0.97-0.99 of copy, 1 x 128 0.89-0.91 -> 0.96-0.99 (UNROLL 4 the same within 0.003).
template <typename T, typename F, int BLOCK, int VEC, bool MX, int UNROLL = 0>
__global__ void __launch_bounds__(256)
fp8_quantize_blocks(const T* __restrict__ x, unsigned char* __restrict__ out, void* __restrict__ scales,
                    long long M, int K) {
  constexpr int LANES = BLOCK / 8;  // threads per block of BLOCK elements
  if constexpr (UNROLL > 0) {
    static_assert(VEC == 8, "the flat walk loads whole 8-element vectors");
    const long long nvec = M * K / 8, chunk = (long long)blockDim.x * UNROLL;
    for (long long base = (long long)blockIdx.x * chunk; base < nvec; base += (long long)gridDim.x * chunk) {
      float v[UNROLL][8];
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) {
        const long long i = base + (long long)k * blockDim.x + threadIdx.x;
        if (i < nvec) {
          const Vec<T, 8> a = load_vec<T, 8>(x + i * 8);
#pragma unroll
          for (int j = 0; j < 8; ++j) v[k][j] = to_float(a.v[j]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) v[k][j] = 0.f;
        }
      }
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) {
        const long long i = base + (long long)k * blockDim.x + threadIdx.x;
        const float mul = block_scale<F, BLOCK, MX>(v[k], scales, i < nvec && i % LANES == 0, i / LANES);
        float unused_amax = 0.f;
        if (i < nvec) store_vec<unsigned char, 8>(out + i * 8, cast_fp8_vec<F, 8>(v[k], mul, unused_amax));
      }
    }
    return;
  }
  const int lane = threadIdx.x & 31;
  const int blocks_per_row = (K + BLOCK - 1) / BLOCK;
  const long long chunks_per_row = (long long)blocks_per_row * LANES;
  const long long total = M * chunks_per_row;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long t0 = (long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31); t0 < total; t0 += stride) {
    const long long t = t0 + lane;
    const bool active = t < total;
    const long long row = active ? t / chunks_per_row : 0;
    const int chunk = active ? (int)(t - row * chunks_per_row) : 0;
    const int col0 = chunk * 8;
    float v[8];
    if (VEC == 8 && active && col0 < K) {  // K % 8 == 0: the 8 elements are all in the row
      const Vec<T, 8> a = load_vec<T, 8>(x + row * K + col0);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(a.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = (active && col0 + j < K) ? to_float(x[row * K + col0 + j]) : 0.f;
    }
    const float mul = block_scale<F, BLOCK, MX>(v, scales, active && chunk % LANES == 0,
                                                row * blocks_per_row + chunk / LANES);
    if (!active || col0 >= K) continue;
    float unused_amax = 0.f;
    const Vec<unsigned char, 8> q8 = cast_fp8_vec<F, 8>(v, mul, unused_amax);
    if (VEC == 8) {
      store_vec<unsigned char, 8>(out + row * K + col0, q8);
    } else {
      for (int j = 0; j < 8 && col0 + j < K; ++j) out[row * K + col0 + j] = q8.v[j];
    }
  }
}

// 8 consecutive elements of T as raw 32-bit words: 4 words (2-byte T, element 2k in the low half of
// word k) or 8 (fp32); 16-byte aligned, so one in memory loads as LDG.E.128. The unit fp8_ct_tile and
// the 128 x 128 kernel hold their input in: held as fp32 values or as Vec<bf16, 8>, ptxas kept one
// element per register (the 128 x 128 kernel: 64 + 33 = 97 registers, 2 blocks per SM; as words, 74).
template <typename T>
struct alignas(16) Raw8 {
  static constexpr int W = 8 * sizeof(T) / 4;
  unsigned w[W];
};
__device__ __forceinline__ unsigned raw_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned raw_bits(bf16 v) { return v.bits; }
__device__ __forceinline__ unsigned raw_bits(f16 v) { return v.bits; }

// 8 elements of one row as a Raw8 (fp8_ct_tile: a row of the thread's 8 x 8 sub-tile; the 128 x 128
// kernel's scalar path). For a row past M (row_ok false) fp8_ct_tile passes the sub-tile's first row
// (so every load is in bounds); such rows and columns past ncols read as 0 (never stored, adding
// nothing to amax or dbias). VEC = 8 (N % 8 == 0, 16-byte aligned input): 16-byte loads; VEC = 1:
// predicated scalar loads, any N and alignment.
template <typename T, int VEC>
__device__ __forceinline__ Raw8<T> ct_load_row(const T* p, bool row_ok, int ncols) {
  Raw8<T> r;
  if constexpr (VEC == 8) {
#pragma unroll
    for (int l = 0; l < Raw8<T>::W / 4; ++l) {
      const uint4 u = *reinterpret_cast<const uint4*>(p + l * (16 / sizeof(T)));
      r.w[4 * l] = row_ok ? u.x : 0u;
      r.w[4 * l + 1] = row_ok ? u.y : 0u;
      r.w[4 * l + 2] = row_ok ? u.z : 0u;
      r.w[4 * l + 3] = row_ok ? u.w : 0u;
    }
  } else {
#pragma unroll
    for (int j = 0; j < Raw8<T>::W; ++j) r.w[j] = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned v = (row_ok && j < ncols) ? raw_bits(p[j]) : 0u;  // a predicated load
      if constexpr (sizeof(T) == 4) r.w[j] = v;
      else r.w[j >> 1] |= (j & 1) ? (v << 16) : v;
    }
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float raw_elem(const Raw8<T>& r, int j) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(r.w[j]);
  } else if constexpr (IsBf16<T>::value) {
    return __uint_as_float((j & 1) ? (r.w[j >> 1] & 0xFFFF0000u) : (r.w[j >> 1] << 16));
  } else {
    return to_float(T{(unsigned short)((j & 1) ? (r.w[j >> 1] >> 16) : (r.w[j >> 1] & 0xFFFFu))});
  }
}

// The largest |element| of one Raw8 folded into acc, NaN left out (as fmaxf leaves it). fp32: as
// floats. 16-bit input on the bits, two at a time: sign cleared, a NaN (bits above the infinity's)
// zeroed, unsigned 16-bit max (sign-magnitude bits order as the values do); acc then holds two
// magnitudes' bits, raw8_amax_value turns it into the fp32 amax.
template <typename T>
__device__ __forceinline__ unsigned raw8_amax(unsigned acc, const Raw8<T>& a) {
  if constexpr (sizeof(T) == 4) {
    float am = __uint_as_float(acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(raw_elem<T>(a, j)));
    return __float_as_uint(am);
  } else {
    constexpr unsigned INF2 = IsBf16<T>::value ? 0x7F807F80u : 0x7C007C00u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned h = a.w[k] & 0x7FFF7FFFu;
      acc = __vmaxu2(acc, h & ~__vcmpgtu2(h, INF2));
    }
    return acc;
  }
}
template <typename T>
__device__ __forceinline__ float raw8_amax_value(unsigned acc) {
  if constexpr (sizeof(T) == 4) return __uint_as_float(acc);
  else return fmaxf(to_float(T{(unsigned short)(acc & 0xFFFFu)}), to_float(T{(unsigned short)(acc >> 16)}));
}

template <typename T, typename F, int VEC>
__global__ void __launch_bounds__(256)
fp8_quantize_blocks_2d(const T* __restrict__ x, unsigned char* __restrict__ out, float* __restrict__ scale_inv,
                       long long M, int K) {
  constexpr int PASSES = 8;  // 128 rows / 16 rows per pass
  const int tc = (threadIdx.x & 15) * 8, tr = threadIdx.x >> 4;
  const long long r0 = (long long)blockIdx.y * 128;
  const int c = blockIdx.x * 128 + tc;
  Raw8<T> a[PASSES];
  // all loads first: a row past M (or a chunk past K) is zeros, with no branch around the loads
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const long long r = r0 + tr + 16 * p;
    if constexpr (VEC == 8) {  // K % 8 == 0: the 8 elements are all in the row or all past it
      a[p] = (r < M && c < K) ? *reinterpret_cast<const Raw8<T>*>(x + r * K + c) : Raw8<T>{};
    } else {
      a[p] = ct_load_row<T, 1>(x + r * K + c, r < M, K - c);
    }
  }
  unsigned acc = 0;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) acc = raw8_amax(acc, a[p]);
  float am = raw8_amax_value<T>(acc);
  __shared__ float part[8];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = am;
  __syncthreads();
  am = part[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) am = fmaxf(am, part[i]);
  float q = (am > 0.f && !isinf(am)) ? __fdiv_rn(F::MAX, am) : 1.f;  // zero or inf tile: 1
  if (isinf(q)) q = 3.402823466e38f;
  const float scale = __uint_as_float(__float_as_uint(q) & 0x7F800000u);  // power of two <= q
  if (threadIdx.x == 0) scale_inv[blockIdx.y * (long long)gridDim.x + blockIdx.x] = __fdiv_rn(1.f, scale);
  float unused_amax = 0.f;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const long long r = r0 + tr + 16 * p;
    if (r >= M || c >= K) continue;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = raw_elem<T>(a[p], j);
    const Vec<unsigned char, 8> q8 = cast_fp8_vec<F, 8>(v, scale, unused_amax);
    if (VEC == 8) {
      store_vec<unsigned char, 8>(out + r * K + c, q8);
    } else {
      for (int j = 0; j < 8 && c + j < K; ++j) out[r * K + c + j] = q8.v[j];
    }
  }
}

// Column-wise MXFP8: blocks of 32 rows of each column of x (M x N). Each grid-stride work item is one
// block row (32 rows) x VEC neighbouring columns (VEC = 8 / sizeof(T): one 8-byte load per row; 1 when
// N or a pointer does not allow): the 32 row vectors are loaded first (a warp reads 256 contiguous
// bytes per row), the VEC column amaxes give the E8M0 scales (row rb of the (ceil(M / 32), N) scale
// array), then each row's VEC bytes are cast and stored. Rows past M (last block) are loaded from the
// block's first row and left out of amax and the stores. Bytes: 2MN read, MN + MN / 32 written.
template <typename T, typename F, int VEC>
__global__ void __launch_bounds__(256)
fp8_quantize_mx_cols(const T* __restrict__ x, unsigned char* __restrict__ out, unsigned char* __restrict__ scales,
                     long long M, int N) {
  const int groups = N / VEC;  // VEC divides N
  const long long total = ((M + 31) / 32) * groups;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < total; w += stride) {
    const long long rb = w / groups;
    const int col = (int)(w - rb * groups) * VEC;
    const long long r0 = rb * 32;
    const int nr = (int)min(32LL, M - r0);
    const T* src = x + r0 * N + col;
    Vec<T, VEC> v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = load_vec<T, VEC>(src + (i < nr ? (long long)i * N : 0LL));
    float mul[VEC];
    Vec<unsigned char, VEC> sc;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float am = 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (i < nr) am = fmaxf(am, fabsf(to_float(v[i].v[j])));
      const int e = mx_exponent<F>(am);
      mul[j] = exp2_neg(e);
      sc.v[j] = (unsigned char)(e + 127);
    }
    store_vec<unsigned char, VEC>(scales + rb * N + col, sc);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      if (i >= nr) break;
      Vec<unsigned char, VEC> q;
      if constexpr (VEC == 1) {
        q.v[0] = (unsigned char)(fp8x2_from_float<F>(__fmul_rn(to_float(v[i].v[0]), mul[0]), 0.f) & 0xFF);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; j += 2) {
          const unsigned short p = fp8x2_from_float<F>(__fmul_rn(to_float(v[i].v[j]), mul[j]),
                                                       __fmul_rn(to_float(v[i].v[j + 1]), mul[j + 1]));
          q.v[j] = (unsigned char)(p & 0xFF);
          q.v[j + 1] = (unsigned char)(p >> 8);
        }
      }
      store_vec<unsigned char, VEC>(out + (r0 + i) * N + col, q);
    }
  }
}

constexpr int kCtTile = 64;
constexpr int kCtThreads = 256;

template <typename T, typename F, int VEC, int VT, bool CURRENT>
__global__ void __launch_bounds__(kCtThreads)
fp8_cast_transpose(const T* __restrict__ x, unsigned char* __restrict__ out,
                   unsigned char* __restrict__ out_t, const float* __restrict__ scale_in,
                   const float* __restrict__ amax_in, float* __restrict__ scale_out,
                   float* __restrict__ scale_inv_out, float* __restrict__ amax_out, long long M, int N,
                   float amax_epsilon, int pow2) {
  __shared__ unsigned char tile[kCtTile][kCtTile + 8];
  if (CURRENT) griddep_wait();  // current scaling: the amax pass just before (a programmatic dependent)
  const float scale = CURRENT ? current_scale(__ldcg(amax_in), F::MAX, amax_epsilon, pow2) : *scale_in;
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    scale_inv_out[0] = __fdiv_rn(1.f, scale);
    if (CURRENT && scale_out != nullptr) scale_out[0] = scale;
  }
  const long long r0 = (long long)blockIdx.y * kCtTile;
  const int c0 = blockIdx.x * kCtTile;
  constexpr int VPR = kCtTile / VEC;  // vectors per tile row
  float m = 0.f;
  // Phase 1: row-wise cast of the tile, bytes also parked in shared memory.
  for (int idx = threadIdx.x; idx < kCtTile * VPR; idx += kCtThreads) {
    const int tr = idx / VPR, tc = (idx % VPR) * VEC;
    const long long r = r0 + tr;
    const int c = c0 + tc;
    if (r < M && c < N) {  // VEC > 1 implies N % VEC == 0: the vector is whole
      const Vec<T, VEC> a = load_vec<T, VEC>(x + r * N + c);
      float f[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = to_float(a.v[j]);
      const Vec<unsigned char, VEC> q = cast_fp8_vec<F, VEC>(f, scale, m);
      store_vec<unsigned char, VEC>(out + r * N + c, q);
#pragma unroll
      for (int j = 0; j < VEC; ++j) tile[tr][tc + j] = q.v[j];
    }
  }
  __syncthreads();
  // Phase 2: transposed rows (tile columns), 8 bytes of consecutive input rows per thread.
  constexpr int CHUNKS = kCtTile / 8;  // 8-byte chunks per transposed tile row
  for (int idx = threadIdx.x; idx < kCtTile * CHUNKS; idx += kCtThreads) {
    const int tc = idx / CHUNKS, tr = (idx % CHUNKS) * 8;
    const int c = c0 + tc;
    const long long r = r0 + tr;
    if (c >= N || r >= M) continue;
    unsigned char* dst = out_t + (long long)c * M + r;
    if (VT == 8 && r + 8 <= M) {
      Vec<unsigned char, 8> q;
#pragma unroll
      for (int j = 0; j < 8; ++j) q.v[j] = tile[tr + j][tc];
      store_vec<unsigned char, 8>(dst, q);
    } else {
      for (int j = 0; j < 8 && r + j < M; ++j) dst[j] = tile[tr + j][tc];
    }
  }
  if (amax_out != nullptr) block_amax_merge(m, amax_out);
}

// ---------------------------------------------------------------------------------------------------
// The fast cast-transpose family: fp8_ct_tile<T, F, ACT, SUMS, VEC> (see the header comment).

constexpr int kFtTile = 128;     // block tile: 128 rows x 128 columns
constexpr int kFtThreads = 256;  // 8 warps, 4 (rows) x 2 (columns); a warp covers 32 rows x 64 columns
constexpr int kNoAct = -1;       // ACT of the plain cast (g = x)

// ACT >= kGated: the gated activation of inner ACT % kGated (SwiGLU: SiLU, GeGLU: GeLU, ReGLU: ReLU) on
// x = [a | b] (halves of the last dim): y = act(a) * b, so dx = [dy * b * act'(a) | dy * act(a)].
// ACT >= kGatedPaired (the gated casts without dbias): fp8_ct_tile's blocks cover the H columns of dy
// and write both output halves (see there).
constexpr int kGated = 16;
constexpr int kGatedPaired = 32;

// One element of a gated activation's gradient: (dy * b) * act'(a) in the first half, dy * act(a) in
// the second (fp32, the reference's order of operations).
template <int ACT>
__device__ __forceinline__ float gated_value(bool first, float a, float b, float d) {
  constexpr int INNER = ACT % kGated;
  return first ? (d * b) * dact_f<INNER>(a) : d * act_f<INNER>(a);
}

// The value that is cast: x itself (ACT = kNoAct) or the activation gradient dy * act'(x).
template <int ACT>
__device__ __forceinline__ float ct_value(float xv, float d) {
  if constexpr (ACT < 0) {
    return xv;
  } else {
    return d * dact_f<ACT>(xv);
  }
}

// 8 values -> 8 FP8 bytes sat(v * scale) as two words (byte k = value k), |v| merged into amax: the
// arithmetic of common/fp8.cuh's cast_fp8_vec, four values per word through fp8x4_from_float (two
// conversions writing the word's halves: no byte inserts or permutes).
template <typename F>
__device__ __forceinline__ uint2 cast_fp8_x8(const float (&v)[8], float scale, float& amax) {
#pragma unroll
  for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fmaxf(fabsf(v[2 * k]), fabsf(v[2 * k + 1])));
  return make_uint2(fp8x4_from_float<F>(__fmul_rn(v[0], scale), __fmul_rn(v[1], scale), __fmul_rn(v[2], scale),
                                        __fmul_rn(v[3], scale)),
                    fp8x4_from_float<F>(__fmul_rn(v[4], scale), __fmul_rn(v[5], scale), __fmul_rn(v[6], scale),
                                        __fmul_rn(v[7], scale)));
}

// 4 x 4 byte transpose: byte i of b_k = byte k of a_i (8 byte permutes).
__device__ __forceinline__ void transpose_4x4_bytes(unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                    unsigned& b0, unsigned& b1, unsigned& b2, unsigned& b3) {
  const unsigned t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);  // a0k a1k a0k' a1k'
  const unsigned t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
  b0 = __byte_perm(t0, t2, 0x5410);
  b1 = __byte_perm(t0, t2, 0x7632);
  b2 = __byte_perm(t1, t3, 0x5410);
  b3 = __byte_perm(t1, t3, 0x7632);
}

// The first n (<= 8) bytes of (lo, hi) to dst; w: the widest access dst's alignment allows (8, 4 or
// less). Edge cases (n < 8, w < 4) store bytes.
__device__ __forceinline__ void store_bytes8(unsigned char* dst, unsigned lo, unsigned hi, int n, int w) {
  if (n == 8 && w == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
  } else if (n == 8 && w == 4) {
    reinterpret_cast<unsigned*>(dst)[0] = lo;
    reinterpret_cast<unsigned*>(dst)[1] = hi;
  } else {
#pragma unroll 1
    for (int k = 0; k < n; ++k) dst[k] = (unsigned char)(((k < 4 ? lo : hi) >> (8 * (k & 3))) & 0xFFu);
  }
}

// dbias of the block's 128-column strip: the threads' column sums -> one fp32 partial row per block
// (row blockIdx.y of part, fixed-order adds), then the last block of the strip to finish (a ticket
// per strip in count, zeroed by the caller and left zeroed) adds the gridDim.y partial rows in a fixed
// order: deterministic whichever block comes last. Every thread of the block calls it.
template <typename T>
__device__ __forceinline__ void ct_dbias_finish(float (&csum)[8], int tcol, float* __restrict__ part,
                                                unsigned* __restrict__ count, T* __restrict__ dbias, int N) {
  __shared__ float red[4][kFtTile];
  __shared__ unsigned last;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // the warp's 4 row groups (lanes cg, cg + 8, cg + 16, cg + 24)
    csum[j] += __shfl_xor_sync(0xffffffffu, csum[j], 8);
    csum[j] += __shfl_xor_sync(0xffffffffu, csum[j], 16);
  }
  if (lane < 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) red[warp & 3][tcol + j] = csum[j];
  }
  __syncthreads();
  const int cb = blockIdx.x * kFtTile;
  if (t < kFtTile && cb + t < N)
    part[(long long)blockIdx.y * N + cb + t] = ((red[0][t] + red[1][t]) + red[2][t]) + red[3][t];
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(count + blockIdx.x, 1u) == gridDim.y - 1 ? 1u : 0u;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int col = t & (kFtTile - 1), half = t >> 7;  // two lanes of partial rows per column
  float s = 0.f;
  if (cb + col < N) {
#pragma unroll 8
    for (int p = half; p < (int)gridDim.y; p += 2) s += __ldcg(part + (long long)p * N + cb + col);
  }
  red[half][col] = s;
  __syncthreads();
  if (t < kFtTile && cb + t < N) dbias[cb + t] = from_float<T>(red[0][t] + red[1][t]);
  if (t == 0) count[blockIdx.x] = 0u;
}

// Transposed bytes through shared memory (FK_CT_SMEM_T, default 1; 0 = each sub-tile's 8-byte column
// chunks stored straight to out_t, A/B: tools/ab_nvrtc_options.py): a full tile's chunks are parked in
// 16 KB of shared memory and each out_t row of the tile then leaves as one 128-byte line (16 lanes x 8
// bytes) instead of four 32-byte pieces from four warps. Nsight Compute had the direct stores at L2
// throughput 87 % against DRAM 77 % (32768 x 4096); with the shared tile the plain cast-transpose read
// 0.886 / 0.884 / 0.896 of copy against 0.864 / 0.860 / 0.874 (ab_ct_smem_t_2026-12-04T1945Z.json). A
// chunk (row / 8, column c) sits at chunk (row / 8) ^ ((c >> 1) & 15) of tile column c: 16 distinct
// chunks among a warp's 32 lanes on the way in, a row's 16 chunks on distinct bank pairs on the way out.
// Tiles at the tensor's edges (or out_t rows not 8-byte aligned) keep the direct stores, and so do the
// dact instantiations (ptxas spilled 4-12 bytes with the shared tile even at 2 blocks per SM).
// cast_transpose_dbias (SUMS, ACT < 0) takes the shared tile at 2 blocks per SM instead of 3 (no
// spills): 0.841 / 0.843 / 0.882 -> 0.860 / 0.864 / 0.882 of copy on the H100 (3 rounds,
// ab_nvrtc_options_H100_2026-12-06T0803Z). 3 blocks per SM with the shared tile (bf16: 80 registers
// against 102, no spills) lost up to 1.4 points (ab_ct_sums_blocks_H100_2026-12-06T0843Z.json).
// The dact ones likewise: at 3 blocks per SM (80 registers, 2 or 4 rows per load batch so nothing
// spills) dgelu + dbias lost 4-7 points (0.864 -> 0.80; ab_dact_blocks_H100_2026-12-06T0845Z.json):
// the rows in flight per thread matter more to them than the resident blocks.
#ifndef FK_CT_SMEM_T
#define FK_CT_SMEM_T 1
#endif
// Two ways of keeping the multi-tile (dbias) blocks' loads in flight between tiles lost on the H100 and
// were removed: an L2 bulk prefetch of the next tile's rows (dbias 0.87 -> 0.78, dgelu + dbias 0.86 ->
// 0.62; ab_ct_prefetch_H100_2026-12-06T1129Z.json) and software-pipelining the tiles in parts of 2 rows
// (dgelu + dbias 0.86 -> 0.84; ab_ct_pipe_H100_2026-12-06T1138Z.json). docs/perf_notes.rst has both.

// The sub-tile's 8 FP8 rows (lo / hi: columns 0-3 / 4-7) as its 8 columns (tlo / thi: rows 0-3 / 4-7).
__device__ __forceinline__ void ct_transpose8(const unsigned (&lo)[8], const unsigned (&hi)[8], unsigned (&tlo)[8],
                                              unsigned (&thi)[8]) {
  transpose_4x4_bytes(lo[0], lo[1], lo[2], lo[3], tlo[0], tlo[1], tlo[2], tlo[3]);
  transpose_4x4_bytes(lo[4], lo[5], lo[6], lo[7], thi[0], thi[1], thi[2], thi[3]);
  transpose_4x4_bytes(hi[0], hi[1], hi[2], hi[3], tlo[4], tlo[5], tlo[6], tlo[7]);
  transpose_4x4_bytes(hi[4], hi[5], hi[6], hi[7], thi[4], thi[5], thi[6], thi[7]);
}

// The transposed sub-tile to out_t rows dst, dst + M, ... (one 8-byte chunk each; narrower at the edges).
__device__ __forceinline__ void ct_store_t(const unsigned (&tlo)[8], const unsigned (&thi)[8], unsigned char* dst,
                                           long long M, int nrows, int ncols, int tw) {
  if (nrows == 8 && tw == 8 && ncols == 8) {  // every sub-tile but those at the tensor's edges
#pragma unroll
    for (int j = 0; j < 8; ++j) *reinterpret_cast<uint2*>(dst + j * M) = make_uint2(tlo[j], thi[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < ncols) store_bytes8(dst + j * M, tlo[j], thi[j], nrows, tw);
  }
}

template <typename T, typename F, int ACT, bool SUMS, int VEC>
__global__ void __launch_bounds__(kFtThreads,
                                  (ACT < 0 && sizeof(T) == 2 && VEC == 8) ? (SUMS ? 2 : 4)
                                  : ((ACT >= kGated && sizeof(T) == 4) || ACT == kGatedPaired + GELU_ERF) ? 1 : 2)
fp8_ct_tile(const T* __restrict__ x, const T* __restrict__ dy, unsigned char* __restrict__ out,
            unsigned char* __restrict__ out_t, const float* __restrict__ scale_in,
            const float* __restrict__ amax_in, float* __restrict__ scale_out, float* __restrict__ scale_inv_out,
            float* __restrict__ amax_out, float* __restrict__ dbias_part, unsigned* __restrict__ dbias_count,
            T* __restrict__ dbias, long long M, int N, float amax_epsilon, int pow2) {
  const bool current = amax_in != nullptr;
  // current scaling: launched as the programmatic dependent of the amax pass (or of fp8_dact_values,
  // which may also have written x = g): nothing is read before the wait
  if (current) griddep_wait();
  const float scale = current ? current_scale(__ldcg(amax_in), F::MAX, amax_epsilon, pow2) : *scale_in;
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    scale_inv_out[0] = __fdiv_rn(1.f, scale);
    if (current && scale_out != nullptr) scale_out[0] = scale;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int trow = (warp & 3) * 32 + (lane >> 3) * 8;  // the thread's 8 x 8 sub-tile in the block tile
  const int tcol = (warp >> 2) * 64 + (lane & 7) * 8;
  constexpr bool PAIRED = ACT >= kGatedPaired;
  const int c0 = blockIdx.x * kFtTile + tcol;  // PAIRED: a column of dy (the grid covers H = N / 2)
  // <= 0: no columns here (the thread still joins the reductions)
  const int ncols = min(8, (PAIRED ? N >> 1 : N) - c0);
  const int tw = (M & 7) == 0 ? 8 : (M & 3) == 0 ? 4 : (M & 1) == 0 ? 2 : 1;  // out_t row alignment
  const long long m_tiles = (M + kFtTile - 1) / kFtTile;
  constexpr bool GATED = ACT >= kGated;
  // rows per load batch (the gated kinds: three loads per row in the first half; at 4 rows SwiGLU
  // spilled under the cap of 2 blocks per SM, and fp32 input at 1 row: that one gets 1 block per SM;
  // PAIRED holds two output sub-tiles: 2 rows (spilled at 4; GeGLU-erf at any: 1 block per SM for it))
  constexpr int RB = VEC == 1 ? 2 : ACT < 0 ? 8 : sizeof(T) == 4 ? 1 : (PAIRED || ACT == kGated + SILU) ? 2
                   : (GATED || ACT == GELU_ERF) ? 4 : 8;
  // gated: the thread's 8 columns lie in one half (the host asks H % 8 == 0); a, b and dy column gc
  const int H = N >> 1;
  const bool first = !GATED || PAIRED || c0 < H;
  const int gc = first ? c0 : c0 - H;
  float am = 0.f;
  float csum[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) csum[j] = 0.f;
  for (long long by = blockIdx.y; by < m_tiles; by += gridDim.y) {
    const long long r0 = by * kFtTile + trow;
    if (ncols <= 0 || r0 >= M) continue;
    const int nrows = (int)min(8LL, M - r0);
    const long long base = r0 * N + c0;  // the sub-tile's first element
    unsigned lo[8], hi[8];  // the sub-tile's FP8 rows: columns 0-3 (lo) and 4-7 (hi)
    unsigned lo2[PAIRED ? 8 : 1], hi2[PAIRED ? 8 : 1];  // PAIRED: the second half's (column H + c0)
#pragma unroll
    for (int b = 0; b < 8; b += RB) {  // RB rows of loads issued before any of them is used
      Raw8<T> a[RB], d[RB], e[GATED ? RB : 1];  // e: the gated activation's b (first half only)
#pragma unroll
      for (int k = 0; k < RB; ++k) {
        const bool row_ok = b + k < nrows;
        const long long off = row_ok ? (long long)(b + k) * N : 0;  // rows past M read row r0 (in bounds)
        if constexpr (GATED) {  // x rows of N = 2H, dy rows of H
          const long long row = r0 + (row_ok ? b + k : 0);
          a[k] = ct_load_row<T, VEC>(x + row * N + gc, row_ok, ncols);
          d[k] = ct_load_row<T, VEC>(dy + row * H + gc, row_ok, ncols);
          if (first) e[k] = ct_load_row<T, VEC>(x + row * N + H + gc, row_ok, ncols);
          else e[k] = Raw8<T>{};
        } else {
          a[k] = ct_load_row<T, VEC>(x + base + off, row_ok, ncols);
          if constexpr (ACT >= 0) d[k] = ct_load_row<T, VEC>(dy + base + off, row_ok, ncols);
        }
      }
#pragma unroll
      for (int k = 0; k < RB; ++k) {
        const int i = b + k;
        float g[8], g2[PAIRED ? 8 : 1];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (PAIRED) {
            const float av = raw_elem<T>(a[k], j), dv = raw_elem<T>(d[k], j);
            g[j] = gated_value<ACT>(true, av, raw_elem<T>(e[k], j), dv);
            g2[j] = gated_value<ACT>(false, av, 0.f, dv);
          } else if constexpr (GATED) {
            g[j] = gated_value<ACT>(first, raw_elem<T>(a[k], j), raw_elem<T>(e[k], j), raw_elem<T>(d[k], j));
          } else {
            g[j] = ct_value<ACT>(raw_elem<T>(a[k], j), ACT >= 0 ? raw_elem<T>(d[k], j) : 0.f);
          }
          if constexpr (SUMS && !PAIRED) csum[j] += g[j];  // (a run-time branch here would clone the loop)
        }
        const uint2 u = cast_fp8_x8<F>(g, scale, am);
        lo[i] = u.x;
        hi[i] = u.y;
        if (i < nrows) store_bytes8(out + base + (long long)i * N, u.x, u.y, VEC == 8 ? 8 : ncols, VEC == 8 ? 8 : 1);
        if constexpr (PAIRED) {  // VEC = 8
          const uint2 u2 = cast_fp8_x8<F>(g2, scale, am);
          lo2[i] = u2.x;
          hi2[i] = u2.y;
          if (i < nrows) store_bytes8(out + base + H + (long long)i * N, u2.x, u2.y, 8, 8);
        }
      }
    }
    unsigned tlo[8], thi[8];  // transposed: column j of the sub-tile, rows 0-3 (tlo) and 4-7 (thi)
    ct_transpose8(lo, hi, tlo, thi);
    // the plain cast and cast_transpose_dbias (the dact ones spilled with it)
    if constexpr (FK_CT_SMEM_T && ACT < 0 && VEC == 8) {
      __shared__ uint2 tsm[kFtTile][kFtTile / 8];  // [tile column][swizzled row chunk]: 16 KB
      const long long tr0 = by * kFtTile;
      const int tc0 = blockIdx.x * kFtTile;
      if (tr0 + kFtTile <= M && tc0 + kFtTile <= N && tw == 8) {  // a full tile (block-uniform)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = tcol + j;
          tsm[c][(trow >> 3) ^ ((c >> 1) & 15)] = make_uint2(tlo[j], thi[j]);
        }
        __syncthreads();
        const int k = lane & 15;  // the row chunk this lane writes; lanes 0-15 and 16-31 take two rows
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int c = warp * 16 + q * 2 + (lane >> 4);
          *reinterpret_cast<uint2*>(out_t + (long long)(tc0 + c) * M + tr0 + k * 8) = tsm[c][k ^ ((c >> 1) & 15)];
        }
        if (by + gridDim.y < m_tiles) __syncthreads();  // tsm is refilled by the next tile
        continue;
      }
    }
    // out_t row c0 + j starts j * M further
    ct_store_t(tlo, thi, out_t + (long long)c0 * M + r0, M, nrows, ncols, tw);
    if constexpr (PAIRED) {
      ct_transpose8(lo2, hi2, tlo, thi);
      ct_store_t(tlo, thi, out_t + (long long)(H + c0) * M + r0, M, nrows, ncols, tw);
    }
  }
  if (amax_out != nullptr) block_amax_merge(am, amax_out);
  if (SUMS && dbias_part != nullptr) ct_dbias_finish<T>(csum, tcol, dbias_part, dbias_count, dbias, N);
}

// g = dy * act'(x) over n elements (the same ct_value as fp8_ct_tile): its amax merged into amax_out
// (the first pass of current scaling) and / or g written in fp32 to g_out (the fallback of
// dact_cast_transpose when N % 8 != 0 or a pointer is misaligned: fp8_ct_tile<float, F, -1, true, 1>
// then casts g); either pointer may be null. Grid-stride over VEC-element vectors.
template <typename T, int ACT, int VEC>
__global__ void __launch_bounds__(256)
fp8_dact_values(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ amax_out,
                float* __restrict__ g_out, long long n) {
  griddep_launch_dependents();
  const long long nvec = n / VEC, stride = (long long)gridDim.x * blockDim.x;
  float m = 0.f;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    const Vec<T, VEC> a = load_vec<T, VEC>(x + v * VEC);
    const Vec<T, VEC> d = load_vec<T, VEC>(dy + v * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float g = ct_value<ACT>(to_float(a.v[j]), to_float(d.v[j]));
      m = fmaxf(m, fabsf(g));
      if (g_out != nullptr) g_out[v * VEC + j] = g;
    }
  }
  if (amax_out != nullptr) block_amax_merge(m, amax_out);
}

// The gated activations' g (ACT >= kGated) for x of M x 2H and dy of M x H: both output halves of one
// input vector per step ((dy * b) * act'(a) at column c, dy * act(a) at column H + c, as gated_value),
// the amax of both merged into amax_out and / or g (M x 2H, fp32) written to g_out, as fp8_dact_values
// does for the plain activations (current scaling's first pass; the fallback where H % 8 != 0 or a
// pointer is misaligned). VEC divides H. Grid-stride over the M x H / VEC input vectors.
template <typename T, int ACT, int VEC>
__global__ void __launch_bounds__(256)
fp8_dgated_values(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ amax_out,
                  float* __restrict__ g_out, long long M, int H) {
  griddep_launch_dependents();
  const long long nvec = M * H / VEC, stride = (long long)gridDim.x * blockDim.x;
  // the walk keeps its (row, column) and steps by the stride's (rows, columns): two divisions per
  // thread, none per vector (a 64-bit division is a ~70-instruction call)
  const long long v0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long step_r = stride * VEC / H;
  const int step_c = (int)(stride * VEC - step_r * H);
  long long r = v0 * VEC / H;
  int c = (int)(v0 * VEC - r * H);
  float m = 0.f;
  for (long long v = v0; v < nvec; v += stride, r += step_r, c += step_c) {
    if (c >= H) c -= H, ++r;
    const long long xa = r * 2 * H + c;  // a at xa, b at xa + H; g's first half at xa, second at xa + H
    const Vec<T, VEC> a = load_vec<T, VEC>(x + xa);
    const Vec<T, VEC> bg = load_vec<T, VEC>(x + xa + H);
    const Vec<T, VEC> d = load_vec<T, VEC>(dy + v * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float av = to_float(a.v[j]), dv = to_float(d.v[j]);
      const float g1 = gated_value<ACT>(true, av, to_float(bg.v[j]), dv);
      const float g2 = gated_value<ACT>(false, av, 0.f, dv);
      m = fmaxf(m, fmaxf(fabsf(g1), fabsf(g2)));
      if (g_out != nullptr) {
        g_out[xa + j] = g1;
        g_out[xa + H + j] = g2;
      }
    }
  }
  if (amax_out != nullptr) block_amax_merge(m, amax_out);
}

}  // namespace fk
