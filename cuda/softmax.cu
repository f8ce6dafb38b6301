// fusedkit/cuda/softmax.cu -- softmax and log-softmax over the last dimension, forward and backward,
// with an input scale, a broadcast boolean mask and a causal mask (Transformer Engine's scaled /
// scaled-masked / scaled-upper-triangular softmax in one family).
//
// Forward, row in registers (softmax_fwd): the thread mapping of norm_fwd (cuda/norms.cu). A row of N
// elements is split into N / VEC vectors of 16 bytes (VEC = 8 for bf16/fp16, 4 for fp32; narrower when
// N or a pointer's alignment demands). 32 * WARPS threads own one row; thread t holds vectors t, t + T,
// ..., t + (ITEMS - 1) * T (T = 32 * WARPS), so each warp load is one coalesced 512-byte access. Blocks
// of fewer than 4 warps per row take RPB = 4 / WARPS rows. One group of rows per block,
// non-persistent grid, plain loads, the row kept as raw storage in registers.
//   Statistics: ONE reduction round. Each thread takes the key k_t of its max and
//   s_t = sum 2^(fma(x, c, -k_t)) (Numerics below); the (k, s) pairs are merged online
//   (common/online_softmax.cuh: shuffles, then one shared-memory round across warps merged by a
//   butterfly). Then y = 2^(fma(x, c, -k)) / s.
//   Two exponentials per element (local sum, output), as a max-then-sum scheme would need without
//   fp32 storage for the exponentials; one barrier round instead of two.
// Forward, long rows (softmax_fwd_cluster, sm_90+): a thread-block cluster of C CTAs (2 to 16) owns a
// row (launched with a cluster attribute, Launcher(cluster=C): C up to 16, the non-portable size H100 /
// H200 allow); CTA r holds the contiguous chunk of vectors [r * ceil(nvec / C), ...) in registers with the same
// per-CTA mapping. The CTA's (k, s) is merged across the cluster through distributed shared memory
// (common/cluster.cuh: each CTA st.async-stores its (k, s) into every CTA's mailbox, a butterfly over C
// lanes in rank order), so every CTA gets identical statistics. 262144 bf16 = 8 CTAs x 512 threads x 64 elements; 65536 = 2 x 512 x 64.
// Long rows, unmasked, on sm_90 (softmax_fwd_staged): the same mappings in a persistent grid, each CTA's
// chunk of the next row arriving by a bulk copy into shared memory while it works on the current one.
// Rows that fit neither (or GPUs without clusters) use softmax_fwd_looped: one row per 512-thread
// block, an online (m, s) pass over global memory, then a second pass that re-reads x (mostly from L2)
// and writes y: 6MN bytes; correct for any N.
//
// Masks (MASKING: 0 none, 1 causal, 2 boolean tensor, 3 both). Causal: row r is query q = r % Sq of an
// (Sq, N) score matrix; columns j > q + N - Sq are masked (bottom-right aligned), computed from indices:
// no mask traffic, and vectors entirely above the diagonal are not even loaded. Tensor: True = masked,
// the mask broadcast to x's shape by strides: Python collapses x's leading dims into at most four
// (n0..n3, row-major) with the mask's strides s0..s3 in bytes (0 on broadcast dims); mcol = 1 when the
// mask has one byte per column (loaded as VEC-byte vectors), 0 when it broadcasts over the columns (one
// byte per row). A thread keeps its mask as one 64-bit word (ITEMS * VEC <= 64). Masked values become
// -inf; a fully masked row (or a row of -inf) has m = -inf, s = 0 and gives zeros, never NaN.
// The row's mask offset and causal query (r % Sq) divide by n3, n2, n1 and Sq as multiply-highs with
// multipliers from the host (common/fastdiv.cuh; rows >= 2^32 take 64-bit divisions), and a thread
// issues its x and mask loads (chunks of 2 vectors beyond 4) before it turns any mask byte into bits
// (load_x_row); a per-row mask byte is tested only after that. Both changes are checked in the SASS,
// not yet measured on the GPU (docs/perf_notes.rst).
//
// Backward (softmax_bwd, _cluster, _staged, _looped; same row mappings): one reduction, D = sum(dy * y)
// (log-softmax: D = sum(dy)), then dx = scale * y * (dy - D) (log-softmax: scale * (dy - exp(y) * D)).
// Masked positions have y = 0 (log: -inf), so they get dx = 0 with no mask input.
//
// Bytes: forward read x + write y = 4MN for 2-byte dtypes (plus the mask: MN bytes when not
// broadcast, usually far less; causal reads only the visible part of x); forward + backward
// 4MN + 6MN = 10MN. Looped paths re-read their inputs (6MN forward, 10MN backward).
//
// Numerics: fp32 math on keyed exponents (common/online_softmax.cuh, MaxSum): c = fl(scale * log2 e), a
// row's key k = fl(max x * c), each term 2^(fma(x, c, -k)) (one FFMA on the raw input: the product is
// exact inside it, so offsets of 1e4 cost nothing, and merges rescale by exact key differences, so k's
// own rounding cancels); y = 2^(fma(x, c, -k)) * (1 / s) (softmax) or ln 2 (fma(x, c, -k) - log2 s)
// (log-softmax); one rounding to the output dtype. Unmasked rows with scale > 0 find the max on the raw
// values (packed max.bf16x2 / max.f16x2 for 16-bit inputs) and multiply once.
// Instructions (SASS, sm_90a, softmax_fwd<bf16, 8, 4, 8>, 32 elements a thread, fast path): 824 with the
// earlier (v - m) * log2 e form and element-wise zeroing of the vectors past the row's end (two PRMTs
// per element), 656 now.
// Variants considered: a max reduction followed by a sum reduction (two barrier rounds: dropped for the
// online merge); a prescaled v * log2(e) against a natural-unit max (its rounding did not cancel: ~1e-3
// absolute in the exponent at offsets of 1e4; the keyed form above fixes that); keeping the sum pass's
// exponentials in fp32 registers for the output (the FK_SOFTMAX_ONE_EXP experiment below, off until an
// H200 A/B); staging rows through shared memory with bulk copies (see cross_entropy.cu's ce_fwd_staged).
#include "common/dtypes.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"
#include "common/online_softmax.cuh"
#include "common/cluster.cuh"
#include "common/fastdiv.cuh"
#include "common/bulk.cuh"
#include "common/staged.cuh"

namespace fk {

constexpr int kSoftmaxLoopedThreads = 512;

template <int WARPS>
struct SoftmaxRowsPerBlock {
  static constexpr int value = WARPS < 4 ? 4 / WARPS : 1;
};

// Minimum resident blocks asked of ptxas: 1024 threads' worth, i.e. at most 64 registers per thread.
template <int THREADS>
struct SoftmaxMinBlocks {
  static constexpr int value = THREADS >= 1024 ? 1 : 1024 / THREADS;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Broadcast-mask description shared by every row of a launch.
struct MaskParams {
  const unsigned char* mask;  // boolean bytes (null without a tensor mask)
  long long sq;               // causal: rows of the (Sq, N) score matrix
  long long n1, n2, n3;       // collapsed leading dims of x (n0 implicit), row-major
  long long s0, s1, s2, s3;   // the mask's strides over them, in bytes (0 = broadcast)
  int mcol;                   // 1: one mask byte per column; 0: one byte per row
  FastDiv sq_div, n1_div, n2_div, n3_div;  // the divisions by sq, n1, n2, n3 (common/fastdiv.cuh)
};

// One row's mask: columns > limit are masked (causal; N without a causal mask), plus per-column bytes
// or a whole-row byte.
struct RowMask {
  const unsigned char* bytes;  // per-column bytes of the row (null: none)
  long long limit;
  unsigned hide;               // the per-row byte (nonzero: every column masked), tested only with the bits
};

// q = r / d, r = r % d. Rows below 2^32 (every launch of fewer than 2^32 rows) divide in 32 bits by
// multiply-high (fd: d's FastDiv), exact for any d, and every quotient that follows is below 2^32 too;
// larger rows take the 64-bit division (a subroutine of ~70 instructions). These run once per row in
// every thread: with `/` the three 32-bit divisions of a 4-dim mask cost ~60 instructions, ~8 an element
// at 8 elements per thread (softmax_fwd<bf16, 8, 2, 2>).
__device__ __forceinline__ long long divmod_row(long long& r, long long d, FastDiv fd) {
  if ((unsigned long long)r >> 32 == 0) {
    const unsigned n = (unsigned)r, q = fd.div(n);
    r = q;
    return n - q * (unsigned)d;  // the remainder is below 2^32, so the wrap-around product is exact
  }
  const long long q = r / d, m = r - q * d;
  r = q;
  return m;
}

template <int MASKING>
__device__ __forceinline__ RowMask row_mask(long long row, int N, const MaskParams& mp) {
  RowMask rm{nullptr, (long long)N, 0u};
  if constexpr ((MASKING & 1) != 0) {
    long long r = row;
    rm.limit = divmod_row(r, mp.sq, mp.sq_div) + N - mp.sq;
  }
  if constexpr ((MASKING & 2) != 0) {
    long long off = 0;
    if ((unsigned long long)row >> 32 == 0) {
      // one test per row, then 32-bit quotients throughout (each below the row); a dim of size 1 has
      // the multiplier of 1 (q = r), so no test per dim either: 3 multiply-highs and 3 wide multiply-adds
      unsigned r = (unsigned)row;
      const unsigned q3 = mp.n3_div.div(r), q2 = mp.n2_div.div(q3), q1 = mp.n1_div.div(q2);
      off = (long long)(r - q3 * (unsigned)mp.n3) * mp.s3 + (long long)(q3 - q2 * (unsigned)mp.n2) * mp.s2 +
            (long long)(q2 - q1 * (unsigned)mp.n1) * mp.s1 + (long long)q1 * mp.s0;
    } else {
      long long r = row;
      if (mp.n3 > 1) off += divmod_row(r, mp.n3, mp.n3_div) * mp.s3;
      if (mp.n2 > 1) off += divmod_row(r, mp.n2, mp.n2_div) * mp.s2;
      if (mp.n1 > 1) off += divmod_row(r, mp.n1, mp.n1_div) * mp.s1;
      off += r * mp.s0;
    }
    if (mp.mcol) {
      rm.bytes = mp.mask + off;
    } else {
      rm.hide = mp.mask[off];  // tested after the row's loads are issued (load_x_row)
    }
  }
  return rm;
}

// Visible columns of the vector starting at column c0: the columns past `limit` are a suffix of it.
template <int VEC>
__device__ __forceinline__ int visible_cols(long long limit, long long c0) {
  const long long vis = limit - c0 + 1;  // columns c0 .. limit are visible
  return vis <= 0 ? 0 : (vis >= VEC ? VEC : (int)vis);
}

// Mask bits of a vector (bit j: column c0 + j is masked) are built per vector, not per element: the k
// visible columns give a suffix of set bits, and the mask bytes are compared four at a time (__vcmpne4)
// and gathered into four bits with one multiply (byte i in {0, 1} lands on bit 24 + i; no carries: every
// partial sum is < 16). The kernels are issue-bound, and the per-element 64-bit compares and byte tests
// this replaces cost the causal forward 1064 instructions against the unmasked 712
// (softmax_fwd<bf16, 8, 2, 8>).
__device__ __forceinline__ unsigned mask_nibble(unsigned w) {
  return ((__vcmpne4(w, 0u) & 0x01010101u) * 0x01020408u) >> 24;
}

// The mask bytes of one vector as loaded: VEC / 4 words where VEC is a multiple of 4, else VEC bytes.
// Loaded (or zeroed) in one step and turned into bits in another, so that a row's mask loads are all in
// flight before the first is used (load_x_row).
template <int VEC, bool WORDS = VEC % 4 == 0>
struct MaskVec {
  Vec<unsigned, VEC / 4> w;
  __device__ __forceinline__ void load(const unsigned char* p) {
    w = load_vec<unsigned, VEC / 4>(reinterpret_cast<const unsigned*>(p));
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) w.v[q] = 0u;
  }
  __device__ __forceinline__ unsigned bits() const {
    unsigned b = 0;
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) b |= mask_nibble(w.v[q]) << (4 * q);
    return b;
  }
};

template <int VEC>
struct MaskVec<VEC, false> {
  Vec<unsigned char, VEC> c;
  __device__ __forceinline__ void load(const unsigned char* p) { c = load_vec<unsigned char, VEC>(p); }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < VEC; ++j) c.v[j] = 0;
  }
  __device__ __forceinline__ unsigned bits() const {
    unsigned b = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c.v[j]) b |= 1u << j;
    return b;
  }
};

// Loads this thread's vectors v0 + threadIdx.x + i * T_ROW (< vend) of one row; returns the mask bits
// (bit i * VEC + j). Vectors that are entirely masked by the causal limit are not loaded.
// Masked rows go in chunks of CHUNK vectors: first every x load and mask load of the chunk, then the
// chunk's mask bits, so the loads are in flight together as the plain kernel's x loads are. Written as
// one step per vector (each mask load in its own branch, used by the next instruction), a thread waited
// for one L2 round trip per vector in turn (SASS of softmax_fwd<bf16, 8, 2, 2, false, 2>); now its four
// loads are issued before the first use. Up to 4 vectors make one chunk; more go 2 at a time (2
// registers per 8-byte mask vector): all 8 at once spilled (up to 50 bytes of spill stores) under the
// 64-register cap, as did issuing all x loads first and the mask loads in chunks after them;
// chunks of 4 did not spill but ptxas then issued the mask loads ahead of the x loads. With chunks of 2,
// ptxas overlaps neighbouring chunks: softmax_fwd<bf16, 8, 8, 2, false, 2> waits on mask data twice per
// row (6 loads, then 2) instead of eight times, its cluster form (8, 8, 16, 2) four times. A per-row
// mask byte (rm.hide) is applied last, to whole vectors: tested inside the chunks, ptxas put the test
// (a wait for the byte) between the x loads. The unmasked kernels keep the one loop: the chunked form
// with a single chunk gave them the same SASS on sm_90a but not on sm_100a.
template <typename T, int VEC, int ITEMS, int T_ROW, int MASKING, bool FULL = false>
__device__ __forceinline__ unsigned long long load_x_row(Vec<T, VEC> (&raw)[ITEMS], const T* __restrict__ xrow,
                                                         const RowMask& rm, int v0, int vend) {
  static_assert(MASKING == 0 || ITEMS * VEC <= 64, "mask bits of a thread must fit 64 bits");
  static_assert(MASKING == 0 || !FULL, "FULL rows are unmasked");
  if constexpr (MASKING == 0) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int v = v0 + threadIdx.x + i * T_ROW;
      if (FULL ? vend > v0 : v < vend) {  // FULL: every vector is in the row; vend == v0 marks no row
        raw[i] = load_vec<T, VEC>(xrow + (long long)v * VEC);
      } else {
        vec_zero(raw[i]);  // whole words: zeroing element by element cost two PRMTs per element
      }
    }
    return 0ull;
  } else {
    constexpr int CHUNK = ITEMS <= 4 ? ITEMS : 2;
    unsigned long long bits = 0;
#pragma unroll
    for (int i0 = 0; i0 < ITEMS; i0 += CHUNK) {
      MaskVec<VEC> mv[CHUNK];
      int vis[CHUNK];
#pragma unroll
      for (int i = i0; i < i0 + CHUNK && i < ITEMS; ++i) {  // the loads
        const int v = v0 + threadIdx.x + i * T_ROW;
        const long long c0 = (long long)v * VEC;
        const int k = (MASKING & 1) != 0 ? visible_cols<VEC>(rm.limit, c0) : VEC;  // causal limit only
        if (v < vend && k > 0) {
          raw[i] = load_vec<T, VEC>(xrow + c0);
        } else {
          vec_zero(raw[i]);
        }
        if constexpr ((MASKING & 2) != 0) {
          if (v < vend && k > 0 && rm.bytes != nullptr) {
            mv[i - i0].load(rm.bytes + c0);
          } else {
            mv[i - i0].zero();
          }
        }
        vis[i - i0] = k;
      }
#pragma unroll
      for (int i = i0; i < i0 + CHUNK && i < ITEMS; ++i) {  // the mask bits
        const int v = v0 + threadIdx.x + i * T_ROW;
        unsigned b = ((1u << VEC) - 1u) ^ ((1u << vis[i - i0]) - 1u);
        if constexpr ((MASKING & 2) != 0) b |= mv[i - i0].bits();
        if (v < vend) bits |= (unsigned long long)b << (i * VEC);
      }
    }
    if constexpr ((MASKING & 2) != 0) {
      if (rm.hide != 0) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
          if (v0 + (int)threadIdx.x + i * T_ROW < vend) bits |= (unsigned long long)((1u << VEC) - 1u) << (i * VEC);
      }
    }
    return bits;
  }
}

// fp32 value of element j of a stored vector, converted from the packed 32-bit words at every use.
// Why not to_float: the compiler would keep unpacked or converted copies of the row alive across the
// passes (NVVM hoists and CSEs them; ptxas CSEs identical instructions even from volatile asm), which
// doubles the register footprint of a bf16/fp16 row (64 registers for 64 elements) and spilled under the
// 64-register cap. So the conversions are volatile asm on the packed word, and the passes after the row
// reduction use a second instruction form (FORM 1: prmt for bf16; sign flip, cvt, negate for fp16) that
// ptxas cannot merge with the first. A conversion per use costs one or two instructions, and the
// forward is issue-bound on the H200 (docs/perf_notes.rst): fp32 copies of the row would remove them
// only at twice the registers.
template <int FORM>
__device__ __forceinline__ float half_word_float(bf16, unsigned w, int hi) {
  unsigned u;
  if constexpr (FORM == 0) {
    if (hi) {
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(u) : "r"(w));
    } else {
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(u) : "r"(w));
    }
  } else {
    if (hi) {
      asm volatile("prmt.b32 %0, %1, 0, 0x3244;" : "=r"(u) : "r"(w));
    } else {
      asm volatile("prmt.b32 %0, %1, 0, 0x1044;" : "=r"(u) : "r"(w));
    }
  }
  return __uint_as_float(u);
}
template <int FORM>
__device__ __forceinline__ float half_word_float(f16, unsigned w, int hi) {
  float f;
  if constexpr (FORM == 0) {
    if (hi) {
      asm volatile("{.reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h;}" : "=f"(f) : "r"(w));
    } else {
      asm volatile("{.reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l;}" : "=f"(f) : "r"(w));
    }
  } else {
    if (hi) {
      asm volatile("{.reg .b32 t; .reg .f16 l, h; xor.b32 t, %1, 0x80008000; mov.b32 {l, h}, t; cvt.f32.f16 %0, h; neg.f32 %0, %0;}"
                   : "=f"(f) : "r"(w));
    } else {
      asm volatile("{.reg .b32 t; .reg .f16 l, h; xor.b32 t, %1, 0x80008000; mov.b32 {l, h}, t; cvt.f32.f16 %0, l; neg.f32 %0, %0;}"
                   : "=f"(f) : "r"(w));
    }
  }
  return f;
}

template <typename T, int VEC, int FORM = 0>
__device__ __forceinline__ float elem_float(const Vec<T, VEC>& r, int j) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
    const unsigned w = reinterpret_cast<const unsigned*>(&r)[j / 2];
    return half_word_float<FORM>(T{}, w, j & 1);
  } else if constexpr (sizeof(T) == 2) {
    return half_word_float<FORM>(T{}, (unsigned)r.v[j].bits, 0);
  } else {
    return to_float(r.v[j]);
  }
}

// The key image of element j, fl(x_j * c) with c = fl(scale * log2 e) (-inf where masked): a row's key is
// the max of these (common/online_softmax.cuh, MaxSum).
template <typename T, int VEC, int MASKING>
__device__ __forceinline__ float key_value(const Vec<T, VEC>& r, int j, unsigned long long bits, int bit, float c) {
  const float f = __fmul_rn(elem_float<T, VEC, 0>(r, j), c);
  if constexpr (MASKING != 0) return ((bits >> bit) & 1ull) ? neg_inf() : f;
  return f;
}

// The exponent of element j relative to key k: fma(x_j, c, -k) (-inf where masked).
template <typename T, int VEC, int MASKING, int FORM = 0>
__device__ __forceinline__ float keyed_exponent(const Vec<T, VEC>& r, int j, unsigned long long bits, int bit,
                                                float c, float k) {
  const float t = fmaf(elem_float<T, VEC, FORM>(r, j), c, -k);
  if constexpr (MASKING != 0) return ((bits >> bit) & 1ull) ? neg_inf() : t;
  return t;
}

// This thread's key: the max of key_value over its vectors [v0 + tid + i * T_ROW < vend]. Unmasked rows
// with c > 0 take the max of the raw values (packed for 16-bit types) and multiply once; the rounding
// is monotone, so both ways give the same bits.
template <typename T, int VEC, int ITEMS, int T_ROW, int MASKING, bool FULL = false>
__device__ __forceinline__ float thread_key(const Vec<T, VEC> (&raw)[ITEMS], unsigned long long bits, int v0,
                                            int vend, float c) {
  if (MASKING == 0 && c > 0.f) {
    RunningMax<T, VEC> mx;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (FULL || v0 + (int)threadIdx.x + i * T_ROW < vend) mx.add(raw[i]);
    return __fmul_rn(mx.value(), c);
  }
  float k = neg_inf();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (FULL || v0 + (int)threadIdx.x + i * T_ROW < vend)
#pragma unroll
      for (int j = 0; j < VEC; ++j) k = fmaxf(k, key_value<T, VEC, MASKING>(raw[i], j, bits, i * VEC + j, c));
  return k;
}

// The output of an element from its exponent t: 2^t / s, or ln 2 (t - log2 s) for log-softmax.
template <bool LOG>
__device__ __forceinline__ float softmax_out(float t, float inv, float log2_s) {
  return LOG ? kLn2 * (t - log2_s) : exp2_nonpos(t) * inv;
}

// ---------------------------------------------------------------------------------------------------
// Forward, row (or a cluster's chunk of it) in registers.

// Masked elements of the row in registers set to -inf, once, as whole words (a 16-bit pair per LOP3):
// the passes after it run the unmasked code (with scale > 0, -inf stays -inf through the key and the
// exponent). The per-element mask test in each of the three passes cost the masked and causal forwards
// 0.49 and 0.69 of copy against 0.96 unmasked (run 123347Z).
template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ void mask_to_neg_inf(Vec<T, VEC> (&raw)[ITEMS], unsigned long long bits) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
      const unsigned pair = IsBf16<T>::value ? 0xFF80FF80u : 0xFC00FC00u;
      unsigned* w = reinterpret_cast<unsigned*>(raw[i].v);
#pragma unroll
      for (int q = 0; q < VEC / 2; ++q) {
        const unsigned b = (unsigned)(bits >> (i * VEC + 2 * q)) & 3u;
        const unsigned lanes = ((b & 1u) ? 0x0000FFFFu : 0u) | ((b & 2u) ? 0xFFFF0000u : 0u);
        w[q] = (w[q] & ~lanes) | (pair & lanes);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if ((bits >> (i * VEC + j)) & 1ull) raw[i].v[j] = from_float<T>(neg_inf());
    }
  }
}

// Statistics, merge and output of a row whose vectors sit in registers (MASKING: how `bits` applies).
// MERGE: OneShotMerge (common/cluster.cuh) for one row per cluster, MailboxStep (common/staged.cuh) per
// row of the persistent kernel.
// FULL: the row fills every vector slot (N == ITEMS x 32 x WARPS x VEC, one CTA per row); the per-vector
// bounds tests are compiled out (a row past M holds zeros and stores nothing).
// KEEP_EXP (softmax only, FK_SOFTMAX_ONE_EXP): the sum pass's terms e = 2^(fma(x, c, -k_t)) (k_t this
// thread's key) stay in fp32 registers, and the output is e * (2^(k_t - k) / s): one exponential per
// element instead of two, at ITEMS x VEC more registers. The bits may differ from the two-exponential
// form by an fp32 rounding (another product order).
template <typename T, typename O, int VEC, int ITEMS, int WARPS, bool LOG, int MASKING, typename MERGE,
          bool FULL = false, bool KEEP_EXP = false>
__device__ __forceinline__ void softmax_fwd_finish(const Vec<T, VEC> (&raw)[ITEMS], unsigned long long bits,
                                                   O* __restrict__ y, long long base, bool row_ok, int v0,
                                                   int vend, float c, const MERGE& merge) {
  constexpr int T_ROW = 32 * WARPS;
  constexpr bool KEEP = KEEP_EXP && !LOG;  // log-softmax's output pass has no exponential
  const float k = thread_key<T, VEC, ITEMS, T_ROW, MASKING, FULL>(raw, bits, v0, vend, c);
  const float k_loc = k == neg_inf() ? 0.f : k;
  float s = 0.f;
  float e[KEEP ? ITEMS : 1][KEEP ? VEC : 1];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (FULL || v0 + (int)threadIdx.x + i * T_ROW < vend)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float t = exp2_nonpos(keyed_exponent<T, VEC, MASKING>(raw[i], j, bits, i * VEC + j, c, k_loc));
        if constexpr (KEEP) e[i][j] = t;
        s += t;
      }

  int parity = 0;  // one reduction per row slot
  const MaxSum st = merge(row_merge<WARPS>(MaxSum{k, s}, parity));
  if (!row_ok) return;
  const float kg = st.k == neg_inf() ? 0.f : st.k;
  const float inv = st.s == 0.f ? 0.f : 1.f / st.s;
  const float log2_s = LOG ? log2f(st.s) : 0.f;
  // KEEP: this thread's factor (0 where its terms are all 0: k_loc - kg may then be large; inv keeps a NaN)
  const float f = KEEP ? (k == neg_inf() ? 0.f : exp2_nonpos(k_loc - kg)) * inv : 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + threadIdx.x + i * T_ROW;
    if (FULL || v < vend) {
      Vec<O, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (KEEP) {
          out.v[j] = from_float<O>(e[i][j] * f);
        } else {
          out.v[j] = from_float<O>(softmax_out<LOG>(
              keyed_exponent<T, VEC, MASKING, 1>(raw[i], j, bits, i * VEC + j, c, kg), inv, log2_s));
        }
      }
      store_vec<O, VEC>(y + base + (long long)v * VEC, out);
    }
  }
}

// FK_SOFTMAX_ONE_EXP (experiment, default 0): one exponential per element (softmax_fwd_finish's
// KEEP_EXP). Bit 1: the staged forward, its register cap raised to 128 (one 512-thread CTA an SM) where a
// thread holds more than 32 elements; bit 2: the register and cluster forwards where a thread holds at
// most 32 elements (under their 64-register cap).
#ifndef FK_SOFTMAX_ONE_EXP
#define FK_SOFTMAX_ONE_EXP 0
#endif
constexpr bool kStagedKeepExp = (FK_SOFTMAX_ONE_EXP & 1) != 0;
template <int ITEMS, int VEC>
struct SoftmaxRowKeepExp {
  static constexpr bool value = (FK_SOFTMAX_ONE_EXP & 2) != 0 && ITEMS * VEC <= 32;
};

template <typename T, typename O, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG, int MASKING,
          bool FULL = false>
__device__ __forceinline__ void softmax_fwd_row(const T* __restrict__ x, O* __restrict__ y, const MaskParams& mp,
                                                long long row, bool row_ok, int N, float scale, int v0,
                                                int vend, StatsBox<CLUSTER>* box) {
  constexpr int T_ROW = 32 * WARPS;
  constexpr bool KEEP = SoftmaxRowKeepExp<ITEMS, VEC>::value;
  const long long base = row * (long long)N;
  RowMask rm{nullptr, (long long)N, 0u};
  if (row_ok) {
    rm = row_mask<MASKING>(row, N, mp);
  } else {
    vend = v0;  // no data; the thread still takes part in the barriers
  }
  Vec<T, VEC> raw[ITEMS];
  const unsigned long long bits = load_x_row<T, VEC, ITEMS, T_ROW, MASKING, FULL>(raw, x + base, rm, v0, vend);
  const float c = __fmul_rn(scale, kLog2e);
  if constexpr (MASKING != 0) {
    if (c > 0.f) {  // uniform over the launch
      mask_to_neg_inf<T, VEC, ITEMS>(raw, bits);
      softmax_fwd_finish<T, O, VEC, ITEMS, WARPS, LOG, 0, OneShotMerge<CLUSTER>, false, KEEP>(
          raw, 0ull, y, base, row_ok, v0, vend, c, OneShotMerge<CLUSTER>{box});
      return;
    }
  }
  softmax_fwd_finish<T, O, VEC, ITEMS, WARPS, LOG, MASKING, OneShotMerge<CLUSTER>, FULL, KEEP>(
      raw, bits, y, base, row_ok, v0, vend, c, OneShotMerge<CLUSTER>{box});
}

// The fast-division parameters (sq_div ... n3_div: fast_div() of sq, n1, n2, n3 in cuda_softmax.py) come
// last, so the parameters before them keep their offsets.
#define FK_SOFTMAX_FWD_PARAMS                                                                              \
  const T *__restrict__ x, const unsigned char *__restrict__ mask, O *__restrict__ y, long long M, int N,  \
      float scale, long long sq, long long n1, long long n2, long long n3, long long s0, long long s1,     \
      long long s2, long long s3, int mcol, unsigned long long sq_div, unsigned long long n1_div,          \
      unsigned long long n2_div, unsigned long long n3_div
#define FK_SOFTMAX_MASK_PARAMS                                                                             \
  MaskParams{mask, sq, n1, n2, n3, s0, s1, s2, s3, mcol,                                                   \
             FastDiv(sq_div), FastDiv(n1_div), FastDiv(n2_div), FastDiv(n3_div)}

// FK_SOFTMAX_FULL (default 0 until measured on the H200): 1 honours the host's FULL flag (N fills the
// config exactly, unmasked: the per-vector bounds tests compiled out, as the norms' FULL, which gave
// LayerNorm +2 % at N = 1024 and 4096).
#ifndef FK_SOFTMAX_FULL
#define FK_SOFTMAX_FULL 0
#endif

template <typename T, typename O, int VEC, int ITEMS, int WARPS, bool LOG, int MASKING, bool FULL = false>
__global__ void __launch_bounds__(32 * WARPS * SoftmaxRowsPerBlock<WARPS>::value,
                                  SoftmaxMinBlocks<32 * WARPS * SoftmaxRowsPerBlock<WARPS>::value>::value)
softmax_fwd(FK_SOFTMAX_FWD_PARAMS) {
  const MaskParams mp = FK_SOFTMAX_MASK_PARAMS;
  const long long row = (long long)blockIdx.x * SoftmaxRowsPerBlock<WARPS>::value + threadIdx.y;
  softmax_fwd_row<T, O, VEC, ITEMS, WARPS, 1, LOG, MASKING, FULL && FK_SOFTMAX_FULL != 0>(
      x, y, mp, row, row < M, N, scale, 0, N / VEC, nullptr);
}

// One row per cluster of CLUSTER CTAs (grid = M * CLUSTER, 1-D blocks of 32 * WARPS threads).
template <typename T, typename O, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG, int MASKING>
__global__ void __launch_bounds__(32 * WARPS, SoftmaxMinBlocks<32 * WARPS>::value)
softmax_fwd_cluster(FK_SOFTMAX_FWD_PARAMS) {
  __shared__ StatsBox<CLUSTER> box;
  cluster_merge_open(&box);
  const MaskParams mp = FK_SOFTMAX_MASK_PARAMS;
  const long long row = blockIdx.x / CLUSTER;
  const int rank = blockIdx.x % CLUSTER;
  const ClusterChunk<CLUSTER> part(N / VEC, rank);
  softmax_fwd_row<T, O, VEC, ITEMS, WARPS, CLUSTER, LOG, MASKING>(x, y, mp, row, row < M, N, scale, part.v0,
                                                              part.vend, &box);
  cluster_wait();  // no CTA exits before every CTA is done with the merge
}

// Long rows, staged (sm_90, no mask): persistent. Each CTA (CLUSTER CTAs per row as above) walks rows
// row0, row0 + G, ... (G = gridDim.x / CLUSTER, at most the resident clusters; common/staged.cuh). Its
// chunk of the next row arrives by one bulk copy into shared memory while it reduces and writes the
// current one from registers: per row, wait for the copy, move the chunk to registers (thread t takes
// vectors t + i T, the register mapping of softmax_fwd_cluster), a block barrier, then thread 0 issues
// the next row's copy, and the statistics, merge and output run as in softmax_fwd_finish. Without it,
// the CTAs of a wave load, reduce and store in lockstep and the DRAM idles while they reduce (0.82-0.87
// of copy at 65536). Cluster merge per row: MailboxStep (common/staged.cuh), step k = the k-th row.
// Needs 16-byte vectors (N % VEC == 0, x 16-byte aligned; the host checks); dynamic shared memory =
// ceil(N / VEC / CLUSTER) x 16 bytes.
// STAGES > 1: a ring of that many buffers, so the chunks of the next STAGES rows are in flight
// (common/staged.cuh); dynamic shared memory STAGES times the chunk.
// The staged forward's occupancy hint: SoftmaxMinBlocks, or 1 (128 registers) where it keeps more than
// 32 exponentials a thread (kStagedKeepExp).
template <int THREADS, int ELEMS, bool LOG>
struct SoftmaxStagedMinBlocks {
  static constexpr int value = kStagedKeepExp && !LOG && ELEMS > 32 ? 1 : SoftmaxMinBlocks<THREADS>::value;
};

// FK_SOFTMAX_STAGGER (experiment, default 0): the odd clusters of the staged forward start their first
// row that many SM cycles late (thread 0 spins on clock64 after the opening loads), so that the two CTAs
// an SM holds, if they belong to clusters of different parity, are half a row step apart: one in its
// exponentials while the other waits on its merge or copy, where in lockstep both wait at once (Nsight
// Compute on the H200: issue slots 41 % busy, 1.1 eligible warps a scheduler). Costs the odd clusters
// the delay once. A/B: AB_OPTIONS="-DFK_SOFTMAX_STAGGER=4000 @ 262144;..." tools/ab_nvrtc_options.py.
#ifndef FK_SOFTMAX_STAGGER
#define FK_SOFTMAX_STAGGER 0
#endif

template <typename T, typename O, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG, int STAGES = 1>
__global__ void __launch_bounds__(32 * WARPS, SoftmaxStagedMinBlocks<32 * WARPS, ITEMS * VEC, LOG>::value)
softmax_fwd_staged(const T* __restrict__ x, O* __restrict__ y, long long M, int N, float scale) {
  constexpr int T_ROW = 32 * WARPS;
  extern __shared__ __align__(16) unsigned char softmax_stage[];
  using Chunk = StagedChunk<T, VEC, CLUSTER, 1, ITEMS, T_ROW, STAGES>;
  __shared__ unsigned long long bars[STAGES];
  __shared__ ClusterMailbox<float4, CLUSTER, 2> box;  // CLUSTER > 1: every CTA's statistics of a row
  const T* inputs[1] = {x};
  Chunk ch(inputs, softmax_stage, bars, N);
  const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
  long long row = blockIdx.x / CLUSTER;  // < M: the host launches at most M clusters
  staged_open<CLUSTER>(ch, box, row, M, [](long long) { return true; });
  if constexpr (FK_SOFTMAX_STAGGER > 0) {
    if (row & 1) {  // uniform over the cluster
      if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < FK_SOFTMAX_STAGGER) {
        }
      }
      __syncthreads();
    }
  }
  const float c = __fmul_rn(scale, kLog2e);
  for (int step = 0; row < M; row += ch.G, ++step) {
    Vec<T, VEC> in[1][ITEMS];
    ch.take_row(in, true, ch.refill_row(row, M));
    softmax_fwd_finish<T, O, VEC, ITEMS, WARPS, LOG, 0, MailboxStep<CLUSTER>, false, kStagedKeepExp>(
        in[0], 0ull, y, row * (long long)N, true, ch.v0, ch.vend, c, MailboxStep<CLUSTER>{&box, step, rank});
  }
  staged_close<CLUSTER>();
}

// Rows too long for registers: one row per block, two passes over global memory.
template <typename T, typename O, int VEC, bool LOG, int MASKING>
__global__ void __launch_bounds__(kSoftmaxLoopedThreads)
softmax_fwd_looped(FK_SOFTMAX_FWD_PARAMS) {
  constexpr int WARPS = kSoftmaxLoopedThreads / 32;
  const MaskParams mp = FK_SOFTMAX_MASK_PARAMS;
  const long long row = blockIdx.x;
  const long long base = row * (long long)N;
  const int nvec = N / VEC;
  const RowMask rm = row_mask<MASKING>(row, N, mp);
  const float c = __fmul_rn(scale, kLog2e);
  float k = neg_inf(), s = 0.f;
  for (int v = threadIdx.x; v < nvec; v += kSoftmaxLoopedThreads) {
    Vec<T, VEC> raw[1];
    const unsigned long long bits = load_x_row<T, VEC, 1, 1, MASKING>(raw, x + base, rm, v - (int)threadIdx.x, v + 1);
    float vk = k;
#pragma unroll
    for (int j = 0; j < VEC; ++j) vk = fmaxf(vk, key_value<T, VEC, MASKING>(raw[0], j, bits, j, c));
    s = rescale_key(s, k, vk);
    k = vk;
    const float k_loc = k == neg_inf() ? 0.f : k;
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += exp2_nonpos(keyed_exponent<T, VEC, MASKING>(raw[0], j, bits, j, c, k_loc));
  }
  int parity = 0;
  const MaxSum st = row_merge<WARPS>(MaxSum{k, s}, parity);
  const float kg = st.k == neg_inf() ? 0.f : st.k;
  const float inv = st.s == 0.f ? 0.f : 1.f / st.s;
  const float log2_s = LOG ? log2f(st.s) : 0.f;
  for (int v = threadIdx.x; v < nvec; v += kSoftmaxLoopedThreads) {
    Vec<T, VEC> raw[1];
    const unsigned long long bits = load_x_row<T, VEC, 1, 1, MASKING>(raw, x + base, rm, v - (int)threadIdx.x, v + 1);
    Vec<O, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      out.v[j] = from_float<O>(
          softmax_out<LOG>(keyed_exponent<T, VEC, MASKING>(raw[0], j, bits, j, c, kg), inv, log2_s));
    store_vec<O, VEC>(y + base + (long long)v * VEC, out);
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward: dx = scale * y * (dy - sum(dy * y)); log-softmax: dx = scale * (dy - exp(y) * sum(dy)).

template <bool LOG>
__device__ __forceinline__ float bwd_term(float y, float dy) { return LOG ? dy : dy * y; }

template <bool LOG>
__device__ __forceinline__ float bwd_dx(float y, float dy, float d, float scale) {
  return LOG ? scale * (dy - exp2_nonpos(y * kLog2e) * d) : scale * y * (dy - d);
}

// D of a row whose y and dy vectors sit in registers (zeros past the CTA's part), then dx. Vector i of
// thread t is vector v0 + t + i * T_ROW of the row; row_ok false: the thread only takes part in the
// reductions. SUM: OneShotMerge (one row per cluster) or MailboxStep (persistent) on the partial D.
template <typename T, int VEC, int ITEMS, int WARPS, bool LOG, typename SUM>
__device__ __forceinline__ void softmax_bwd_finish(const Vec<T, VEC> (&yr)[ITEMS], const Vec<T, VEC> (&gr)[ITEMS],
                                                   T* __restrict__ dx, long long base, bool row_ok, int v0,
                                                   int vend, float scale, const SUM& sum) {
  constexpr int T_ROW = 32 * WARPS;
  float d = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) d += bwd_term<LOG>(elem_float<T, VEC>(yr[i], j), elem_float<T, VEC>(gr[i], j));
  int parity = 0;
  d = sum(row_sum_alternating<WARPS>(d, parity));
  if (!row_ok) return;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + threadIdx.x + i * T_ROW;
    if (v < vend) {
      Vec<T, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        out.v[j] = from_float<T>(bwd_dx<LOG>(elem_float<T, VEC, 1>(yr[i], j), elem_float<T, VEC, 1>(gr[i], j), d, scale));
      store_vec<T, VEC>(dx + base + (long long)v * VEC, out);
    }
  }
}

template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG>
__device__ __forceinline__ void softmax_bwd_row(const T* __restrict__ dy, const T* __restrict__ y,
                                                T* __restrict__ dx, long long row, bool row_ok, int N,
                                                float scale, int v0, int vend, StatsBox<CLUSTER>* box) {
  constexpr int T_ROW = 32 * WARPS;
  const long long base = row * (long long)N;
  Vec<T, VEC> yr[ITEMS], gr[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int v = v0 + threadIdx.x + i * T_ROW;
    if (row_ok && v < vend) {
      yr[i] = load_vec<T, VEC>(y + base + (long long)v * VEC);
      gr[i] = load_vec<T, VEC>(dy + base + (long long)v * VEC);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) yr[i].v[j] = gr[i].v[j] = from_float<T>(0.f);
    }
  }
  softmax_bwd_finish<T, VEC, ITEMS, WARPS, LOG>(yr, gr, dx, base, row_ok, v0, vend, scale, OneShotMerge<CLUSTER>{box});
}

template <typename T, int VEC, int ITEMS, int WARPS, bool LOG>
__global__ void __launch_bounds__(32 * WARPS * SoftmaxRowsPerBlock<WARPS>::value,
                                  SoftmaxMinBlocks<32 * WARPS * SoftmaxRowsPerBlock<WARPS>::value>::value)
softmax_bwd(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, long long M, int N, float scale) {
  const long long row = (long long)blockIdx.x * SoftmaxRowsPerBlock<WARPS>::value + threadIdx.y;
  softmax_bwd_row<T, VEC, ITEMS, WARPS, 1, LOG>(dy, y, dx, row, row < M, N, scale, 0, N / VEC, nullptr);
}

template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG>
__global__ void __launch_bounds__(32 * WARPS, SoftmaxMinBlocks<32 * WARPS>::value)
softmax_bwd_cluster(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, long long M, int N,
                    float scale) {
  __shared__ StatsBox<CLUSTER> box;
  cluster_merge_open(&box);
  const long long row = blockIdx.x / CLUSTER;
  const int rank = blockIdx.x % CLUSTER;
  const ClusterChunk<CLUSTER> part(N / VEC, rank);
  softmax_bwd_row<T, VEC, ITEMS, WARPS, CLUSTER, LOG>(dy, y, dx, row, row < M, N, scale, part.v0, part.vend, &box);
  cluster_wait();
}

// Long rows, staged backward (sm_90): softmax_fwd_staged's scheme. Persistent; each CTA (CLUSTER per row)
// walks rows row0, row0 + G, ...; its chunks of the next row's y and dy arrive by two bulk copies on one
// mbarrier into shared memory while it finishes the current row from registers: wait, move both chunks
// to registers (the mapping of softmax_bwd_cluster), a block barrier, thread 0 issues the next row's
// copies, then D, its cluster sum (MailboxStep) and dx. The same per-thread order of the sums as
// softmax_bwd_cluster with the same (ITEMS, WARPS, CLUSTER), so the two give the same bits. The
// backward's clusters become resident once instead of a new cluster waiting for free SMs of one GPC per
// row: at 262144, 0.942 of copy against 0.826 (H200 sweep 2026-12-05). Needs 16-byte vectors (the host
// checks); dynamic shared memory = STAGES x 2 x ceil(N / VEC / CLUSTER) x 16 bytes (per buffer of the
// ring, y's chunk, then dy's). Up to 4 vectors of each a thread keeps softmax_bwd_cluster's register
// cap (64 at 512 threads: two CTAs per SM where the shared memory allows); 8 vectors (110 registers)
// run one CTA per SM.
template <typename T, int VEC, int ITEMS, int WARPS, int CLUSTER, bool LOG, int STAGES = 1>
__global__ void __launch_bounds__(32 * WARPS, ITEMS <= 4 ? SoftmaxMinBlocks<32 * WARPS>::value : 1)
softmax_bwd_staged(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, long long M, int N,
                   float scale) {
  constexpr int T_ROW = 32 * WARPS;
  extern __shared__ __align__(16) unsigned char softmax_stage[];
  using Chunk = StagedChunk<T, VEC, CLUSTER, 2, ITEMS, T_ROW, STAGES>;
  __shared__ unsigned long long bars[STAGES];
  __shared__ ClusterMailbox<float4, CLUSTER, 2> box;  // CLUSTER > 1: every CTA's partial D of a row
  const T* inputs[2] = {y, dy};
  Chunk ch(inputs, softmax_stage, bars, N);
  const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
  long long row = blockIdx.x / CLUSTER;  // < M: the host launches at most M clusters
  staged_open<CLUSTER>(ch, box, row, M, [](long long) { return true; });
  for (int step = 0; row < M; row += ch.G, ++step) {
    Vec<T, VEC> in[2][ITEMS];  // y's chunk, dy's
    ch.take_row(in, true, ch.refill_row(row, M));
    softmax_bwd_finish<T, VEC, ITEMS, WARPS, LOG>(in[0], in[1], dx, row * (long long)N, true, ch.v0, ch.vend,
                                                  scale, MailboxStep<CLUSTER>{&box, step, rank});
  }
  staged_close<CLUSTER>();
}

template <typename T, int VEC, bool LOG>
__global__ void __launch_bounds__(kSoftmaxLoopedThreads)
softmax_bwd_looped(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, long long M, int N,
                   float scale) {
  constexpr int WARPS = kSoftmaxLoopedThreads / 32;
  const long long base = (long long)blockIdx.x * N;
  const int nvec = N / VEC;
  float d = 0.f;
  for (int v = threadIdx.x; v < nvec; v += kSoftmaxLoopedThreads) {
    const Vec<T, VEC> yv = load_vec<T, VEC>(y + base + (long long)v * VEC);
    const Vec<T, VEC> gv = load_vec<T, VEC>(dy + base + (long long)v * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) d += bwd_term<LOG>(to_float(yv.v[j]), to_float(gv.v[j]));
  }
  int parity = 0;
  d = row_sum_alternating<WARPS>(d, parity);
  for (int v = threadIdx.x; v < nvec; v += kSoftmaxLoopedThreads) {
    const Vec<T, VEC> yv = load_vec<T, VEC>(y + base + (long long)v * VEC);
    const Vec<T, VEC> gv = load_vec<T, VEC>(dy + base + (long long)v * VEC);
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_float<T>(bwd_dx<LOG>(to_float(yv.v[j]), to_float(gv.v[j]), d, scale));
    store_vec<T, VEC>(dx + base + (long long)v * VEC, out);
  }
}

}  // namespace fk
