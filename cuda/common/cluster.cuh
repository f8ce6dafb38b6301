// fusedkit/cuda/common/cluster.cuh
// Thread-block cluster helpers (sm_90+) in raw PTX: the cluster barrier split into arrive (release)
// and wait (acquire), loads from another CTA's shared memory (mapa + ld.shared::cluster), and merges of
// one value per CTA across the cluster (a butterfly over CLUSTER lanes, so every CTA gets the same bits):
// cluster_merge for the statistics types of common/online_softmax.cuh (MaxSum, LseStats), cluster_sum
// for a float.
//
// Use (a row split over the CTAs of a cluster; every thread of every CTA takes part):
//   __shared__ float4 slot;
//   st = cluster_merge<C>(st, &slot);     // thread 0 writes the CTA's value, barrier, merge of all slots
//   cluster_arrive();                     // this CTA's remote reads are done
//   ... work ...
//   cluster_wait();                       // before exit: no CTA still reads this CTA's slot
// A kernel using these is compiled with FK_CLUSTER_DIMS(C) (compile-time cluster shape, so a plain
// launch works) or launched with a cluster attribute (Launcher(cluster=C)). Off sm_90 the primitives
// trap; the Python dispatch picks cluster kernels only on compute capability 9.0 and newer.
#pragma once
#include "common/online_softmax.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FK_CLUSTER_DIMS(c) __cluster_dims__(c, 1, 1)
#else
#define FK_CLUSTER_DIMS(c)
#endif

namespace fk {

__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// The address of `local` (a __shared__ address of this CTA) in the shared memory of CTA `rank` of the
// cluster, for ld.shared::cluster.
__device__ __forceinline__ unsigned cluster_map_shared(const void* local, unsigned rank) {
  unsigned ra = 0;
#if __CUDA_ARCH__ >= 900
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
#else
  __trap();
#endif
  return ra;
}

// The float4 at `local` (16-byte aligned) in the shared memory of CTA `rank` of the cluster.
__device__ __forceinline__ float4 ld_cluster_f4(const void* local, unsigned rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_map_shared(local, rank)) : "memory");
#endif
  return v;
}

// The float2 at `local` (8-byte aligned) in the shared memory of CTA `rank` of the cluster.
__device__ __forceinline__ float2 ld_cluster_f2(const void* local, unsigned rank) {
  float2 v = make_float2(0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y) : "r"(cluster_map_shared(local, rank)) : "memory");
#endif
  return v;
}

// Per step, one value V (float2 or float4) from each of SENDERS CTAs of the cluster, without a cluster
// barrier per step. A sender's thread 0 writes its value straight into the receiver's slot with
// st.async, which completes a transaction on the receiver's mbarrier for that step; the receiver waits
// on its own mbarrier until all SENDERS values are in. Unlike barrier.cluster.arrive.release this does
// not wait for the sender's other memory traffic: a cluster barrier per row after the previous row's
// global stores cost norm_bwd_staged_pair half its bandwidth (perf_notes).
// Protocol (step k uses slot set k % SLOTS, phase parity (k / SLOTS) & 1):
//   init()                   thread 0, then a cluster barrier, before any CTA sends
//   send(v, k, cta, index)   thread 0: v into value `index` of CTA `cta`'s slot set of step k
//   receive(k)               every thread: waits for step k's values; returns them (local memory)
//   rearm(k)                 thread 0, after its receive(k): arms the slot set for step k + SLOTS
// A sender rewrites slot set k % SLOTS (step k + SLOTS) only after it received step k + SLOTS - 1, so
// the caller must send step k + SLOTS - 1 only after a block barrier that follows every thread's use
// of the values of receive(k).
template <typename V, int SENDERS, int SLOTS>
struct ClusterMailbox {
  V slot[SLOTS][SENDERS];
  unsigned long long bar[SLOTS];

  __device__ __forceinline__ void init() {
#if __CUDA_ARCH__ >= 900
    for (int i = 0; i < SLOTS; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(local(&bar[i])) : "memory");
      arm(i);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
  }

  __device__ __forceinline__ void send(V v, int k, unsigned cta, int index) {
#if __CUDA_ARCH__ >= 900
    const int i = k % SLOTS;
    const unsigned dst = cluster_map_shared(&slot[i][index], cta), mbar = cluster_map_shared(&bar[i], cta);
    if constexpr (sizeof(V) == 8) {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                   :: "r"(dst), "f"(v.x), "f"(v.y), "r"(mbar) : "memory");
    } else {
      static_assert(sizeof(V) == 16, "float2 or float4 values");
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                   :: "r"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(mbar) : "memory");
    }
#endif
  }

  __device__ __forceinline__ const V* receive(int k) {
#if __CUDA_ARCH__ >= 900
    const unsigned parity = (unsigned)(k / SLOTS) & 1u;
    unsigned done = 0;
    do {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}"
          : "=r"(done) : "r"(local(&bar[k % SLOTS])), "r"(parity) : "memory");
    } while (!done);
#endif
    return slot[k % SLOTS];  // read after the wait (the asm's memory clobber)
  }

  __device__ __forceinline__ void rearm(int k) { arm(k % SLOTS); }

 private:
  __device__ __forceinline__ static unsigned local(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
  }
  __device__ __forceinline__ void arm(int i) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(local(&bar[i])), "r"((unsigned)(SENDERS * sizeof(V))) : "memory");
#endif
  }
};

// This CTA's rank in its cluster, the cluster's index in the grid and the number of clusters (1-D).
#if __CUDA_ARCH__ >= 900
#define FK_SREG(name) { unsigned r; asm volatile("mov.u32 %0, %%" name ";" : "=r"(r)); return r; }
#else
#define FK_SREG(name) { __trap(); return 0; }
#endif
__device__ __forceinline__ unsigned cluster_ctarank() FK_SREG("cluster_ctarank")
__device__ __forceinline__ unsigned cluster_index() FK_SREG("clusterid.x")
__device__ __forceinline__ unsigned cluster_count() FK_SREG("nclusterid.x")
#undef FK_SREG

// The statistics of the whole cluster from each CTA's (identical in every thread of a CTA; 1-D
// cluster, rank = blockIdx.x % CLUSTER). Every thread of every CTA must call it. Leaves a cluster
// barrier phase open for the caller's cluster_arrive / cluster_wait pair (see above).
template <int CLUSTER, typename S>
__device__ __forceinline__ S cluster_merge(S v, float4* slot) {
  if (threadIdx.x == 0 && threadIdx.y == 0) *slot = StatsOps<S>::pack(v);
  cluster_arrive();
  cluster_wait();
  const int lane = threadIdx.x & 31;
  S r = lane < CLUSTER ? StatsOps<S>::unpack(ld_cluster_f4(slot, lane)) : StatsOps<S>::identity();
  r = warp_merge<CLUSTER>(r);
  return StatsOps<S>::shfl(r, 0);
}

// Sum over the cluster of one value per CTA (identical in every thread of a CTA); same protocol.
template <int CLUSTER>
__device__ __forceinline__ float cluster_sum(float d, float4* slot) {
  if (threadIdx.x == 0 && threadIdx.y == 0) *slot = make_float4(d, 0.f, 0.f, 0.f);
  cluster_arrive();
  cluster_wait();
  const int lane = threadIdx.x & 31;
  float r = lane < CLUSTER ? ld_cluster_f4(slot, lane).x : 0.f;
#pragma unroll
  for (int off = CLUSTER / 2; off > 0; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
  return __shfl_sync(0xffffffffu, r, 0);
}

}  // namespace fk
