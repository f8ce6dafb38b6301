// fusedkit/cuda/common/vec.cuh
// Aligned short vectors: the unit of every global load and store in the memory-bound kernels.
// Vec<T, N> is N elements of T aligned to sizeof(T) * N, so a Vec of 16 bytes compiles to one
// LDG.E.128 / STG.E.128. Kernels pick N so that N * sizeof(T) <= 16 and N divides the row length;
// a row whose length is odd runs with N = 1 (scalar accesses, same code).
#pragma once
#include "common/dtypes.cuh"

namespace fk {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

// Load of data read exactly once: ld.global.cs (evict first) when FK_STREAM_LOADS=1 (default), else a
// plain load. Measured on the H200 (benchmarks/results/*_plainloads.json, sweep_*_nocs.json) plain
// loads are 8-16% faster, but with them ptxas (NVRTC 13.5) spills 4-24 bytes in several norm kernels
// under their occupancy-driven register caps; switching needs __launch_bounds__(T, 1) and a new
// measurement. Experiment: FUSEDKIT_NVRTC_OPTIONS=-DFK_STREAM_LOADS=0.
#ifndef FK_STREAM_LOADS
#define FK_STREAM_LOADS 1
#endif
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_stream(const T* p) {
  Vec<T, N> r;
  if constexpr (FK_STREAM_LOADS && sizeof(Vec<T, N>) == 16) {
    uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
    r = *reinterpret_cast<Vec<T, N>*>(&u);
  } else {
    r = *reinterpret_cast<const Vec<T, N>*>(p);
  }
  return r;
}

// Read-only loads with an L1 eviction priority (PTX ld.global.nc.L1::<priority>), in 16-byte pieces; a
// Vec that is not a multiple of 16 bytes loads as load_vec. KEEP (evict_last): data every row re-reads
// from L1 (a norm's weights); otherwise no_allocate: row data read once, which then does not push the
// former out of L1. For the FK_NORM_L1 experiment of cuda/norms.cu.
template <bool KEEP>
__device__ __forceinline__ uint4 ld_nc_l1(const uint4* p) {
  uint4 u;
  if constexpr (KEEP)
    asm("ld.global.nc.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  return u;
}
template <bool KEEP, typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_l1(const T* p) {
  if constexpr (sizeof(Vec<T, N>) % 16 == 0) {
    constexpr int PIECES = sizeof(Vec<T, N>) / 16;
    uint4 u[PIECES];
#pragma unroll
    for (int i = 0; i < PIECES; ++i) u[i] = ld_nc_l1<KEEP>(reinterpret_cast<const uint4*>(p) + i);
    return *reinterpret_cast<Vec<T, N>*>(u);
  } else {
    return load_vec<T, N>(p);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Two fp32 values rounded (RNE) into one 32-bit word of 16-bit T, a in the low half: one cvt.rn.*x2.
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b) {
  unsigned d;
  if constexpr (IsBf16<T>::value) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(b), "f"(a));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(b), "f"(a));
  }
  return d;
}

// One 16-byte global store of four words (p 16-byte aligned), as st.global.v4.b32 in so many words: in
// ce_fwd_staged (cross_entropy.cu) NVVM split both a Vec of 16-bit elements and a uint4 assignment into
// 4- and 8-byte stores (NVRTC 13), where the other kernels get STG.E.128 from store_vec.
__device__ __forceinline__ void st_global_v4(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// N fp32 values rounded to T and stored as one 16-byte vector (N * sizeof(T) == 16), whole words.
template <typename T, int N>
__device__ __forceinline__ void store_floats16(T* p, const float (&f)[N]) {
  static_assert(N * sizeof(T) == 16, "store_floats16 stores one 16-byte vector");
  if constexpr (sizeof(T) == 4) {
    st_global_v4(p, __float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  } else {
    st_global_v4(p, pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]), pack2<T>(f[6], f[7]));
  }
}

// N fp32 values rounded to T and stored at p (N * sizeof(T)-byte aligned): a 16-byte vector through
// store_floats16 (whole words), any other width as one Vec store.
template <typename T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&f)[N]) {
  if constexpr (N * sizeof(T) == 16) {
    store_floats16<T, N>(p, f);
  } else {
    Vec<T, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = from_float<T>(f[j]);
    store_vec<T, N>(p, out);
  }
}

// Element j of a loaded vector as fp32, read from the vector's 32-bit words. For bf16 that is one shift
// (even j) or one mask (odd j) of the loaded register. Written per element (to_float(r.v[j])), ptxas
// first splits every 16-bit element into its own register (a PRMT each, and a second predicated PRMT
// where the vector may be zeroed) and then shifts it: three instructions and twice the registers for
// a value the kernels read in up to three passes. fp16 and fp32 take to_float. (softmax.cu's
// elem_float and fp8_cast.cu's raw_elem do the same on their own types; they predate this helper and
// are to be folded into it when those kernels are next re-measured on the GPU.)
template <typename T, int N>
__device__ __forceinline__ float vec_elem(const Vec<T, N>& r, int j) {
  if constexpr (IsBf16<T>::value && N % 2 == 0) {
    const unsigned w = reinterpret_cast<const unsigned*>(r.v)[j >> 1];
    return __uint_as_float((j & 1) ? (w & 0xFFFF0000u) : (w << 16));
  } else {
    return to_float(r.v[j]);
  }
}

// A vector of zeros, written as 32-bit words where the vector is made of whole words.
template <typename T, int N>
__device__ __forceinline__ void vec_zero(Vec<T, N>& r) {
  if constexpr ((sizeof(T) * N) % 4 == 0) {
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) * N / 4); ++k) reinterpret_cast<unsigned*>(r.v)[k] = 0u;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = from_float<T>(0.f);
  }
}

// Running max over whole vectors, for the max pass of a row staged in shared memory. bf16 / fp16
// vectors of whole 32-bit words keep it packed: one max.bf16x2 / max.f16x2 (sm_80+; exact, and NaN-
// dropping as fmaxf) per word, half an instruction per element against an unpack and an FMNMX each;
// value() unpacks the two lanes once. Other vectors: fmaxf per element. An empty max is -inf.
template <typename T>
__device__ __forceinline__ unsigned max_x2(unsigned a, unsigned b) {
  unsigned d;
  if constexpr (IsBf16<T>::value) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

template <typename T, int N>
struct RunningMax {
  static constexpr bool kPacked = sizeof(T) == 2 && N % 2 == 0;
  unsigned w;  // packed: two 16-bit lanes
  float f;     // otherwise

  __device__ __forceinline__ RunningMax() {
    if constexpr (kPacked) {
      w = IsBf16<T>::value ? 0xFF80FF80u : 0xFC00FC00u;  // -inf in both lanes
    } else {
      f = -__int_as_float(0x7f800000);
    }
  }
  __device__ __forceinline__ void add(const Vec<T, N>& r) {
    if constexpr (kPacked) {
#pragma unroll
      for (int k = 0; k < N / 2; ++k) w = max_x2<T>(w, reinterpret_cast<const unsigned*>(r.v)[k]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) f = fmaxf(f, to_float(r.v[j]));
    }
  }
  __device__ __forceinline__ float value() const {
    if constexpr (kPacked) {
      T lo, hi;
      lo.bits = (unsigned short)(w & 0xFFFFu);
      hi.bits = (unsigned short)(w >> 16);
      return fmaxf(to_float(lo), to_float(hi));
    } else {
      return f;
    }
  }
};

}  // namespace fk
