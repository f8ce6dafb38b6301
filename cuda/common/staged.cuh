// fusedkit/cuda/common/staged.cuh
// Persistent "staged" row kernels (sm_90+): CLUSTER CTAs split each row into contiguous chunks, the grid
// holds at most the resident clusters and each cluster walks rows row0, row0 + G, ...; a CTA's chunks of
// the next STAGES rows arrive by bulk copies into a ring of STAGES shared-memory buffers while it
// finishes the current row from registers. Used by softmax_fwd_staged / softmax_bwd_staged
// (cuda/softmax.cu) and ce_fwd_persistent (cuda/cross_entropy.cu).
//
//   StagedChunk<T, VEC, CLUSTER, NT, ITEMS, T_ROW, STAGES> ch(inputs, smem, bars, N);  // chunk [v0, vend)
//   staged_open<CLUSTER>(ch, box, row, M, loaded);   // loads rows row, row + G, ... (STAGES of them)
//   per row: ch.take_row(regs, wait, ch.refill_row(row, M)); then reduce, merge (MailboxStep), write from
//            registers
//   staged_close<CLUSTER>();
//
// STAGES = 1 is the shipped form: registers hold the current row, one buffer the next. More stages load
// further ahead (STAGES rows in flight a CTA) at STAGES times the shared memory, so fewer CTAs fit an SM.
#pragma once
#include "common/vec.cuh"
#include "common/bulk.cuh"
#include "common/cluster.cuh"

namespace fk {

// A CTA's part of the rows of a persistent staged kernel: CLUSTER CTAs split a row of N / VEC 16-byte
// vectors into contiguous chunks; this CTA holds vectors [v0, vend) (possibly none) and walks rows
// blockIdx.x / CLUSTER, + G, ... (G = the grid's clusters). Thread t keeps vectors v0 + t + i * T_ROW,
// i < ITEMS, of each of NT inputs (row length N) in registers: the register mapping of the cluster
// kernels. Buffer b of the ring (NT consecutive chunks) holds the rows of steps b, b + STAGES, ...; one
// bulk copy per input fills it, completing mbarrier b.
//   load(b, row), thread 0: every input's chunk of `row` into buffer b;
//   take_row(r, wait, next), every thread: the current buffer (step k: buffer k % STAGES) into
//   registers after its copy has landed (zeros past vend, or everywhere if not `wait`: the row was not
//   loaded), a block barrier, then thread 0 refills the buffer with row `next` (none if next < 0:
//   refill_row(row, M) is the row of the same buffer's next turn, or -1 past M; a caller that also skips
//   rows, as cross-entropy's ignored ones, tests ahead(row) itself), and the ring moves on.
template <typename T, int VEC, int CLUSTER, int NT, int ITEMS, int T_ROW, int STAGES = 1>
struct StagedChunk {
  static_assert(VEC * sizeof(T) == 16, "bulk copies of whole 16-byte vectors");
  static_assert(STAGES >= 1 && STAGES <= 4, "1 to 4 buffers");
  using V = Vec<T, VEC>;
  static constexpr int kStages = STAGES;
  const T* src[NT];
  V* stage;
  StageRing ring;
  long long G, N;
  int chunk, v0, vend;
  int b = 0;            // the buffer of the current row
  unsigned phases = 0;  // bit b: the parity of buffer b's next fill

  // bars: STAGES mbarriers in shared memory
  __device__ __forceinline__ StagedChunk(const T* const (&inputs)[NT], void* smem, unsigned long long* bars, int n)
      : stage(reinterpret_cast<V*>(smem)), ring(bars, STAGES), G(gridDim.x / CLUSTER), N(n) {
#pragma unroll
    for (int i = 0; i < NT; ++i) src[i] = inputs[i];
    const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
    const ClusterChunk<CLUSTER> part(n / VEC, rank);
    chunk = part.chunk;
    v0 = part.v0;
    vend = part.vend;
  }
  // the row of the current row's buffer's next turn; refill_row: the same, or -1 (none) past M
  __device__ __forceinline__ long long ahead(long long row) const { return row + STAGES * G; }
  __device__ __forceinline__ long long refill_row(long long row, long long M) const {
    return ahead(row) < M ? ahead(row) : -1;
  }
  __device__ __forceinline__ V* buffer(int k) const { return stage + k * NT * chunk; }
  __device__ __forceinline__ void load(int k, long long row) const {
    const unsigned bytes = (unsigned)(vend - v0) * 16u;
    if (bytes == 0) return;
    ring.expect(k, NT * bytes);
#pragma unroll
    for (int i = 0; i < NT; ++i)
      bulk_load(buffer(k) + i * chunk, src[i] + row * N + (long long)v0 * VEC, bytes, ring.bar(k));
  }
  __device__ __forceinline__ void take_row(V (&r)[NT][ITEMS], bool wait, long long next) {
    if (wait && vend > v0) ring.wait(b, (phases >> b) & 1u);
    const V* buf = buffer(b);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int v = v0 + threadIdx.x + k * T_ROW;
        if (wait && v < vend) {
          r[i][k] = buf[i * chunk + v - v0];
        } else {
          vec_zero(r[i][k]);
        }
      }
    }
    __syncthreads();  // the buffer is read: refill it
    if (threadIdx.x == 0 && next >= 0) load(b, next);
    if (wait) phases ^= 1u << b;
    b = b + 1 == STAGES ? 0 : b + 1;
  }
};

// Opens a persistent staged kernel: thread 0 initialises the mbarriers (and the cluster mailbox) and
// loads the first STAGES rows of this cluster (row, row + G, ...; those below M for which loaded(r)
// holds; the consumer takes a row with wait = loaded(r)); then every CTA's mailbox is armed before any
// CTA sends. Closes it: no CTA exits while another may still send to it.
template <int CLUSTER, typename C, typename BOX, typename LOADED>
__device__ __forceinline__ void staged_open(const C& ch, BOX& box, long long row, long long M, LOADED loaded) {
  if (threadIdx.x == 0) {
    ch.ring.init();
    if constexpr (CLUSTER > 1) box.init();
    for (int k = 0; k < C::kStages; ++k, row += ch.G) {
      if (row < M && loaded(row)) ch.load(k, row);
    }
  }
  __syncthreads();  // the barriers' init is visible
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
