// fusedkit/cuda/common/bulk.cuh
// Hopper (sm_90+) bulk copies global -> shared memory (cp.async.bulk, the 1-D form of TMA) completed
// on mbarriers, and a ring of stages built on them.
//
// Why: a memory-bound kernel reaches the copy ceiling only with enough bytes in flight per SM
// (Little's law: about 4.3 TB/s x ~1 us / 132 SMs, some 32 KB). Register prefetch pays for those bytes
// in registers and occupancy; a bulk copy issued by one thread puts a whole group of rows in flight
// and lands it in shared memory, at no register cost, while the block works on earlier stages.
//
// Use (one producer thread, every thread of the block a consumer):
//   StageRing ring(bars, stages);           // bars: __shared__ uint64_t[kMaxStages]
//   thread 0: ring.init(); then all threads __syncthreads()
//   thread 0: ring.expect(s, bytes); bulk_load(dst, src, bytes, ring.bar(s));   (per copy of stage s)
//   all: ring.wait(s, phase); ...; ring.next(s, phase)   // stage s = k % stages of the k-th fill
//   all: read the stage, __syncthreads(), then thread 0 may refill stage s.
// Sizes and addresses of bulk copies must be multiples of 16 bytes. Off sm_90 these trap: the Python
// dispatch only picks staged kernels on compute capability 9.0 and newer.
#pragma once

namespace fk {

constexpr int kMaxStages = 16;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bulk_load(void* dst_smem, const void* src_gmem, unsigned bytes,
                                          unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(smem_addr(dst_smem)), "l"(src_gmem), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

// Asks the L2 to fetch `bytes` at `src_gmem` (both multiples of 16) ahead of the loads that will read
// them (cp.async.bulk.prefetch: one instruction, no registers, no completion to wait for). A no-op off
// sm_90, so kernels that also run there may call it.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src_gmem, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src_gmem), "r"(bytes) : "memory");
#endif
}

struct StageRing {
  unsigned long long* bars;
  int stages;

  __device__ __forceinline__ StageRing(unsigned long long* b, int s) : bars(b), stages(s) {}

  // One arrival per phase (the producer's expect), completed by the bytes of its copies.
  __device__ __forceinline__ void init() const {
#if __CUDA_ARCH__ >= 900
    for (int s = 0; s < stages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __device__ __forceinline__ unsigned long long* bar(int s) const { return bars + s; }

  __device__ __forceinline__ void expect(int s, unsigned bytes) const {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bars + s)), "r"(bytes) : "memory");
#endif
  }

  // Blocks until the current fill of stage s has landed; `phase` is 0 on the first pass over the ring,
  // then flips on every wrap (see next()).
  __device__ __forceinline__ void wait(int s, unsigned phase) const {
#if __CUDA_ARCH__ >= 900
    const unsigned parity = phase;
    unsigned done = 0;
    do {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}"
          : "=r"(done) : "r"(smem_addr(bars + s)), "r"(parity) : "memory");
    } while (!done);
#endif
  }

  // Advances (stage, phase) to the next fill (no division in the loop).
  __device__ __forceinline__ void next(int& s, unsigned& phase) const {
    if (++s == stages) {
      s = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace fk
