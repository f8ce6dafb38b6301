// fusedkit/cuda/activations.cu -- elementwise activations, forward and backward: GeLU (tanh and erf),
// SiLU, ReLU, squared ReLU, and the gated forms SwiGLU, GeGLU, ReGLU.
//
// act_fwd<T, O, ACT, GATED, VEC, UNROLL>: each thread takes UNROLL 16-byte vectors of the output (VEC =
// 16 / sizeof(T) when the row length and the pointers allow, else narrower), strided by the block size
// inside a block-sized chunk so every warp access is coalesced, and issues all their loads before the
// first use; the grid covers the tensor once (no grid-stride loop). Non-gated: y = act(x + bias) over
// all M x N elements (bias of N, optional). Gated (GATED = true): x is M x 2H, a = x[:, :H],
// g = x[:, H:], y = act(a) * g of M x H (Transformer Engine's layout); bias (2H, optional) is added to
// both halves first.
// act_bwd<T, ACT, GATED, VEC, UNROLL>: dx = dy * act'(x + bias); gated: da = dy * g * act'(a),
// dg = dy * act(a).
// Bytes (2-byte T): forward 4MN (non-gated) / 6MH (gated: read 2 x 2MH, write 2MH); backward 6MN /
// 10MH (read x and dy, write dx).
// Numerics: fp32 math (tanhf, erff, expf: IEEE-accurate library functions, no fast-math; common/act.cuh),
// one rounding to the output; formulas and derivatives as fusedkit/reference/activations.py.
// act_fwd_fp8<T, F, ACT, GATED, VEC, UNROLL>: the same forward with FP8 output (delayed scaling): the
// fp32 activation is cast as sat(y * scale) (RNE), its amax merged into *amax_out, scale_inv written by
// thread 0 of block 0: the input of the next FP8 GEMM without an extra pass. Bytes 3MN / 5MH.
// Variants measured: a grid-stride loop over single vectors (8 blocks of 256 per SM): gelu 0.88-0.90,
// swiglu 0.83 of copy (benchmarks/results/*184943Z), against torch.compile's 1.04 on swiglu.
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

// Where output vector v lives: its offsets in x (input row of 2H when GATED) and y, and its column.
// The row split is a division by H / VEC: 32-bit while v fits (about 20 instructions), else 64-bit.
// Without gate and bias the column is never needed and the offsets are v * VEC.
struct VecPos {
  long long in, out;
  int col;
};
template <bool GATED, int VEC>
__device__ __forceinline__ VecPos vec_pos(long long v, int H, bool need_col) {
  VecPos p;
  if (!GATED && !need_col) {
    p.in = p.out = v * VEC;
    p.col = 0;
    return p;
  }
  const unsigned hv = (unsigned)(H / VEC);
  const long long row = v < 0xFFFFFFFFll ? (long long)((unsigned)v / hv) : v / (long long)hv;
  p.col = (int)(v - row * hv) * VEC;
  p.in = row * (GATED ? 2ll * H : (long long)H) + p.col;
  p.out = row * (long long)H + p.col;
  return p;
}

// Work split shared by the kernels: block b owns UNROLL * blockDim.x consecutive vectors; thread t
// takes vectors t, t + blockDim.x, ... of them (each step of the warp one coalesced access). Every
// thread issues all its loads before the first use: UNROLL x (1 or 2) x 16 bytes in flight per thread,
// which is what the grid-stride version (one vector per step) lacked (swiglu: 0.83 of copy, run 184943Z).
template <int UNROLL>
__device__ __forceinline__ long long first_vec() {
  return (long long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;
}

// Loads UNROLL vectors of the activation input (a) and, when GATED, of the gate (g), as raw storage.
template <typename T, bool GATED, int VEC, int UNROLL>
__device__ __forceinline__ void load_act_inputs(const T* __restrict__ x, long long nvec, int H, bool need_col,
                                                VecPos (&pos)[UNROLL], Vec<T, VEC> (&a)[UNROLL],
                                                Vec<T, VEC> (&g)[UNROLL]) {
  const long long v0 = first_vec<UNROLL>();
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    const long long v = v0 + (long long)k * blockDim.x;
    if (v < nvec) {
      pos[k] = vec_pos<GATED, VEC>(v, H, need_col);
      a[k] = load_vec<T, VEC>(x + pos[k].in);
      if constexpr (GATED) g[k] = load_vec<T, VEC>(x + pos[k].in + H);
    }
  }
}

// act(a + bias) (or act(a + bias_a) * (g + bias_g) when GATED) of one loaded vector, in fp32.
template <typename T, int ACT, bool GATED, int VEC>
__device__ __forceinline__ void act_values(const Vec<T, VEC>& a, const Vec<T, VEC>& g, const T* __restrict__ bias,
                                           int col, int H, float (&out)[VEC]) {
  float av[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) av[j] = to_float(a.v[j]);
  add_bias<T, VEC>(av, bias, col);
  if constexpr (GATED) {
    float gv[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) gv[j] = to_float(g.v[j]);
    add_bias<T, VEC>(gv, bias == nullptr ? nullptr : bias + H, col);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = act_f<ACT>(av[j]) * gv[j];
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = act_f<ACT>(av[j]);
  }
}

// H: output columns (N for non-gated, half the input row for gated). Vectors never straddle rows
// (VEC divides H). Grid: ceil(nvec / (UNROLL * blockDim.x)) blocks.
template <typename T, typename O, int ACT, bool GATED, int VEC, int UNROLL>
__global__ void __launch_bounds__(256)
act_fwd(const T* __restrict__ x, const T* __restrict__ bias, O* __restrict__ y, long long M, int H) {
  const long long nvec = M * (H / VEC);
  VecPos pos[UNROLL];
  Vec<T, VEC> a[UNROLL], g[UNROLL];
  load_act_inputs<T, GATED, VEC, UNROLL>(x, nvec, H, bias != nullptr, pos, a, g);
  const long long v0 = first_vec<UNROLL>();
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    if (v0 + (long long)k * blockDim.x < nvec) {
      float out[VEC];
      act_values<T, ACT, GATED, VEC>(a[k], g[k], bias, pos[k].col, H, out);
      store_f<O, VEC>(y + pos[k].out, out);
    }
  }
}

template <typename T, typename F, int ACT, bool GATED, int VEC, int UNROLL>
__global__ void __launch_bounds__(256)
act_fwd_fp8(const T* __restrict__ x, const T* __restrict__ bias, unsigned char* __restrict__ y,
            const float* __restrict__ scale_in, float* __restrict__ scale_inv_out, float* __restrict__ amax_out,
            long long M, int H) {
  const float scale = *scale_in;
  if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv_out[0] = __fdiv_rn(1.f, scale);
  const long long nvec = M * (H / VEC);
  VecPos pos[UNROLL];
  Vec<T, VEC> a[UNROLL], g[UNROLL];
  load_act_inputs<T, GATED, VEC, UNROLL>(x, nvec, H, bias != nullptr, pos, a, g);
  const long long v0 = first_vec<UNROLL>();
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    if (v0 + (long long)k * blockDim.x < nvec) {
      float out[VEC];
      act_values<T, ACT, GATED, VEC>(a[k], g[k], bias, pos[k].col, H, out);
      store_fp8_vec<F, VEC>(y + pos[k].out, out, scale, m);
    }
  }
  block_amax_merge(m, amax_out);
}

// dx = dy * act'(x + bias); gated: da = dy * g * act'(a), dg = dy * act(a) (bias added to a and g).
template <typename T, int ACT, bool GATED, int VEC, int UNROLL>
__global__ void __launch_bounds__(256)
act_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ dx,
        long long M, int H) {
  const long long nvec = M * (H / VEC);
  VecPos pos[UNROLL];
  Vec<T, VEC> a[UNROLL], g[UNROLL], d[UNROLL];
  load_act_inputs<T, GATED, VEC, UNROLL>(x, nvec, H, bias != nullptr, pos, a, g);
  const long long v0 = first_vec<UNROLL>();
#pragma unroll
  for (int k = 0; k < UNROLL; ++k)
    if (v0 + (long long)k * blockDim.x < nvec) d[k] = load_vec<T, VEC>(dy + pos[k].out);
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {
    if (v0 + (long long)k * blockDim.x >= nvec) continue;
    float av[VEC], dv[VEC], da[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      av[j] = to_float(a[k].v[j]);
      dv[j] = to_float(d[k].v[j]);
    }
    add_bias<T, VEC>(av, bias, pos[k].col);
    if constexpr (GATED) {
      float gv[VEC], dg[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) gv[j] = to_float(g[k].v[j]);
      add_bias<T, VEC>(gv, bias == nullptr ? nullptr : bias + H, pos[k].col);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        da[j] = dv[j] * gv[j] * dact_f<ACT>(av[j]);
        dg[j] = dv[j] * act_f<ACT>(av[j]);
      }
      store_f<T, VEC>(dx + pos[k].in, da);
      store_f<T, VEC>(dx + pos[k].in + H, dg);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) da[j] = dv[j] * dact_f<ACT>(av[j]);
      store_f<T, VEC>(dx + pos[k].in, da);
    }
  }
}

}  // namespace fk
