// fusedkit/cuda/common/cluster.cuh
// Thread-block cluster helpers (sm_90+) in raw PTX: the cluster barrier split into arrive (release)
// and wait (acquire), a mailbox (ClusterMailbox: values stored into other CTAs' shared memory with
// st.async, completing the receiver's mbarrier), loads from another CTA's shared memory
// (ld_cluster_f4), and merges of one value per CTA across the cluster (a butterfly over CLUSTER lanes
// in rank order, so every CTA gets the same bits): cluster_merge for the statistics types of
// common/online_softmax.cuh (MaxSum, LseStats), cluster_sum for a float.
//
// Use (one row per cluster, split over its CTAs; every thread of every CTA takes part):
//   __shared__ StatsBox<C> box;
//   cluster_merge_open(&box);             // first thing: thread 0 arms the mailbox, cluster arrive
//   ... load the row, reduce in the CTA ...
//   st = cluster_merge<C>(st, &box);      // wait (all mailboxes armed), send to every CTA, merge
//   cluster_arrive();
//   ... work ...
//   cluster_wait();                       // before exit
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

// The part of a row of nvec vectors that CTA `rank` of a cluster of CLUSTER owns: the contiguous
// vectors [v0, vend), ceil(nvec / CLUSTER) a CTA (the last CTAs take fewer, or none, when CLUSTER does
// not divide nvec). `chunk` is also the stride of a CTA's slots in the staged kernels' shared memory.
template <int CLUSTER>
struct ClusterChunk {
  int chunk, v0, vend;
  __device__ __forceinline__ ClusterChunk(int nvec, int rank)
      : chunk((nvec + CLUSTER - 1) / CLUSTER), v0(min(rank * chunk, nvec)), vend(min(v0 + chunk, nvec)) {}
};

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
// cluster (a shared::cluster address, for st.async).
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

// A float4 from the shared memory of another CTA of the cluster (addr from cluster_map_shared).
// Ordered by the caller's cluster barrier (cluster_wait's acquire), so no memory clobber here: the
// loads of an unrolled loop may all be in flight at once.
__device__ __forceinline__ float4 ld_cluster_f4(unsigned addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
#else
  __trap();
#endif
  return v;
}

// Per step, one value V (float2 or float4) from each of SENDERS CTAs of the cluster, without a cluster
// barrier per step. A sender's thread 0 writes its value straight into the receiver's slot with
// st.async, which completes a transaction on the receiver's mbarrier for that step; the receiver waits
// on its own mbarrier until all SENDERS values are in: one one-way trip instead of a barrier round
// trip, and unlike barrier.cluster.arrive.release nothing waits for the sender's other memory traffic
// (e.g. the previous row's global stores in a persistent kernel).
// Protocol (step k uses slot set k % SLOTS, phase parity (k / SLOTS) & 1):
//   init()                   thread 0, then a cluster barrier, before any CTA sends
//   send(v, k, cta, index)   thread 0: v into value `index` of CTA `cta`'s slot set of step k
//   send_all(v, k, index)    thread 0: the same into every CTA's (SENDERS = the cluster size)
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

  // v into value `index` of every CTA's slot set of step k (SENDERS CTAs, this one included).
  __device__ __forceinline__ void send_all(V v, int k, int index) {
    for (int c = 0; c < SENDERS; ++c) send(v, k, c, index);
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

// The values of CLUSTER ranks merged in rank order, lane r holding rank r's (`mine`; ignored on lanes >=
// CLUSTER): a butterfly over CLUSTER lanes, lane 0's result to the whole warp. merge_ranks: the CLUSTER
// float4 values of a ClusterMailbox step (index = sender rank).
template <int CLUSTER, typename S>
__device__ __forceinline__ S merge_lanes(float4 mine) {
  const int lane = threadIdx.x & 31;
  S r = lane < CLUSTER ? StatsOps<S>::unpack(mine) : StatsOps<S>::identity();
  r = warp_merge<CLUSTER>(r);
  return StatsOps<S>::shfl(r, 0);
}

// (Its own body rather than merge_lanes of a selected float4: that form changed the cluster kernels'
// SASS, e.g. softmax_fwd_cluster<bf16, 8, 8, 8, 16> 1320 -> 1312 instructions, measured with this one.)
template <int CLUSTER, typename S>
__device__ __forceinline__ S merge_ranks(const float4* all) {
  const int lane = threadIdx.x & 31;
  S r = lane < CLUSTER ? StatsOps<S>::unpack(all[lane]) : StatsOps<S>::identity();
  r = warp_merge<CLUSTER>(r);
  return StatsOps<S>::shfl(r, 0);
}

// One-shot merges (one row per cluster): a mailbox of one step. With a cluster barrier instead (thread
// 0 wrote a slot, arrive.release + wait.acquire, every CTA read every slot) softmax_fwd_cluster read
// 0.79 / 0.73 of copy at 65536 / 262144; with the mailbox 0.819 / 0.753 (run 225646Z).
template <int CLUSTER>
using StatsBox = ClusterMailbox<float4, CLUSTER, 1>;

// Arms this CTA's mailbox and arrives at the cluster barrier that cluster_merge / cluster_sum wait on
// (no CTA sends before every mailbox is armed). Every thread, once, before the merge.
template <int CLUSTER>
__device__ __forceinline__ void cluster_merge_open(StatsBox<CLUSTER>* box) {
  if (threadIdx.x == 0 && threadIdx.y == 0) box->init();
  cluster_arrive();
}

// The statistics of the whole cluster from each CTA's (identical in every thread of a CTA; 1-D
// cluster). Every thread of every CTA calls it once, after cluster_merge_open. Leaves the cluster
// barrier free for the caller's closing cluster_arrive / cluster_wait pair (see above).
template <int CLUSTER, typename S>
__device__ __forceinline__ S cluster_merge(S v, StatsBox<CLUSTER>* box) {
  cluster_wait();
  if (threadIdx.x == 0 && threadIdx.y == 0) box->send_all(StatsOps<S>::pack(v), 0, cluster_ctarank());
  return merge_ranks<CLUSTER, S>(box->receive(0));
}

// The sum of one float per rank, lane r holding rank r's (sum_lanes), or of the CLUSTER floats (.x,
// index = sender rank) of a ClusterMailbox step (sum_ranks): a butterfly over CLUSTER lanes, lane 0's
// result to the whole warp (the same bits in every CTA).
template <int CLUSTER>
__device__ __forceinline__ float sum_lanes(float mine) {
  const int lane = threadIdx.x & 31;
  float r = lane < CLUSTER ? mine : 0.f;
#pragma unroll
  for (int off = CLUSTER / 2; off > 0; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
  return __shfl_sync(0xffffffffu, r, 0);
}

template <int CLUSTER>
__device__ __forceinline__ float sum_ranks(const float4* all) {
  const int lane = threadIdx.x & 31;
  float r = lane < CLUSTER ? all[lane].x : 0.f;
#pragma unroll
  for (int off = CLUSTER / 2; off > 0; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
  return __shfl_sync(0xffffffffu, r, 0);
}

// Sum over the cluster of one value per CTA (identical in every thread of a CTA); same protocol.
template <int CLUSTER>
__device__ __forceinline__ float cluster_sum(float d, StatsBox<CLUSTER>* box) {
  cluster_wait();
  if (threadIdx.x == 0 && threadIdx.y == 0) box->send_all(make_float4(d, 0.f, 0.f, 0.f), 0, cluster_ctarank());
  return sum_ranks<CLUSTER>(box->receive(0));
}

// What a CTA contributes to a cluster-wide merge, by type: a float is summed over the ranks
// (sum_ranks), a statistics type merged (merge_ranks). mailbox_value: its float4 image for a mailbox
// slot; combine_ranks: the CLUSTER images of one step, combined in rank order.
__device__ __forceinline__ float4 mailbox_value(float d) { return make_float4(d, 0.f, 0.f, 0.f); }

template <typename S>
__device__ __forceinline__ float4 mailbox_value(const S& v) { return StatsOps<S>::pack(v); }

template <int CLUSTER>
__device__ __forceinline__ float combine_ranks(const float4* all, float) { return sum_ranks<CLUSTER>(all); }

template <int CLUSTER, typename S>
__device__ __forceinline__ S combine_ranks(const float4* all, const S&) { return merge_ranks<CLUSTER, S>(all); }

// A value back from its mailbox image.
__device__ __forceinline__ float from_mailbox(float4 v, float) { return v.x; }

template <typename S>
__device__ __forceinline__ S from_mailbox(float4 v, const S&) { return StatsOps<S>::unpack(v); }

// The same from one value per lane (lane r: rank r's image; the L2 mailbox of common/staged.cuh).
template <int CLUSTER>
__device__ __forceinline__ float combine_lanes(float4 mine, float) { return sum_lanes<CLUSTER>(mine.x); }

template <int CLUSTER, typename S>
__device__ __forceinline__ S combine_lanes(float4 mine, const S&) { return merge_lanes<CLUSTER, S>(mine); }

// One row per cluster (the non-persistent cluster kernels): a CTA's statistics of its part of the row
// (a stats type, or a float to be summed) become the row's through cluster_merge / cluster_sum, then the
// thread arrives at the closing cluster barrier (the kernel waits on it before it exits). An identity
// without a cluster. The persistent kernels merge per row through MailboxStep (common/staged.cuh).
template <int CLUSTER>
__device__ __forceinline__ float cluster_reduce(float d, StatsBox<CLUSTER>* box) {
  return cluster_sum<CLUSTER>(d, box);
}

template <int CLUSTER, typename S>
__device__ __forceinline__ S cluster_reduce(S v, StatsBox<CLUSTER>* box) {
  return cluster_merge<CLUSTER>(v, box);
}

template <int CLUSTER>
struct OneShotMerge {
  StatsBox<CLUSTER>* box;
  template <typename S>
  __device__ __forceinline__ S operator()(S st) const {
    if constexpr (CLUSTER > 1) {
      st = cluster_reduce<CLUSTER>(st, box);
      cluster_arrive();
    }
    return st;
  }
};

}  // namespace fk
