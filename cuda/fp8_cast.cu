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
// Status: fp8_quantize and fp8_amax are byte-exact on the H200 (tests/test_fp8_quantize.py);
// fp8_cast_transpose is compile-checked, its byte-exact GPU tests (tests/test_fp8_cast_transpose.py)
// not yet run.
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/fp8.cuh"

namespace fk {

__device__ __forceinline__ void block_amax_merge(float v, float* amax_out) {
  __shared__ float part[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = part[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); ++i) m = fmaxf(m, part[i]);
    atomicMax(reinterpret_cast<unsigned int*>(amax_out), __float_as_uint(m));
  }
}

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
