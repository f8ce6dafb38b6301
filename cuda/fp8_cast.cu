// fusedkit/cuda/fp8_cast.cu -- FP8 quantization of a contiguous tensor (issue 4, first kernels).
//
// fp8_quantize<T, F, VEC, CURRENT>: one pass, grid-stride over 16-byte input vectors (VEC = 8 for
// bf16/fp16, 4 for fp32, 1 for odd sizes). Each element: f = float(x); amax = fmaxf(amax, |f|) (NaN is
// ignored, as fmaxf does); byte = sat_rn(f * scale). The block's amax is merged into *amax_out with an
// atomicMax on the float's bits (valid for values >= 0; order-independent, so deterministic).
// Block 0 writes scale_inv = 1 / scale (and, with CURRENT, the scale it used).
//   Delayed scaling (CURRENT = false): scale = *scale_in (from the amax history, no host sync).
//   Current scaling (CURRENT = true): fp8_amax first writes the tensor's amax; every block then derives
//   the same scale from it (fusedkit.fp8.recipes.current_scale rules, fp32, IEEE division).
// (The cast loop of fp8_quantize predates common/fp8.cuh's cast_fp8_vec, which the newer kernels use;
// it stays as validated on the H200 until those kernels are re-run there.)
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
// fp8_quantize_blocks_2d<T, F, VEC>: 128 x 128 blocks (DeepSeek weights): one block of 256 threads per
// tile, 16 threads x 8 elements per tile row, 16 rows per pass, the tile's 64 values per thread kept in
// registers; amax by shuffles and one shared-memory round; scale = 2^floor(log2(fp8_max / amax)) (1
// for an all-zero tile), fp32 scale_inv per tile. Bytes 2MK read + MK written.
// Status: fp8_quantize and fp8_amax are byte-exact on the H200 (tests/test_fp8_quantize.py);
// fp8_cast_transpose and fp8_quantize_blocks(_2d) are compile-checked; their byte-exact GPU tests
// (tests/test_fp8_cast_transpose.py, tests/test_fp8_blocks.py) have not run yet.
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/fp8.cuh"

namespace fk {

__device__ __forceinline__ float current_scale(float amax, float fp8_max, float eps, int pow2) {
  if (isfinite(amax)) amax = fmaxf(amax, eps);
  if (!isfinite(amax) || amax == 0.f) return 1.f;
  float s = __fdiv_rn(fp8_max, amax);
  if (isinf(s)) s = 3.402823466e38f;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & 0x7F800000u);
  return s;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
fp8_amax(const T* __restrict__ x, float* __restrict__ amax_out, long long n) {
  const long long nvec = n / VEC;
  float m = 0.f;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (long long)gridDim.x * blockDim.x) {
    const Vec<T, VEC> a = load_vec<T, VEC>(x + v * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) m = fmaxf(m, fabsf(to_float(a.v[j])));
  }
  block_amax_merge(m, amax_out);
}

template <typename T, typename F, int VEC, bool CURRENT>
__global__ void __launch_bounds__(256)
fp8_quantize(const T* __restrict__ x, unsigned char* __restrict__ out, const float* __restrict__ scale_in,
             const float* __restrict__ amax_in, float* __restrict__ scale_out, float* __restrict__ scale_inv_out,
             float* __restrict__ amax_out, long long n, float amax_epsilon, int pow2) {
  const float scale = CURRENT ? current_scale(*amax_in, F::MAX, amax_epsilon, pow2) : *scale_in;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scale_inv_out[0] = __fdiv_rn(1.f, scale);
    if (CURRENT && scale_out != nullptr) scale_out[0] = scale;
  }
  const long long nvec = n / VEC;
  float m = 0.f;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (long long)gridDim.x * blockDim.x) {
    const Vec<T, VEC> a = load_vec<T, VEC>(x + v * VEC);
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
    store_vec<unsigned char, VEC>(out + v * VEC, q);
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

template <typename T, typename F, int BLOCK, int VEC, bool MX>
__global__ void __launch_bounds__(256)
fp8_quantize_blocks(const T* __restrict__ x, unsigned char* __restrict__ out, void* __restrict__ scales,
                    long long M, int K) {
  constexpr int LANES = BLOCK / 8;  // threads per block of BLOCK elements
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
    float am = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(v[j]));
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
    float mul;
    if constexpr (MX) {
      int e;
      if (isinf(am)) e = 127;
      else if (am > 0.f) e = pow2_ceil_exponent(fmaxf(__fdiv_rn(am, F::MAX), 1.17549435e-38f));
      else e = -127;
      e = max(-127, min(127, e));
      mul = exp2_neg(e);
      if (active && (chunk % LANES) == 0)
        static_cast<unsigned char*>(scales)[row * blocks_per_row + chunk / LANES] = (unsigned char)(e + 127);
    } else {
      float q = (am > 0.f && !isinf(am)) ? __fdiv_rn(F::MAX, am) : 1.f;  // zero or inf block: 1
      if (isinf(q)) q = 3.402823466e38f;
      mul = __uint_as_float(__float_as_uint(q) & 0x7F800000u);  // power of two <= q
      if (active && (chunk % LANES) == 0)
        static_cast<float*>(scales)[row * blocks_per_row + chunk / LANES] = __fdiv_rn(1.f, mul);
    }
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

template <typename T, typename F, int VEC>
__global__ void __launch_bounds__(256)
fp8_quantize_blocks_2d(const T* __restrict__ x, unsigned char* __restrict__ out, float* __restrict__ scale_inv,
                       long long M, int K) {
  constexpr int PASSES = 8;  // 128 rows / 16 rows per pass
  const int tc = (threadIdx.x & 15) * 8, tr = threadIdx.x >> 4;
  const long long r0 = (long long)blockIdx.y * 128;
  const int c = blockIdx.x * 128 + tc;
  float v[PASSES][8];
  float am = 0.f;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const long long r = r0 + tr + 16 * p;
    if (VEC == 8 && r < M && c < K) {  // K % 8 == 0: the 8 elements are all in the row
      const Vec<T, 8> a = load_vec<T, 8>(x + r * K + c);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[p][j] = to_float(a.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[p][j] = (r < M && c + j < K) ? to_float(x[r * K + c + j]) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(v[p][j]));
  }
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
    const Vec<unsigned char, 8> q8 = cast_fp8_vec<F, 8>(v[p], scale, unused_amax);
    if (VEC == 8) {
      store_vec<unsigned char, 8>(out + r * K + c, q8);
    } else {
      for (int j = 0; j < 8 && c + j < K; ++j) out[r * K + c + j] = q8.v[j];
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
  const float scale = CURRENT ? current_scale(*amax_in, F::MAX, amax_epsilon, pow2) : *scale_in;
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

}  // namespace fk
