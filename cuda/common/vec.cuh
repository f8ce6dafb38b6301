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

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
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

}  // namespace fk
