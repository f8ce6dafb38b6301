// fusedkit/cuda/common/staged.cuh
// Persistent "staged" row kernels (sm_90+): CLUSTER CTAs split each row into contiguous chunks, the grid
// holds at most the resident clusters and each cluster walks rows row0, row0 + G, ...; a CTA's chunk of
// the next row arrives by bulk copies into shared memory (one stage) while it finishes the current row
// from registers. Used by softmax_fwd_staged / softmax_bwd_staged (cuda/softmax.cu) and
// ce_fwd_persistent (cuda/cross_entropy.cu).
//
//   StagedChunk ch(inputs, smem, &bar, N);  // this CTA's chunk [v0, vend) of NT inputs' rows
//   staged_open<CLUSTER>(ch, box, row, load_first);
//   per row: ch.wait(phase); ch.take<ITEMS, T_ROW>(i, regs) per input; __syncthreads();
//            thread 0: ch.load(next row); then reduce, merge (MailboxStep), write from registers
//   staged_close<CLUSTER>();
#pragma once
#include "common/vec.cuh"
#include "common/bulk.cuh"
#include "common/cluster.cuh"

namespace fk {

// A CTA's part of the rows of a persistent staged kernel: CLUSTER CTAs split a row of N / VEC 16-byte
// vectors into contiguous chunks; this CTA holds vectors [v0, vend) (possibly none) and walks rows
// blockIdx.x / CLUSTER, + G, ... (G = the grid's clusters). load(row), thread 0, where bytes > 0: one
// bulk copy per input (NT inputs of row length N) of its chunk of `row` into NT consecutive chunk
// buffers of shared memory, all completing one mbarrier; wait(phase), every thread: until the last
// load has landed; take(i, r): vector v0 + threadIdx.x + i * T_ROW of input i's buffer into r (zeros
// past vend): thread t's register mapping of the cluster kernels.
template <typename T, int VEC, int CLUSTER, int NT>
struct StagedChunk {
  static_assert(VEC * sizeof(T) == 16, "bulk copies of whole 16-byte vectors");
  using V = Vec<T, VEC>;
  const T* src[NT];
  V* stage;
  StageRing ring;
  long long G, N;
  int chunk, v0, vend;
  unsigned bytes;

  __device__ __forceinline__ StagedChunk(const T* const (&inputs)[NT], void* smem, unsigned long long* bar, int n)
      : stage(reinterpret_cast<V*>(smem)), ring(bar, 1), G(gridDim.x / CLUSTER), N(n) {
#pragma unroll
    for (int i = 0; i < NT; ++i) src[i] = inputs[i];
    const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
    const int nvec = n / VEC;
    chunk = (nvec + CLUSTER - 1) / CLUSTER;
    v0 = min(rank * chunk, nvec);
    vend = min(v0 + chunk, nvec);
    bytes = (unsigned)(vend - v0) * 16u;
  }
  __device__ __forceinline__ void load(long long row) const {  // (callers test bytes > 0)
    ring.expect(0, NT * bytes);
#pragma unroll
    for (int i = 0; i < NT; ++i)
      bulk_load(stage + i * chunk, src[i] + row * N + (long long)v0 * VEC, bytes, ring.bar(0));
  }
  __device__ __forceinline__ void wait(unsigned& phase) const {
    if (bytes > 0) {
      ring.wait(0, phase);
      phase ^= 1u;
    }
  }
  template <int ITEMS, int T_ROW>
  __device__ __forceinline__ void take(int input, V (&r)[ITEMS]) const {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = v0 + threadIdx.x + i * T_ROW;
      if (v < vend) {
        r[i] = stage[input * chunk + v - v0];
      } else {
        vec_zero(r[i]);
      }
    }
  }
};

// Opens a persistent staged kernel: thread 0 initialises the mbarrier (and the cluster mailbox) and,
// with load_first, loads the first row; then every CTA's mailbox is armed before any CTA sends. Closes
// it: no CTA exits while another may still send to it.
template <int CLUSTER, typename C, typename BOX>
__device__ __forceinline__ void staged_open(const C& ch, BOX& box, long long row, bool load_first) {
  if (threadIdx.x == 0) {
    ch.ring.init();
    if constexpr (CLUSTER > 1) box.init();
    if (ch.bytes > 0 && load_first) ch.load(row);
  }
  __syncthreads();  // the barrier's init is visible
  if constexpr (CLUSTER > 1) {
    cluster_arrive();
    cluster_wait();
  }
}

template <int CLUSTER>
__device__ __forceinline__ void staged_close() {
  if constexpr (CLUSTER > 1) {
    cluster_arrive();
    cluster_wait();
  }
}

// The k-th row's statistics (or float sums) of every CTA of the cluster (CLUSTER > 1), combined in rank
// order through a two-slot ClusterMailbox (common/cluster.cuh): a CTA sends step k + 1 only after the
// block barrier of row k + 1, which follows every thread's use of step k's values. An identity without a
// cluster.
template <int CLUSTER>
struct MailboxStep {
  ClusterMailbox<float4, CLUSTER, 2>* box;
  int step, rank;
  template <typename S>
  __device__ __forceinline__ S operator()(S st) const {
    if constexpr (CLUSTER > 1) {
      if (threadIdx.x == 0) box->send_all(mailbox_value(st), step, rank);
      st = combine_ranks<CLUSTER>(box->receive(step), st);
      if (threadIdx.x == 0) box->rearm(step);
    }
    return st;
  }
};

}  // namespace fk
