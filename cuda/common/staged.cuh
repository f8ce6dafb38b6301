// fusedkit/cuda/common/staged.cuh
// Persistent "staged" row kernels (sm_90+): CLUSTER CTAs split each row into contiguous chunks, the grid
// holds at most the resident clusters and each cluster walks rows row0, row0 + G, ...; a CTA's chunk of
// the next row arrives by bulk copies into shared memory (one stage) while it finishes the current row
// from registers. Used by softmax_fwd_staged / softmax_bwd_staged (cuda/softmax.cu) and
// ce_fwd_persistent (cuda/cross_entropy.cu).
//
//   StagedChunk<T, VEC, CLUSTER, NT, ITEMS, T_ROW> ch(inputs, smem, bars, N);  // this CTA's chunk [v0, vend)
//   staged_open<CLUSTER>(ch, box, row, load_first);
//   per row: ch.take_row(regs, phase, wait, next row); then reduce, merge (MailboxStep), write from
//            registers
//   staged_close<CLUSTER>();
//
// Grouped form (no cluster): the CLUSTER CTAs of a row are a group of consecutive blocks that need not
// share a GPC, merging per row through an L2 mailbox in global memory (L2Step) instead of distributed
// shared memory. Clusters of 8 or 16 CTAs fill 240 / 336 of the H100's CTA slots (30 / 21 resident
// clusters: the GPCs do not divide into them), groups fill every slot. The kernel is launched
// cooperatively (all blocks resident, or the launch fails: a group's CTAs wait on each other), uses
// staged_open<1> / staged_close<1>, and ends with l2_close.
#pragma once
#include "common/vec.cuh"
#include "common/bulk.cuh"
#include "common/cluster.cuh"

namespace fk {

// FK_STAGED_PIECES: the chunk of each input arrives as that many bulk copies (pieces of whole items,
// one mbarrier each) instead of one, so the refill of piece p for the next row is issued as soon as
// piece p of the current row is in registers, and loads stay in flight while the rest is taken (1 = one
// copy; a count that does not divide ITEMS falls back to 1). An experiment, off: on the H100 two pieces
// tied with one, four or eight lost 9-10 points to their barriers
// (ab_staged_pieces_H100_2026-12-06T1450Z.json); two wait for an H200 A/B (docs/perf_notes.rst).
#ifndef FK_STAGED_PIECES
#define FK_STAGED_PIECES 1
#endif

// A CTA's part of the rows of a persistent staged kernel: CLUSTER CTAs split a row of N / VEC 16-byte
// vectors into contiguous chunks; this CTA holds vectors [v0, vend) (possibly none) and walks rows
// blockIdx.x / CLUSTER, + G, ... (G = the grid's clusters). Thread t keeps vectors v0 + t + i * T_ROW,
// i < ITEMS, of each of NT inputs (row length N) in registers: the register mapping of the cluster
// kernels. The chunk buffers in shared memory (NT consecutive chunks) are filled by bulk copies in
// PIECES pieces of ITEMS / PIECES items each, piece p completing mbarrier p.
//   load(row), thread 0: every piece of `row` (the first row);
//   take_row(r, phase, wait, next), every thread: per piece, wait until it has landed (if `wait`), move
//   it to registers (zeros past vend, or everywhere if not `wait`), a block barrier, then thread 0
//   refills it with row `next` (none if next < 0).
template <typename T, int VEC, int CLUSTER, int NT, int ITEMS, int T_ROW>
struct StagedChunk {
  static_assert(VEC * sizeof(T) == 16, "bulk copies of whole 16-byte vectors");
  static constexpr int PIECES = ITEMS % FK_STAGED_PIECES == 0 ? FK_STAGED_PIECES : 1;
  static constexpr int PIECE_ITEMS = ITEMS / PIECES;
  using V = Vec<T, VEC>;
  const T* src[NT];
  V* stage;
  StageRing ring;
  long long G, N;
  int chunk, v0, vend;

  // bars: PIECES mbarriers in shared memory
  __device__ __forceinline__ StagedChunk(const T* const (&inputs)[NT], void* smem, unsigned long long* bars, int n)
      : stage(reinterpret_cast<V*>(smem)), ring(bars, PIECES), G(gridDim.x / CLUSTER), N(n) {
#pragma unroll
    for (int i = 0; i < NT; ++i) src[i] = inputs[i];
    const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
    const ClusterChunk<CLUSTER> part(n / VEC, rank);
    chunk = part.chunk;
    v0 = part.v0;
    vend = part.vend;
  }
  // piece p: the vectors [v0 + piece_lo(p), v0 + piece_lo(p + 1)) of the chunk (the chunk holds at most
  // ITEMS * T_ROW vectors: the host's config fits it)
  __device__ __forceinline__ int piece_lo(int p) const {
    return PIECES == 1 ? (p == 0 ? 0 : vend - v0) : min(p * PIECE_ITEMS * T_ROW, vend - v0);
  }
  __device__ __forceinline__ unsigned piece_bytes(int p) const {
    return (unsigned)(piece_lo(p + 1) - piece_lo(p)) * 16u;
  }
  __device__ __forceinline__ void load_piece(int p, long long row) const {
    const unsigned b = piece_bytes(p);
    if (b == 0) return;
    ring.expect(p, NT * b);
    const int lo = piece_lo(p);
#pragma unroll
    for (int i = 0; i < NT; ++i)
      bulk_load(stage + i * chunk + lo, src[i] + row * N + (long long)(v0 + lo) * VEC, b, ring.bar(p));
  }
  __device__ __forceinline__ void load(long long row) const {
#pragma unroll
    for (int p = 0; p < PIECES; ++p) load_piece(p, row);
  }
  __device__ __forceinline__ void take_row(V (&r)[NT][ITEMS], unsigned& phase, bool wait, long long next) const {
#pragma unroll
    for (int p = 0; p < PIECES; ++p) {
      if (wait && piece_bytes(p) > 0) ring.wait(p, phase);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
#pragma unroll
        for (int k = p * PIECE_ITEMS; k < (p + 1) * PIECE_ITEMS; ++k) {
          const int v = v0 + threadIdx.x + k * T_ROW;
          if (wait && v < vend) {
            r[i][k] = stage[i * chunk + v - v0];
          } else {
            vec_zero(r[i][k]);
          }
        }
      }
      __syncthreads();  // piece p is read: refill it with the next row's
      if (threadIdx.x == 0 && next >= 0) load_piece(p, next);
    }
    if (wait) phase ^= 1u;
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
    if (load_first) ch.load(row);
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

// The L2 mailbox of a row group (grouped form): per step one float4 of each of C CTAs, in slot set
// step % 2 of the group's 2 x C slots. Each float travels with the step's tag (step + 1) in one 64-bit
// word (tag << 32 | float bits), so a word is valid on its own, with no fence: a sender's thread 0
// stores its four words (st.relaxed.gpu, two 16-byte stores of two words); in warp 0 of every CTA of
// the group lane r polls rank r's words (ld.relaxed.gpu, past L1) until all four carry the tag, the
// lanes merge in rank order (combine_lanes), so every CTA gets the same bits, and lane 0 hands the result
// to the other warps through shared memory (a block barrier). H100, 512 x 262144 softmax forward, 8 CTAs
// of 512 threads a group (ab_softmax_grouped_*_H100_2026-12-06T17*.json; the cluster form 0.91 of copy
// in each run): a release store of a separate tag with acquire polls in every warp 0.72 (the release
// waits for the sender's earlier stores of the previous row), the tagged words polled by every warp
// 0.77 (some 1 MB of L2 loads a polling round), by warp 0 only 0.91. A CTA sends step k + 2 into the
// slot of step k only after it received step k + 1, i.e. after every CTA of the group sent step k + 1,
// which each does only after a block barrier that follows all its reads of step k (the rule of
// MailboxStep; the barrier here orders the shared float4's reuse the same way). l2_close leaves the
// group's slots and counter all zero, so a launch finds the buffer zero whatever layout (C) the previous
// one used; the host zeroes it once. A launch that dies midway leaves it dirty.
struct alignas(16) L2Slot {
  unsigned long long w[4];
};

template <int C>
struct L2Step {
  L2Slot* slots;  // the group's 2 x C slots, then its counter
  float4* shared;  // a float4 of shared memory: warp 0's result for the other warps
  int step, rank;
  template <typename S>
  __device__ __forceinline__ S operator()(S st) const {
    if (threadIdx.x < 32) {
      const S r = exchange(st);
      if (threadIdx.x == 0) *shared = mailbox_value(r);
    }
    __syncthreads();
    return from_mailbox(*shared, st);
  }
  template <typename S>
  __device__ __forceinline__ S exchange(S st) const {
    L2Slot* set = slots + (step & 1) * C;
    const unsigned long long tag = ((unsigned long long)step + 1) << 32;
    if (threadIdx.x == 0) {
      const float4 v = mailbox_value(st);
      asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};"
                   :: "l"(&set[rank].w[0]), "l"(tag | __float_as_uint(v.x)), "l"(tag | __float_as_uint(v.y))
                   : "memory");
      asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};"
                   :: "l"(&set[rank].w[2]), "l"(tag | __float_as_uint(v.z)), "l"(tag | __float_as_uint(v.w))
                   : "memory");
    }
    const int lane = threadIdx.x & 31;
    float4 mine = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane < C) {
      const unsigned long long* w = set[lane].w;
      unsigned long long a, b, c, d;
      do {
        asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(w) : "memory");
        asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(w + 2) : "memory");
      } while (((a >> 32) != (tag >> 32)) | ((b >> 32) != (tag >> 32)) | ((c >> 32) != (tag >> 32)) |
               ((d >> 32) != (tag >> 32)));
      mine = make_float4(__uint_as_float((unsigned)a), __uint_as_float((unsigned)b),
                         __uint_as_float((unsigned)c), __uint_as_float((unsigned)d));
    }
    return combine_lanes<C>(mine, st);
  }
};

// The end of a grouped kernel (every thread of the CTA): the last CTA of the group to get here zeroes
// the group's slots and counter.
template <int C>
__device__ __forceinline__ void l2_close(L2Slot* slots) {
  __syncthreads();  // every thread's reads of the last step are done
  if (threadIdx.x == 0) {
    unsigned* done = reinterpret_cast<unsigned*>(slots + 2 * C);
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(done) : "memory");
    if (before == C - 1) {
      for (int i = 0; i <= 2 * C; ++i) slots[i] = L2Slot{};
    }
  }
}

// Slots of one group's L2 mailbox (2 x C, then one for the counter).
template <int C>
__host__ __device__ constexpr int l2_group_slots() { return 2 * C + 1; }

}  // namespace fk
