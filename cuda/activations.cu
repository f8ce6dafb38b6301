// fusedkit/cuda/activations.cu -- elementwise activations, forward and backward: GeLU (tanh and erf),
// SiLU, ReLU, squared ReLU, and the gated forms SwiGLU, GeGLU, ReGLU.
//
// act_fwd<T, O, ACT, GATED, VEC>: grid-stride over 16-byte vectors of the output (VEC = 16 / sizeof(T)
// when the row length allows, else 1). Non-gated: y = act(x + bias) over all M x N elements (bias of
// N, optional). Gated (GATED = true): x is M x 2H, a = x[:, :H], g = x[:, H:], y = act(a) * g of M x H
// (Transformer Engine's layout); bias (2H, optional) is added to both halves first.
// act_bwd<T, ACT, GATED, VEC>: dx = dy * act'(x + bias); gated: da = dy * g * act'(a), dg = dy * act(a).
// Bytes (2-byte T): forward 4MN (non-gated) / 6MH (gated: read 2 x 2MH, write 2MH); backward 6MN /
// 10MH (read x and dy, write dx).
// Numerics: fp32 math (tanhf, erff, expf: IEEE-accurate library functions, no fast-math), one rounding
// to the output; formulas and derivatives as fusedkit/reference/activations.py.
// act_fwd_fp8<T, F, ACT, GATED, VEC>: the same forward with FP8 output (delayed scaling): the fp32
// activation is cast as sat(y * scale) (RNE), its amax merged into *amax_out, scale_inv written by
// thread 0 of block 0: the input of the next FP8 GEMM without an extra pass. Bytes 3MN / 5MH.
// Status: compile-checked; GPU tests (tests/test_activations.py) and benchmarks have not run yet.
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/fp8.cuh"
#include "common/act.cuh"

namespace fk {

template <typename W, int VEC>
__device__ __forceinline__ void add_bias(float (&v)[VEC], const W* bias, long long col) {
  if (bias == nullptr) return;
  const Vec<W, VEC> b = load_vec<W, VEC>(bias + col);
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] += to_float(b.v[j]);
}

template <typename T, int VEC>
__device__ __forceinline__ void load_f(float (&v)[VEC], const T* p) {
  const Vec<T, VEC> a = load_vec<T, VEC>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] = to_float(a.v[j]);
}

template <typename O, int VEC>
__device__ __forceinline__ void store_f(O* p, const float (&v)[VEC]) {
  Vec<O, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) o.v[j] = from_float<O>(v[j]);
  store_vec<O, VEC>(p, o);
}

// The VEC activation outputs of output vector v (act(x + bias), or act(a) * g when GATED); returns
// their offset in the output. The row / column split (a 64-bit division) is only computed when a bias
// or the gate needs the column.
template <typename T, int ACT, bool GATED, int VEC>
__device__ __forceinline__ long long act_vec(const T* __restrict__ x, const T* __restrict__ bias, long long v,
                                             int H, float (&out)[VEC]) {
  const int in_row = GATED ? 2 * H : H;
  long long base, obase;  // input and output offsets of this vector
  int col = 0;
  if (GATED || bias != nullptr) {
    const long long row = v / (H / VEC);
    col = (int)(v - row * (H / VEC)) * VEC;
    base = row * in_row + col;
    obase = row * H + col;
  } else {
    base = obase = v * VEC;
  }
  float a[VEC];
  load_f<T, VEC>(a, x + base);
  add_bias<T, VEC>(a, bias, col);
  if constexpr (GATED) {
    float g[VEC];
    load_f<T, VEC>(g, x + base + H);
    add_bias<T, VEC>(g, bias == nullptr ? nullptr : bias + H, col);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = act_f<ACT>(a[j]) * g[j];
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = act_f<ACT>(a[j]);
  }
  return obase;
}

// H: output columns (N for non-gated, half the input row for gated). Vectors never straddle rows
// (VEC divides H).
template <typename T, typename O, int ACT, bool GATED, int VEC>
__global__ void __launch_bounds__(256)
act_fwd(const T* __restrict__ x, const T* __restrict__ bias, O* __restrict__ y, long long M, int H) {
  const long long nvec = M * (H / VEC);
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (long long)gridDim.x * blockDim.x) {
    float out[VEC];
    const long long obase = act_vec<T, ACT, GATED, VEC>(x, bias, v, H, out);
    store_f<O, VEC>(y + obase, out);
  }
}

template <typename T, typename F, int ACT, bool GATED, int VEC>
__global__ void __launch_bounds__(256)
act_fwd_fp8(const T* __restrict__ x, const T* __restrict__ bias, unsigned char* __restrict__ y,
            const float* __restrict__ scale_in, float* __restrict__ scale_inv_out, float* __restrict__ amax_out,
            long long M, int H) {
  const float scale = *scale_in;
  if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv_out[0] = __fdiv_rn(1.f, scale);
  const long long nvec = M * (H / VEC);
  float m = 0.f;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (long long)gridDim.x * blockDim.x) {
    float out[VEC];
    const long long obase = act_vec<T, ACT, GATED, VEC>(x, bias, v, H, out);
    store_vec<unsigned char, VEC>(y + obase, cast_fp8_vec<F, VEC>(out, scale, m));
  }
  block_amax_merge(m, amax_out);
}

template <typename T, int ACT, bool GATED, int VEC>
__global__ void __launch_bounds__(256)
act_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ dx,
        long long M, int H) {
  const long long nvec = M * (H / VEC);
  const int in_row = GATED ? 2 * H : H;
  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (long long)gridDim.x * blockDim.x) {
    const long long row = v / (H / VEC);
    const int col = (int)(v - row * (H / VEC)) * VEC;
    float a[VEC], d[VEC], da[VEC];
    load_f<T, VEC>(a, x + row * in_row + col);
    add_bias<T, VEC>(a, bias, col);
    load_f<T, VEC>(d, dy + row * H + col);
    if constexpr (GATED) {
      float g[VEC], dg[VEC];
      load_f<T, VEC>(g, x + row * in_row + H + col);
      add_bias<T, VEC>(g, bias == nullptr ? nullptr : bias + H, col);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        da[j] = d[j] * g[j] * dact_f<ACT>(a[j]);
        dg[j] = d[j] * act_f<ACT>(a[j]);
      }
      store_f<T, VEC>(dx + row * in_row + col, da);
      store_f<T, VEC>(dx + row * in_row + H + col, dg);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) da[j] = d[j] * dact_f<ACT>(a[j]);
      store_f<T, VEC>(dx + row * in_row + col, da);
    }
  }
}

}  // namespace fk
