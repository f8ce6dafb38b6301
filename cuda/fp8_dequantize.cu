// fusedkit/cuda/fp8_dequantize.cu -- FP8 bytes back to values: out = round_OUT(fp8_value * scale), one pass
// (issue 4: fusedkit.dequantize on device arrays, every scaling mode of an FP8Tensor).
//
// fp8_dequantize<F, OUT, VEC, BR, BC, E8M0, UNROLL>: the bytes viewed as rows x cols (cols = the last
// dim); the scale of element (r, c) is scale[(r / BR) * scale_cols + c / BC], a term left out where BR or BC is 0:
//   per tensor            BR = 0,   BC = 0    (one fp32 scale_inv)
//   MXFP8 rows            BR = 1,   BC = 32   (E8M0 bytes, (rows, ceil(cols / 32)))
//   MXFP8 columns         BR = 32,  BC = 1    (E8M0 bytes, (ceil(rows / 32), cols): Transformer Engine's
//                                              columnwise layout, data still (rows, cols))
//   1 x 128 blocks        BR = 1,   BC = 128  (fp32 scale_inv, (rows, ceil(cols / 128)))
//   128 x 128 blocks      BR = 128, BC = 128  (fp32 scale_inv, (ceil(rows / 128), ceil(cols / 128)))
// An E8M0 byte e is 2^(e - 127) (e = 255: +inf, as the reference's ldexp gives; e = 0: 2^-127, a
// subnormal). Grid: x over each row's VEC-element vectors (grid-stride), y over rows (grid-stride); with
// UNROLL > 0 (per-tensor scale only) a flat one-pass walk instead (dequantize_flat).
// VEC = 8 when cols % 8 == 0 and the bytes are 8-byte and the output 16-byte aligned (one 8-byte load,
// 16-byte stores), else 1. With VEC = 8 the vector's elements share one scale unless BC = 1.
// Numerics, as fusedkit.reference.fp8: the FP8 value decoded exactly, one fp32 multiply (no
// contraction: there is nothing to contract), one RNE rounding to OUT. Decoding goes through fp16, which
// holds every E4M3 and E5M2 value: E5M2 is the upper byte of an fp16; E4M3's 7 magnitude bits shifted
// left by 7 are an fp16 of 2^-8 times its value (subnormals included), scaled back by 256 in fp32
// (exact); E4M3's NaN (magnitude 0x7F) is set apart. On sm_89 and newer the vector path converts pairs
// with the hardware cvt to f16x2 instead (fewer instructions for the same exact values).
// Bytes: MN read + MN * sizeof(OUT) written (3MN for bf16 output), plus the scales (MN / 32 at most).
#include "common/dtypes.cuh"
#include "common/fp8.cuh"
#include "common/vec.cuh"

namespace fk {

template <typename F>
__device__ __forceinline__ float fp8_to_float(unsigned b) {
  if constexpr (F::MAN == 2) {
    return to_float(f16{(unsigned short)(b << 8)});
  } else {
    const unsigned mag = b & 0x7Fu;
    float v = to_float(f16{(unsigned short)(mag << 7)}) * 256.f;
    if (mag == 0x7Fu) v = __uint_as_float(0x7FC00000u);
    return (b & 0x80u) ? -v : v;
  }
}

// Two FP8 values (the low byte of `pair` first) as fp32. sm_89 and newer: one cvt.rn.f16x2.{e4m3,e5m2}x2
// (the upper byte to the upper half, as the f32 -> e4m3x2 cvt packs), then two exact f16 -> f32; older
// targets: fp8_to_float twice. Both exact, so both give the reference's values (a NaN's sign aside).
template <typename F>
__device__ __forceinline__ void fp8x2_to_float2(unsigned pair, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned h;
  const unsigned short p = (unsigned short)pair;
  if constexpr (F::MAN == 3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(p));
  else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(p));
  lo = to_float(f16{(unsigned short)(h & 0xFFFFu)});
  hi = to_float(f16{(unsigned short)(h >> 16)});
#else
  lo = fp8_to_float<F>(pair & 0xFFu);
  hi = fp8_to_float<F>((pair >> 8) & 0xFFu);
#endif
}

template <bool E8M0>
__device__ __forceinline__ float dequant_scale(const void* scale, long long i) {
  if constexpr (E8M0) {
    const unsigned e = __ldg(static_cast<const unsigned char*>(scale) + i);
    return __uint_as_float(e ? e << 23 : 0x00400000u);
  } else {
    return __ldg(static_cast<const float*>(scale) + i);
  }
}

// Eight FP8 bytes (columns c .. c + 7 of a row whose scales start at srow) out to `o` as OUT: decoded
// pairwise, one fp32 multiply each by the vector's scale (BC = 1: each column's own), 16-byte stores.
template <typename F, typename OUT, int BC, bool E8M0>
__device__ __forceinline__ void dequantize8(uint2 raw, long long srow, long long c, const void* __restrict__ scale,
                                            OUT* __restrict__ o) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; j += 2) fp8x2_to_float2<F>((j < 4 ? raw.x : raw.y) >> (8 * (j & 3)), v[j], v[j + 1]);
  const float s0 = BC == 1 ? 0.f : dequant_scale<E8M0>(scale, srow + (BC ? c / BC : 0));
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float s = BC == 1 ? dequant_scale<E8M0>(scale, srow + c + j) : s0;
    v[j] = __fmul_rn(v[j], s);
  }
  if constexpr (sizeof(OUT) == 4) {
    float lo[4] = {v[0], v[1], v[2], v[3]}, hi[4] = {v[4], v[5], v[6], v[7]};
    store_floats<OUT, 4>(o, lo);
    store_floats<OUT, 4>(o + 4, hi);
  } else {
    store_floats<OUT, 8>(o, v);
  }
}

// UNROLL > 0 (per-tensor scale, VEC = 8; cuda_fp8.DEQUANT_UNROLL): the tensor's 8-byte vectors walked
// flat in one pass, as fp8_quantize walks its input (cuda/fp8_cast.cu): block b owns UNROLL * blockDim.x
// consecutive vectors, thread t takes t, t + blockDim.x, ... of them and issues every load before the
// first conversion (8 x UNROLL bytes of x in flight per thread; each warp store one contiguous 512-byte
// run for 2-byte output); a 1-D grid of ceil(nvec / (UNROLL * blockDim.x)) blocks (a smaller one still
// covers the tensor: the chunks stride by the grid). Measured so far (fp8_dequantize, of copy / against
// torch.compile): the row walk below 0.867 / 0.92x on the H200 (2026-12-05T194437Z); a flat walk of
// 16-byte vectors whose lanes each stored 32 bytes as two 16-byte halves 32 bytes apart, 0.706 / 0.74x on
// the H100 (ab_dequant_vec16_H100_2026-12-05T194939Z.json); this walk with UNROLL = 2 (shipped), on an H100
// (ab_unroll_2026-12-06T0210Z.json): 0.894 -> 0.955 of copy at 32768 x 4096, 0.899 -> 0.968 at 16384 x
// 14336 against the row walk, torch.compile 0.956 / 0.970 in the same rounds (UNROLL = 4: 0.003 lower).
template <typename F, typename OUT, int UNROLL>
__device__ __forceinline__ void dequantize_flat(const unsigned char* __restrict__ x, const void* __restrict__ scale,
                                                OUT* __restrict__ out, long long n) {
  const long long nvec = n / 8, chunk = (long long)blockDim.x * UNROLL;
  for (long long c = (long long)blockIdx.x * chunk + threadIdx.x; c < nvec; c += (long long)gridDim.x * chunk) {
    uint2 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (c + (long long)u * blockDim.x < nvec)
        raw[u] = __ldg(reinterpret_cast<const uint2*>(x) + c + (long long)u * blockDim.x);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long v = c + (long long)u * blockDim.x;
      if (v < nvec) dequantize8<F, OUT, 0, false>(raw[u], 0, 0, scale, out + v * 8);
    }
  }
}

template <typename F, typename OUT, int VEC, int BR, int BC, bool E8M0, int UNROLL = 0>
__global__ void __launch_bounds__(256)
fp8_dequantize(const unsigned char* __restrict__ x, const void* __restrict__ scale, OUT* __restrict__ out,
               long long rows, long long cols, long long scale_cols) {
  static_assert(VEC == 1 || VEC == 8, "one byte, or eight bytes per thread");
  static_assert(VEC == 1 || BC == 0 || BC == 1 || BC % 8 == 0, "a vector shares its scale unless BC = 1");
  static_assert(UNROLL == 0 || (VEC == 8 && BR == 0 && BC == 0), "the flat walk: per-tensor scale, 8-byte vectors");
  if constexpr (UNROLL > 0) {
    dequantize_flat<F, OUT, UNROLL>(x, scale, out, rows * cols);
    return;
  }
  const long long step = (long long)gridDim.x * blockDim.x * VEC;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    const long long srow = BR ? (r / BR) * scale_cols : 0;
    const unsigned char* xr = x + r * cols;
    OUT* orow = out + r * cols;
    for (long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC; c < cols; c += step) {
      if constexpr (VEC == 1) {
        const float s = dequant_scale<E8M0>(scale, srow + (BC ? c / BC : 0));
        orow[c] = from_float<OUT>(__fmul_rn(fp8_to_float<F>(xr[c]), s));
      } else {
        dequantize8<F, OUT, BC, E8M0>(__ldg(reinterpret_cast<const uint2*>(xr + c)), srow, c, scale, orow + c);
      }
    }
  }
}

}  // namespace fk
