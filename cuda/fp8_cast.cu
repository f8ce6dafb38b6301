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
// Status: compiled by the compile-all check; not yet run on a GPU (see docs/fp8.rst).
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

}  // namespace fk
