// fusedkit/cuda/fp8_gemm_sm90.cu -- FP8 GEMM for Hopper (sm_90a): C = A @ B.T with A (M x K) and B (N x K)
// FP8 bytes, both K-major ("TN", the only layout Hopper's FP8 tensor-core instructions read from shared
// memory, and cuBLASLt's FP8 layout), fp32 accumulation, a fused epilogue (issue 5).
//
// Algorithm (one kernel, fp8_gemm_sm90<TA, TB, BN, MODE, OUT, STAGES, CLUSTER, STORE>):
//   * Persistent tile scheduler: a grid of min(tiles, SMs) CTAs (one per SM: the stage ring takes ~200 KB
//     of shared memory); CTA b walks output tiles b, b + grid, ... . Tiles of 128 x BN are numbered in
//     groups of 8 tile-rows (kGemmGroupM): inside a group the walk goes down the 8 M-tiles first, then
//     along N, so the CTAs running at one time share A rows and B rows in L2. SCHED = GEMM_SCHED_STREAMK
//     (the table's kernel for split accumulation; see GemmWalk and cuda_gemm.TABLE_SCHED): where the
//     host asks for a tail (dp_tiles < tiles), the last one to two waves' K blocks are split evenly over
//     the grid instead, a tile cut between two CTAs joined through global memory (gemm_sk_share).
//   * Warp specialisation, 384 threads = 3 warpgroups. Warpgroup 0 is the producer: it gives registers
//     back (setmaxnreg.dec 40) and one thread issues the TMA loads; warpgroups 1 and 2 are the consumers
//     (setmaxnreg.inc 232), each owns 64 rows of the 128-row tile and all BN columns.
//   * Loads: cp.async.bulk.tensor.2d through two tensor maps (built on the host by
//     cuTensorMapEncodeTiled: uint8, box {128 (K), 128 or BN rows}, 128-byte swizzle, zero fill out of
//     bounds, so M, N, K need not be tile multiples) into a ring of STAGES shared-memory stages of
//     (128 + BN) x 128 bytes. Each stage has a "full" mbarrier (the producer's arrive.expect_tx, completed
//     by the copy engine's byte count) and an "empty" mbarrier (one arrival per consumer warp, 8).
//   * Math: per 128-K block a consumer warpgroup issues 4 x wgmma.mma_async.m64nBNk32.f32.TA.TB, A and B
//     both from shared memory through 128B-swizzled K-major descriptors (SBO = 1024 B = 8 rows x 128 B;
//     the k-th 32-byte slice of the swizzle atom is addressed by adding 32 k bytes to the start address,
//     which works because every stage buffer is 1024-byte aligned and the hardware applies the XOR
//     swizzle on the absolute address bits).
//   * Accumulation modes (MODE):
//       GEMM_FAST  (0): one fp32 wgmma accumulator over all of K (cuBLASLt's "fast accumulation"; the
//                       tensor core's FP8 accumulation keeps fewer mantissa bits than fp32). The consumer
//                       keeps one wgmma group in flight (wait_group 1) and releases the previous stage.
//       GEMM_SPLIT (1): per-tensor scales, the wgmma accumulator restarts every 128 K and is promoted
//                       (added) into a separate fp32 register accumulator (use_split_accumulator=True,
//                       TE's default for the forward GEMM). Two wgmma accumulators take K blocks in turn,
//                       in pairs: block 2i + 1 runs while block 2i is promoted. With
//                       wait_group 0 before every promotion the H200 ran 0.56-0.73x cuBLASLt (the two
//                       consumer warpgroups drain and promote in lockstep, the tensor cores idle); with
//                       the pairs 0.86-0.96x (run 081416Z). Longer chunks spill (4: 524 B) and a
//                       group in flight across the loop's back edge makes ptxas serialise every wgmma
//                       (C7514), so the second promotion of each pair still waits.
//       GEMM_BLOCK (2): DeepSeek block scaling: A scales 1 x 128 (per row and K block, (M, K/128) fp32),
//                       B scales 128 x 128 (per N block and K block, (N/128, K/128) fp32). Every 128 K the
//                       partial product is promoted with the scale product: acc_fp32 += wgmma * sa[row,kb]
//                       * sb[nb,kb]; the consumer reads its two rows' A scales with __ldg before waiting
//                       on the stage, so the loads overlap that wait. BN = 128, so a tile meets one B
//                       scale per K block.
//     Registers per consumer thread: BN/2 fp32 for the wgmma accumulator, plus 2 x BN/2 (second wgmma
//     accumulator, promoted sum) in SPLIT / BLOCK: so FAST runs 128 x 256 tiles (128 accumulators;
//     128 x 128 when 256-wide tiles would leave SMs idle), SPLIT / BLOCK 128 x 128 (3 x 64, within the
//     consumers' setmaxnreg 232). ptxas (CUDA 13.0 and 13.5, sm_90a): 168 registers at entry (the
//     __launch_bounds__(384, 1) cap), no spills, for all 145 instantiations (.ci/run checks both).
//   * Epilogue (STORE = GEMM_STORE_DIRECT: registers -> global): thread (warp w of its warpgroup, lane l) holds rows
//     16 w + l / 4 and + 8 of its warpgroup's 64, columns 8 j + 2 (l % 4) + {0, 1} of every 8-column
//     group j (the wgmma accumulator layout), so it stores column pairs (8 B fp32, 4 B bf16, 2 B FP8;
//     16-bit and 8-bit pairs are packed into registers first, gemm_pack).
//     v = alpha * acc (alpha = scale_inv_a * scale_inv_b read from device pointers; 1 in BLOCK mode,
//     where the scales are already in), then + C (accumulate_into: C is the output, read in place),
//     + bias[col] (fp32 or bf16, a run-time kind), then the activation (run-time id, common/act.cuh;
//     -1 = none): cuBLASLt's order D = act(alpha A B^T + C + bias). FP8 outputs: byte = sat_rn(v *
//     out_scale) (common/fp8.cuh), and amax(|v|) of the valid elements is merged per warp per tile into
//     *amax (common/fp8.cuh warp_amax_merge: one redux.sync, an atomicMax only where it raises the value).
//     The epilogue uses explicit __fmul_rn / __fadd_rn so every output type of one configuration sees the
//     same fp32 v (the tests check the FP8 output against the fp32 output cast on the CPU, byte for byte).
//   * Staged output stores (STORE = GEMM_STORE_STAGED / _WHOLE, bf16 and FP8 outputs): the same v goes into
//     a per-warpgroup shared-memory stage laid out as TMA's 128-byte-swizzled boxes (64 rows x 128 bytes),
//     one thread issues the tensor stores (cp.async.bulk.tensor ... bulk_group) and the warpgroup goes on
//     to the next tile; the stage is rewritten only after the stores have read it (wait_group.read). The
//     direct stores write 4-byte pairs scattered over 8 rows per warp instruction (half-filled 32-byte
//     sectors) while the tensor cores idle; staged, the warpgroup spends one shared-memory write per pair
//     and two named barriers, and the global writes go out as full lines under the next main loop.
//     Measured on the H200 (2026-12-05): +25-29 % in fast mode at K = 4096, +3-16 % in split mode; the
//     tile table uses them for bf16 / FP8 outputs (fast: WHOLE, split and block: STAGED). Output stage per
//     warpgroup: 16 KB in rounds (STAGED) or the whole 64 x BN slab (WHOLE: 32 KB for bf16 at BN = 256, so
//     the ring holds 3 stages instead of 4).
//   * Removed after measuring (2026-12-05): the next tile's first K block issued before a tile's epilogue
//     (FK_GEMM_EPI_OVERLAP; no gain: ab_gemm_epi_overlap_2026-12-05T0252Z.json).
// Bytes moved: M K + N K (each operand read once per tile row / column: (N / BN) M K + (M / 128) N K from
//   L2, the grouped walk keeps most of it there) + M N x out size (+ M N x out size for accumulate_into).
//   FLOPs 2 M N K: compute-bound for M, N, K >= 1024.
// Limits (checked in Python, fusedkit/fp8/gemm.py): M, N, K multiples of 16 (TMA row strides are
//   multiples of 16 bytes; column pairs never straddle N); pointers 16-byte aligned.
// Targets: the body needs sm_90a (wgmma, setmaxnreg); elsewhere (sm_80, sm_100a) the kernel compiles to a
//   trap and the Python dispatch uses the dequantize + matmul fallback.
// Variants tried: one fused epilogue loop with the run-time options (bias kind, activation, accumulate)
//   tested inside it: ptxas unswitched it into ~40 copies of the loop (2752 bf16 packs instead of 64 in
//   one 128 x 256 kernel, 55 s of NVRTC for 3 kernels); one pass per option (gemm_epilogue) compiles the
//   same 3 kernels in 4.7 s.
//   * Clusters (CLUSTER = 2; measured slower at every issue-5 shape, 0.50-0.79x cuBLASLt against
//     0.84-0.95x unclustered, so config() never picks them; kept, tested, for other shapes / GPUs): two CTAs on adjacent
//     tile-rows of one tile-column form a cluster; each loads its own A and half of the shared B tile,
//     multicast into both CTAs' stages (cp.async.bulk.tensor ... .multicast::cluster), so L2 serves B
//     once per pair. A stage's "empty" barrier then counts the consumer warps of both CTAs (each warp
//     arrives on its own and the peer's barrier through mapa), and the CTAs meet at cluster barriers after
//     the barrier init and before exit.
// Variants considered: BN = 256 with promotion does not fit the register file (256 accumulators per
//   thread).
#include "common/dtypes.cuh"
#include "common/fp8.cuh"
#include "common/act.cuh"

// wgmma register lists (generated once, by hand-checked script: %0 .. %N-1 the accumulators, then the
// two descriptors and the scale-d flag)
#define FK_WG_REGS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FK_WG_TAIL_64 ", %64, %65, p, 1, 1;\n"
#define FK_WG_PRED_64 "setp.ne.b32 p, %66, 0;\n"
#define FK_WG_OPS_64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FK_WG_REGS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FK_WG_TAIL_128 ", %128, %129, p, 1, 1;\n"
#define FK_WG_PRED_128 "setp.ne.b32 p, %130, 0;\n"
#define FK_WG_OPS_128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

namespace fk {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FK_GEMM_SM90A 1
#else
#define FK_GEMM_SM90A 0
#endif

// A CUtensorMap as the kernel receives it: 128 opaque bytes, 64-byte aligned, passed by value as a
// __grid_constant__ parameter (the host copies cuTensorMapEncodeTiled's result into the parameter buffer).
struct alignas(64) TmaMap {
  unsigned long long w[16];
};

#ifndef FK_GEMM_OFFSET_PAIRS
#define FK_GEMM_OFFSET_PAIRS 1   // 0 never, 1 GEMM_BLOCK only, 2 SPLIT and BLOCK: see the main loop
#endif
#ifndef FK_GEMM_WG_LAG_NS
#define FK_GEMM_WG_LAG_NS 0      // > 0: the second consumer warpgroup starts this many ns after the first
#endif                           // (experiment: staggered epilogues; see the consumers)
#ifndef FK_GEMM_BLOCK_FFMA
#define FK_GEMM_BLOCK_FFMA 0     // 1: BLOCK promotes with one FFMA per accumulator (fin + acc * s, one
#endif                           // rounding) instead of FMUL then FADD (gemm_promote)
#ifndef FK_GEMM_AMAX_ONCE
#define FK_GEMM_AMAX_ONCE 0      // 1: each consumer thread keeps a running amax over its tiles and its warp
#endif                           // merges it once at the end, not once per tile (experiment; see gemm_amax)

enum GemmMode : int { GEMM_FAST = 0, GEMM_SPLIT = 1, GEMM_BLOCK = 2 };
enum GemmSched : int { GEMM_SCHED_DP = 0, GEMM_SCHED_STREAMK = 1 };  // tile walk (see gemm_sk_share)
enum GemmBias : int { GEMM_BIAS_NONE = 0, GEMM_BIAS_F32 = 1, GEMM_BIAS_BF16 = 2 };

constexpr int kGemmBM = 128;      // tile rows (2 consumer warpgroups x 64)
constexpr int kGemmBK = 128;      // K bytes per stage: one 128-byte swizzle atom row
constexpr int kGemmThreads = 384; // producer warpgroup + 2 consumer warpgroups
constexpr int kGemmGroupM = 8;    // tile-rows per group of the tile walk
constexpr int kGemmConsumerWarps = 8;

// Output types: float and bf16 are stored as such; the FP8 tags of common/fp8.cuh (E4M3, E5M2) as bytes.
template <typename T> struct GemmOut {
  using store_t = T;
  static constexpr bool fp8 = false;
  static constexpr int bytes = sizeof(T);
};
struct GemmOutFp8 {
  using store_t = unsigned char;
  static constexpr bool fp8 = true;
  static constexpr int bytes = 1;
};
template <> struct GemmOut<E4M3> : GemmOutFp8 {};
template <> struct GemmOut<E5M2> : GemmOutFp8 {};

// Output stores (STORE): GEMM_STORE_DIRECT (0) each thread stores its column pairs to global memory;
// GEMM_STORE_STAGED (1) through shared memory and TMA tensor stores, at most 16 KB per warpgroup at a
// time (a 64 x 256 bf16 half-tile goes in two rounds); GEMM_STORE_STAGED_WHOLE (2) the warpgroup's whole
// 64 x BN slab in one round (32 KB for bf16 at BN = 256, one pipeline stage fewer). Staged stores take
// bf16 and FP8 outputs (a fp32 tile would need 64 KB per warpgroup).
enum GemmStore : int { GEMM_STORE_DIRECT = 0, GEMM_STORE_STAGED = 1, GEMM_STORE_STAGED_WHOLE = 2 };
constexpr unsigned kGemmStageOutMax = 16384;   // bytes per warpgroup and round for GEMM_STORE_STAGED

template <typename OUT, int BN, int STORE> struct GemmStaging {
  static constexpr unsigned slab = 64u * BN * GemmOut<OUT>::bytes;            // a warpgroup's 64 rows
  static constexpr int rounds = STORE == GEMM_STORE_STAGED && slab > kGemmStageOutMax ? slab / kGemmStageOutMax : 1;
  static constexpr unsigned wg_bytes = STORE == GEMM_STORE_DIRECT ? 0 : slab / rounds;  // per round
  static constexpr int cols = BN / rounds;                                    // columns per round
  static constexpr int box_cols = 128 / GemmOut<OUT>::bytes;                  // one 128-byte swizzle row
  static constexpr int boxes = cols / box_cols;                               // TMA stores per round
};

// ----------------------------------------------------------------------------------------------------
// sm_90a primitives

__device__ __forceinline__ unsigned gemm_smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#if FK_GEMM_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
#if FK_GEMM_SM90A
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if FK_GEMM_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
#endif
}

// Blocks until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if FK_GEMM_SM90A
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}"
      :: "r"(bar), "r"(parity) : "memory");
#endif
}

// 2-D tile load global -> shared through a tensor map; completes `bar` with the box's byte count
// (out-of-bounds elements are zero-filled and still counted).
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1) {
#if FK_GEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1) : "memory");
#endif
}

// The same load multicast to the CTAs of `mask` in the cluster: each receives the box at the same
// shared-memory offset and its own mbarrier at `bar`'s offset gets the byte count.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaMap* map, unsigned bar, int c0,
                                                      int c1, unsigned short mask) {
#if FK_GEMM_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
#endif
}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if FK_GEMM_SM90A
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}

// Every thread of every CTA of the cluster (release / acquire: barrier inits and last arrivals are seen).
__device__ __forceinline__ void cluster_sync_all() {
#if FK_GEMM_SM90A
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Arrival on the mbarrier at the same shared-memory offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
#if FK_GEMM_SM90A
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
#endif
}

// 2-D tile store shared -> global through a tensor map (bulk async-group: completion through
// cp.async.bulk.commit_group / wait_group; elements outside the tensor are not written).
__device__ __forceinline__ void tma_store_2d(const TmaMap* map, unsigned src, int c0, int c1) {
#if FK_GEMM_SM90A
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if FK_GEMM_SM90A
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// The committed bulk groups of this thread have finished reading shared memory (READ_ONLY) or have
// completed altogether.
template <bool READ_ONLY>
__device__ __forceinline__ void bulk_wait_all() {
#if FK_GEMM_SM90A
  if constexpr (READ_ONLY) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// This thread's generic-proxy shared-memory writes become visible to the async proxy (TMA stores).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FK_GEMM_SM90A
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Barrier `id` (1 + consumer warpgroup; 0 is __syncthreads) over the `count` threads that reach it.
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
#if FK_GEMM_SM90A
  asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
#endif
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes, 8-row
// atoms 1024 bytes apart (SBO); LBO is unused for swizzled K-major layouts (set to 1).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
  unsigned long long d = (unsigned long long)((addr & 0x3FFFF) >> 4);
  d |= 1ull << 16;
  d |= (unsigned long long)(1024 >> 4) << 32;
  d |= 1ull << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
#if FK_GEMM_SM90A
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if FK_GEMM_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if FK_GEMM_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}

// The accumulator registers pass through the asm as "+f": the compiler keeps them in registers and
// orders every wgmma after the previous one (fences are still ours to issue).
template <int BN, typename TA, typename TB> struct Wgmma;

#if FK_GEMM_SM90A
#define FK_WGMMA_DEF(BN, NR, TA, TB, SA, SB)                                                         \
  template <> struct Wgmma<BN, TA, TB> {                                                              \
    __device__ __forceinline__ static void mma(float (&d)[NR], unsigned long long da,                 \
                                               unsigned long long db, int scale_d) {                  \
      asm volatile("{\n.reg .pred p;\n" FK_WG_PRED_##NR                                               \
                   "wgmma.mma_async.sync.aligned.m64n" #BN "k32.f32." SA "." SB " " FK_WG_REGS_##NR   \
                   FK_WG_TAIL_##NR "}\n"                                                              \
                   : FK_WG_OPS_##NR(d)                                                                \
                   : "l"(da), "l"(db), "r"(scale_d));                                                 \
    }                                                                                                 \
  };
#else
#define FK_WGMMA_DEF(BN, NR, TA, TB, SA, SB)                                                         \
  template <> struct Wgmma<BN, TA, TB> {                                                              \
    __device__ __forceinline__ static void mma(float (&)[NR], unsigned long long, unsigned long long, \
                                               int) {}                                                \
  };
#endif

FK_WGMMA_DEF(128, 64, E4M3, E4M3, "e4m3", "e4m3")
FK_WGMMA_DEF(128, 64, E4M3, E5M2, "e4m3", "e5m2")
FK_WGMMA_DEF(128, 64, E5M2, E4M3, "e5m2", "e4m3")
FK_WGMMA_DEF(128, 64, E5M2, E5M2, "e5m2", "e5m2")
FK_WGMMA_DEF(256, 128, E4M3, E4M3, "e4m3", "e4m3")
FK_WGMMA_DEF(256, 128, E4M3, E5M2, "e4m3", "e5m2")
FK_WGMMA_DEF(256, 128, E5M2, E4M3, "e5m2", "e4m3")
FK_WGMMA_DEF(256, 128, E5M2, E5M2, "e5m2", "e5m2")
#undef FK_WGMMA_DEF

// Ties the accumulator registers to this point of the instruction stream: the asm has them as in/out
// operands, so the compiler cannot read them before the preceding wgmma wait (wgmma writes them
// asynchronously to the registers the compiler sees).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One 128-K block: wait for its stage, then 4 x wgmma k32 into d (restarting d), committed as one group.
template <int BN, typename TA, typename TB>
__device__ __forceinline__ void gemm_issue_block(float (&d)[BN / 2], unsigned full, unsigned phase,
                                                 unsigned a_addr, unsigned b_addr) {
  mbar_wait(full, phase);
  const unsigned long long da = wgmma_desc(a_addr), db = wgmma_desc(b_addr);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kGemmBK / 32; ++k) Wgmma<BN, TA, TB>::mma(d, da + 2 * k, db + 2 * k, k > 0 ? 1 : 0);
  wgmma_commit();
}

// The consumer warp is done with a stage: one arrival per warp on its "empty" barrier, and with a
// cluster on the same barrier of every CTA of the cluster (their producers multicast into this stage).
template <int CLUSTER>
__device__ __forceinline__ void gemm_release(unsigned empty, int lane) {
  __syncwarp();
  if constexpr (CLUSTER == 1) {
    if (lane == 0) mbar_arrive(empty);
  } else {
    if (lane < CLUSTER) mbar_arrive_cluster(empty, lane);
  }
}

// BLOCK mode: the scale products of this thread's two rows for K block kb (issued before the stage wait,
// so the loads overlap it); 1 otherwise.
template <int MODE>
__device__ __forceinline__ void gemm_block_scales(const float* scale_a, const float* scale_b, int row0,
                                                  int row1, int tn, int k_blocks, int kb, float& s0,
                                                  float& s1) {
  if constexpr (MODE == GEMM_BLOCK) {
    const float sb = __ldg(scale_b + (size_t)tn * k_blocks + kb);
    s0 = __fmul_rn(__ldg(scale_a + (size_t)row0 * k_blocks + kb), sb);
    s1 = __fmul_rn(__ldg(scale_a + (size_t)row1 * k_blocks + kb), sb);
  }
}

// Promotion of one block's partial product into the fp32 accumulator fin (zeroed at the tile's start).
// acc_i belongs to row r0 when (i & 2) == 0, else to r0 + 8 (the wgmma accumulator layout).
template <int MODE, int NR>
__device__ __forceinline__ void gemm_promote(float (&fin)[NR], const float (&acc)[NR], float s0, float s1) {
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    if constexpr (MODE == GEMM_BLOCK && FK_GEMM_BLOCK_FFMA) {
      fin[i] = __fmaf_rn(acc[i], (i & 2) ? s1 : s0, fin[i]);
    } else {
      const float p = MODE == GEMM_BLOCK ? __fmul_rn(acc[i], (i & 2) ? s1 : s0) : acc[i];
      fin[i] = __fadd_rn(fin[i], p);
    }
  }
}

// Tile t of the grouped walk -> (tile-row, tile-column).
__device__ __forceinline__ void gemm_tile_coords(int t, int m_tiles, int n_tiles, int& tm, int& tn) {
  const int per_group = kGemmGroupM * n_tiles;
  const int group = t / per_group;
  const int first_m = group * kGemmGroupM;
  const int rows = min(m_tiles - first_m, kGemmGroupM);
  const int r = t - group * per_group;
  tm = first_m + r % rows;
  tn = r / rows;
}

// Stream-K tail (SCHED = GEMM_SCHED_STREAMK; with the GemmWalk below, +6-18 % for split accumulation
// at the four larger issue-5 shapes in H100 sweeps of 2026-12-05, more than their tails are worth).
// With 128 x 128 tiles, 8192^3 and 16384 x 14336 x 4096 end in a last wave of 4 tiles on 132 SMs (4096
// tiles: 31.03 waves), up to 3 % of the run. The first dp_tiles tiles are walked as in the data-parallel schedule;
// the K blocks of the R remaining tiles (the host makes G < R < 2 G or R = 0, G the grid) are flattened
// tile by tile and split evenly: CTA b takes [b R kb / G, (b + 1) R kb / G). A share is at least one
// tile's K blocks long, so a tile is split at most once: its head (from K block 0) ends one CTA's share,
// its tail starts the next one's. The tail is computed first (at the start of that share), parked in
// global memory (gemm_sk_park: slot = the tail's CTA, one flag per consumer warpgroup) and collected by
// the head's CTA at the end of its share (gemm_sk_collect: fin + partial, one rounding, then the
// epilogue): deterministic, so FP8 and fp32 outputs of a shape still agree bit for bit. Progress: CTA b
// waits only for CTA b + 1 to reach its share (data-parallel tiles wait for nothing; the tail is parked
// first). CTAs start in index order, so the resident ones are a range of which only the last can wait;
// the rest finish and free SMs for the next ones. The walk thus ends even when other work holds SMs
// (NCCL kernels on another stream, an MPS share) as long as two CTAs fit at once.
__device__ __forceinline__ void gemm_sk_share(int total, int& lo, int& hi) {
  lo = (int)((long long)blockIdx.x * total / gridDim.x);
  hi = (int)((long long)(blockIdx.x + 1) * total / gridDim.x);
}

// This CTA's work in order: its data-parallel tiles (first, first + step, ... below dp_end), then with
// stream-K the segments of its share. next(): false when done, else tile t and K blocks [kb0, kb1). One
// walker drives the producer and the consumers alike, so both see the same sequence, and each loop body
// is written once (a body called from two loops was not inlined and spilled its accumulators).
// The stream-K walker (this template; the data-parallel one is the specialization below) finds its
// segments by additions from the share's start (only the first segment may begin inside a tile) and
// steps with selects on one path. With a branch per phase (two ways to go round the loop) ptxas took
// the consumers' K loop off the uniform datapath: stage counters and wgmma descriptors in vector
// registers, moved by R2UR before every wgmma (split kernel: 396 R2UR and 53 uniform instructions
// against 45 and 349 for the data-parallel walk), and the split GEMM ran 7-10 % slower than the
// data-parallel walk on the H200 (sweep_gemm_stream_k_2026-12-05T1011Z.json). With selects: 22 R2UR
// within 8 instructions before a wgmma, against 18 data-parallel and 35 before (tools/gemm_sass_walks.py).
template <int SCHED>
struct GemmWalk {
  int t = 0, kb0 = 0, kb1 = 0;
  int next_t, step, dp_end, k_blocks;
  int seg_t = 0, seg_kb = 0, left = 0;  // the next segment's tile and first K block; K blocks left
  __device__ __forceinline__ GemmWalk(int first, int step_, int dp_end_, int num_units, int k_blocks_)
      : next_t(first), step(step_), dp_end(dp_end_), k_blocks(k_blocks_) {
    int lo, hi;
    gemm_sk_share((num_units - dp_end_) * k_blocks_, lo, hi);
    seg_t = dp_end_ + lo / k_blocks_;
    seg_kb = lo % k_blocks_;
    left = hi - lo;
  }
  __device__ __forceinline__ bool next() {
    const bool dp = next_t < dp_end;
    const bool sk = !dp && left > 0;
    t = dp ? next_t : seg_t;
    kb0 = dp ? 0 : seg_kb;
    kb1 = dp ? k_blocks : min(k_blocks, seg_kb + left);
    next_t = dp ? next_t + step : next_t;
    left = sk ? left - (kb1 - kb0) : left;
    seg_t = sk ? seg_t + 1 : seg_t;
    seg_kb = sk ? 0 : seg_kb;
    return dp || sk;
  }
};

// The data-parallel walk: the tiles alone (K blocks [0, k_blocks) each), as the loop it replaced.
template <>
struct GemmWalk<GEMM_SCHED_DP> {
  static constexpr int kb0 = 0;
  int t, kb1, step, dp_end;
  __device__ __forceinline__ GemmWalk(int first, int step_, int dp_end_, int, int k_blocks)
      : t(first - step_), kb1(k_blocks), step(step_), dp_end(dp_end_) {}
  __device__ __forceinline__ bool next() {
    t += step;
    return t < dp_end;
  }
};

// A tail's accumulators (this thread's NR) into its slot, element i of every thread of the warpgroup
// side by side (coalesced), then the warpgroup's flag = epoch (release, after a warpgroup barrier).
template <int NR>
__device__ __forceinline__ void gemm_sk_park(const float (&x)[NR], float* part, int* flag, int epoch, int wg) {
  const int t = threadIdx.x & 127;
#pragma unroll
  for (int i = 0; i < NR; ++i) __stcg(part + i * 128 + t, x[i]);
  named_barrier(1 + wg, 128);
  if (t == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.b32 [%0], %1;" :: "l"(flag), "r"(epoch) : "memory");
  }
}

// The head's side: one thread waits for the tail's flag (and clears it for the next launch), then every
// thread adds its partials: x = x + partial.
template <int NR>
__device__ __forceinline__ void gemm_sk_collect(float (&x)[NR], const float* part, int* flag, int epoch, int wg) {
  const int t = threadIdx.x & 127;
  if (t == 0) {
    int seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
      if (seen != epoch) __nanosleep(64);
    } while (seen != epoch);
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" :: "l"(flag), "r"(0) : "memory");
  }
  named_barrier(1 + wg, 128);
#pragma unroll
  for (int i = 0; i < NR; ++i) x[i] = __fadd_rn(x[i], __ldcg(part + i * 128 + t));
}

template <typename OUT>
__device__ __forceinline__ float2 gemm_load_pair(const void* base, size_t idx) {
  if constexpr (sizeof(OUT) == 4) {
    return *reinterpret_cast<const float2*>(static_cast<const float*>(base) + idx);
  } else {
    const unsigned u = *reinterpret_cast<const unsigned*>(static_cast<const bf16*>(base) + idx);
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
  }
}

// x += bias[col] for the thread's columns c0 + 8 j, + 1 (bias: N values of fp32 or bf16). Columns past N
// are computed, never stored: their loads read column N - 2 instead. One pass per bias kind, chosen
// outside the pass: with both kinds' loads predicated in one pass, ptxas of CUDA 13.0 kept both sets
// of addresses live and spilled 8-24 B in 8 of the 128 x 256 FP8-output kernels (13.5 did not).
template <int BN, typename T>
__device__ __forceinline__ void gemm_add_bias(float (&x)[BN / 2], const T* bias, int c0, int N) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = min(c0 + 8 * j, N - 2);
    const float b0 = to_float(ldg(bias + col)), b1 = to_float(ldg(bias + col + 1));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      x[4 * j + 2 * h] = __fadd_rn(x[4 * j + 2 * h], b0);
      x[4 * j + 2 * h + 1] = __fadd_rn(x[4 * j + 2 * h + 1], b1);
    }
  }
}

// The epilogue of one tile, on the thread's finished fp32 accumulators x (wgmma layout: x[4 j + 2 h + e]
// is row r0 + 8 h, column c0 + 8 j + e): v = act(alpha x + C + bias) in place, then one of the stores
// below. Each option is a separate pass over all of x, with its run-time test outside the pass: a test
// inside one fused loop made the compiler unswitch the loop into a copy per option combination (some 40
// copies of the store code; a minute of ptxas per kernel).
template <typename OUT, int BN>
__device__ __forceinline__ void gemm_epilogue_math(float (&x)[BN / 2], const void* out, const void* bias,
                                                   float alpha, int r0, int c0, int M, int N, int bias_kind,
                                                   int act, int accumulate) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) x[i] = __fmul_rn(x[i], alpha);
  if constexpr (!GemmOut<OUT>::fp8) {
    if (accumulate) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = c0 + 8 * j;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = r0 + 8 * h;
          if (row < M && col < N) {
            const float2 c = gemm_load_pair<OUT>(out, (size_t)row * N + col);
            x[4 * j + 2 * h] = __fadd_rn(x[4 * j + 2 * h], c.x);
            x[4 * j + 2 * h + 1] = __fadd_rn(x[4 * j + 2 * h + 1], c.y);
          }
        }
      }
    }
  }
  if (bias_kind == GEMM_BIAS_F32) gemm_add_bias<BN>(x, static_cast<const float*>(bias), c0, N);
  else if (bias_kind == GEMM_BIAS_BF16) gemm_add_bias<BN>(x, static_cast<const bf16*>(bias), c0, N);
  switch (act) {
    case GELU_TANH:
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) x[i] = act_f<GELU_TANH>(x[i]);
      break;
    case GELU_ERF:
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) x[i] = act_f<GELU_ERF>(x[i]);
      break;
    case SILU:
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) x[i] = act_f<SILU>(x[i]);
      break;
    case RELU:
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) x[i] = act_f<RELU>(x[i]);
      break;
    case SQUARED_RELU:
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) x[i] = act_f<SQUARED_RELU>(x[i]);
      break;
    default:
      break;
  }
}

// amax(|v|) of the thread's valid elements of a tile, merged into `am` (fmaxf).
template <int BN>
__device__ __forceinline__ float gemm_tile_amax(const float (&x)[BN / 2], float am, int r0, int c0, int M, int N) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (c0 + 8 * j < N && r0 + 8 * h < M)          // N is even: column c0 + 8 j + 1 is valid too
        am = fmaxf(am, fmaxf(fabsf(x[4 * j + 2 * h]), fabsf(x[4 * j + 2 * h + 1])));
    }
  }
  return am;
}

// The tile's amax merged per warp into *amax (common/fp8.cuh warp_amax_merge). Shipped: once per tile,
// so lane 0 of every consumer warp reads *amax (one hot L2 line for the whole grid) and waits for it
// before the tile's stores. FK_GEMM_AMAX_ONCE = 1 keeps the running max in `run` instead and merges it
// once after the last tile (max is associative: the same bits); predicted +1-3 % for the fused FP8
// epilogue at the 31-wave issue-5 shapes, where it costs 4-10 % over the plain bf16 GEMM.
template <int BN>
__device__ __forceinline__ void gemm_amax(const float (&x)[BN / 2], float* amax, float& run, int r0, int c0, int M,
                                          int N) {
  if constexpr (FK_GEMM_AMAX_ONCE) {
    run = gemm_tile_amax<BN>(x, run, r0, c0, M, N);
  } else {
    warp_amax_merge(gemm_tile_amax<BN>(x, 0.f, r0, c0, M, N), amax);
  }
}

// fp32 outputs: each thread stores its column pairs (8 bytes) of the valid rows and columns.
template <int BN>
__device__ __forceinline__ void gemm_store_f32(const float (&x)[BN / 2], void* out, int r0, int c0, int M, int N) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = c0 + 8 * j;
    if (col >= N) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + 8 * h;
      if (row >= M) continue;
      *reinterpret_cast<float2*>(static_cast<float*>(out) + (size_t)row * N + col) =
          make_float2(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]);
    }
  }
}

// The 16-bit / 8-bit outputs' pairs of a thread, packed: pk[2 j + h] holds (bf16 x 2, or FP8 x 2 in the
// low 16 bits) row r0 + 8 h, columns c0 + 8 j, + 1; FP8 bytes are sat(v x oscale).
template <typename OUT, int BN>
__device__ __forceinline__ void gemm_pack(const float (&x)[BN / 2], unsigned (&pk)[BN / 4], float oscale) {
#pragma unroll
  for (int i = 0; i < BN / 4; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    if constexpr (GemmOut<OUT>::fp8) {
      pk[i] = fp8x2_from_float<OUT>(__fmul_rn(x0, oscale), __fmul_rn(x1, oscale));
    } else {
      pk[i] = from_float<bf16>(x0).bits | ((unsigned)from_float<bf16>(x1).bits << 16);
    }
  }
}

// Direct stores of packed pairs (the valid rows and columns).
template <typename OUT, int BN>
__device__ __forceinline__ void gemm_store_packed(const unsigned (&pk)[BN / 4], void* out, int r0, int c0, int M,
                                                  int N) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = c0 + 8 * j;
    if (col >= N) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + 8 * h;
      if (row >= M) continue;
      const size_t idx = (size_t)row * N + col;
      if constexpr (GemmOut<OUT>::fp8) {
        *reinterpret_cast<unsigned short*>(static_cast<unsigned char*>(out) + idx) = (unsigned short)pk[2 * j + h];
      } else {
        *reinterpret_cast<unsigned*>(static_cast<bf16*>(out) + idx) = pk[2 * j + h];
      }
    }
  }
}

// Staged stores of one warpgroup's 64 x BN slab (rows row0 .., columns col0 ..) of packed pairs: per
// round, the pairs go into `stage` (GemmStaging::wg_bytes of shared memory, 1024-byte aligned) as 64-row
// boxes of 128 bytes per row with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8):
// the 8 rows a warp writes at once then fall in different banks), then one thread of the warpgroup
// issues a TMA store per box and commits them as one bulk group. Before a round overwrites the stage,
// that thread waits until the previous group has read it (wait_group.read) and the warpgroup meets at
// its named barrier; nothing waits for the global writes, which drain while the next tile's main loop
// runs. Rows past M and columns past N are clipped by the tensor map.
template <typename OUT, int BN, int STORE>
__device__ __forceinline__ void gemm_store_staged(const unsigned (&pk)[BN / 4], const TmaMap* map, unsigned stage,
                                                  int wg, int row0, int col0) {
  using S = GemmStaging<OUT, BN, STORE>;
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const bool issuer = t == 0;
#pragma unroll
  for (int q = 0; q < S::rounds; ++q) {
    if (issuer) bulk_wait_all<true>();
    named_barrier(1 + wg, 128);
#pragma unroll
    for (int jj = 0; jj < S::cols / 8; ++jj) {
      const int j = q * (S::cols / 8) + jj;             // 8-column group of the tile
      const int box = jj / (S::box_cols / 8);           // its 128-byte box of this round
      const int byte = (jj % (S::box_cols / 8)) * 8 * GemmOut<OUT>::bytes + 2 * (lane & 3) * GemmOut<OUT>::bytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + (lane >> 2) + 8 * h;  // row within the warpgroup's 64
        const unsigned addr = stage + box * (64 * 128) + r * 128 + ((((byte >> 4) ^ r) & 7) << 4) + (byte & 15);
        if constexpr (GemmOut<OUT>::fp8) {
          asm volatile("st.shared.u16 [%0], %1;" :: "r"(addr), "h"((unsigned short)pk[2 * j + h]) : "memory");
        } else {
          asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(pk[2 * j + h]) : "memory");
        }
      }
    }
    fence_proxy_async_smem();
    named_barrier(1 + wg, 128);
    if (issuer) {
#pragma unroll
      for (int b = 0; b < S::boxes; ++b)
        tma_store_2d(map, stage + b * (64 * 128), col0 + q * S::cols + b * S::box_cols, row0);
      bulk_commit();
    }
  }
}

// ----------------------------------------------------------------------------------------------------
// The kernel. Dynamic shared memory: 1024 (alignment slack) + STAGES x (128 + BN) x 128
//   + 2 x GemmStaging::wg_bytes (staged stores) + 2 x STAGES x 8.
//   tma_d: the output's tensor map for staged stores (unused, any bytes, with direct stores).
//   scale_a / scale_b: per-tensor (1 fp32 each) or, in BLOCK mode, the (M, ceil(K/128)) and
//   (ceil(N/128), ceil(K/128)) fp32 scale_inv arrays. out_scale: FP8 outputs only. amax: null or a
//   zeroed fp32 (atomicMax). bias: null or N values of bias_kind. accumulate: C += (out read in place).
//   Stream-K only (SCHED = GEMM_SCHED_STREAMK): dp_tiles, the tiles walked data-parallel; sk_part, gridDim.x
//   x 2 x (BN / 2) x 128 fp32 of parked tails; sk_flag, gridDim.x x 2 ints (0, or a launch's epoch while
//   a tail waits); sk_epoch != 0, this launch's. The other instantiations ignore them.
template <typename TA, typename TB, int BN, int MODE, typename OUT, int STAGES, int CLUSTER, int STORE,
          int SCHED = GEMM_SCHED_DP>
__global__ void __launch_bounds__(kGemmThreads, 1)
fp8_gemm_sm90(const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b,
              const __grid_constant__ TmaMap tma_d, void* out,
              const void* bias, const float* scale_a, const float* scale_b, const float* out_scale,
              float* amax, int M, int N, int K, int bias_kind, int act, int accumulate,
              int dp_tiles, float* sk_part, int* sk_flag, int sk_epoch) {
#if FK_GEMM_SM90A
  static_assert(BN == 128 || BN == 256, "tile width");
  static_assert(MODE == GEMM_FAST || BN == 128, "promoted accumulation needs BN = 128 (registers)");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "cluster of 1 or 2 CTAs along M");
  static_assert(STORE == GEMM_STORE_DIRECT || GemmOut<OUT>::bytes <= 2, "staged stores: bf16 and FP8 outputs");
  static_assert(SCHED == GEMM_SCHED_DP || CLUSTER == 1, "stream-K: one CTA per tile");
  constexpr int NR = BN / 2;                         // wgmma accumulators per thread
  constexpr int NF = MODE == GEMM_FAST ? 1 : NR;     // promoted accumulators per thread
  constexpr unsigned A_BYTES = kGemmBM * kGemmBK, B_BYTES = BN * kGemmBK;
  constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;

  extern __shared__ unsigned char gemm_smem_raw[];
  const unsigned raw = gemm_smem_u32(gemm_smem_raw);
  const unsigned base = (raw + 1023u) & ~1023u;      // swizzle atoms need 1024-byte aligned stages
  constexpr unsigned OUT_STAGE = GemmStaging<OUT, BN, STORE>::wg_bytes;   // per consumer warpgroup
  const unsigned out_stage = base + STAGES * STAGE_BYTES;                  // 1024-aligned, then 2 x OUT_STAGE
  const unsigned bars = out_stage + 2 * OUT_STAGE;  // full[STAGES], then empty[STAGES]
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (STAGES + s); };
  auto stage_a = [&](int s) { return base + s * STAGE_BYTES; };
  auto stage_b = [&](int s) { return base + s * STAGE_BYTES + A_BYTES; };

  const int warpgroup = threadIdx.x / 128;
  const int m_tiles = (M + kGemmBM - 1) / kGemmBM, n_tiles = (N + BN - 1) / BN;
  // The walk is over units of CLUSTER tile-rows x 1 tile-column: CTA `rank` of a cluster takes tile-row
  // CLUSTER * unit_row + rank (past the last tile-row it loads zeros and stores nothing, but still
  // multicasts its share of B), so the cluster's CTAs share the B tile and each loads 1 / CLUSTER of it.
  const int m_units = (m_tiles + CLUSTER - 1) / CLUSTER;
  const int num_units = m_units * n_tiles;
  const int unit0 = blockIdx.x / CLUSTER, unit_step = gridDim.x / CLUSTER;
  const int rank = CLUSTER == 1 ? 0 : (int)cluster_rank();
  const int k_blocks = (K + kGemmBK - 1) / kGemmBK;
  const int dp_end = SCHED == GEMM_SCHED_STREAMK ? dp_tiles : num_units;   // tiles walked data-parallel

  if (threadIdx.x == 0) {
    tma_prefetch_map(&tma_a);
    tma_prefetch_map(&tma_b);
    if constexpr (STORE != GEMM_STORE_DIRECT) tma_prefetch_map(&tma_d);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kGemmConsumerWarps * CLUSTER);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  if constexpr (CLUSTER == 1) __syncthreads();
  else cluster_sync_all();                           // the peers' barriers exist before any multicast

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {
      int s = 0;
      unsigned phase = 0;
      for (GemmWalk<SCHED> w(unit0, unit_step, dp_end, num_units, k_blocks); w.next();) {
        int tu, tn;
        gemm_tile_coords(w.t, m_units, n_tiles, tu, tn);
        const int tm = tu * CLUSTER + rank;
        for (int kb = w.kb0; kb < w.kb1; ++kb) {
          mbar_wait(empty_bar(s), phase ^ 1u);       // with a cluster: released by every CTA's consumers
          mbar_expect_tx(full_bar(s), STAGE_BYTES);  // A, and all of B (its CLUSTER shares)
          tma_load_2d(stage_a(s), &tma_a, full_bar(s), kb * kGemmBK, tm * kGemmBM);
          if constexpr (CLUSTER == 1) {
            tma_load_2d(stage_b(s), &tma_b, full_bar(s), kb * kGemmBK, tn * BN);
          } else {                                   // this CTA's share of B, to every CTA of the cluster
            constexpr int SHARE = BN / CLUSTER;
            tma_load_2d_multicast(stage_b(s) + rank * SHARE * kGemmBK, &tma_b, full_bar(s), kb * kGemmBK,
                                  tn * BN + rank * SHARE, (unsigned short)((1u << CLUSTER) - 1u));
          }
          if (++s == STAGES) { s = 0; phase ^= 1u; }
        }
      }
    }
  } else {
    // ---------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = warpgroup - 1;                    // 64-row half of the tile
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const int row_in_tile = 64 * cw + 16 * warp + (lane >> 2);
    const float alpha = MODE == GEMM_BLOCK ? 1.f : __fmul_rn(__ldg(scale_a), __ldg(scale_b));
    const float oscale = GemmOut<OUT>::fp8 ? __ldg(out_scale) : 1.f;
    const unsigned a_off = cw * 64 * kGemmBK;         // this warpgroup's 64 rows of the A stage
    float acc[NR];
    float acc2[MODE == GEMM_FAST ? 1 : NR];          // the second wgmma accumulator of SPLIT / BLOCK
    float fin[NF];
    int s = 0;
    unsigned phase = 0;
    // Staggered warpgroups (FK_GEMM_WG_LAG_NS, an experiment): both consumer warpgroups finish a tile's
    // last K block together and run their epilogues while the tensor cores idle. Started a little apart,
    // each one's epilogue can fall while the other still multiplies (alone, at the full tensor rate, it
    // catches up by about the epilogue's length, so the lag renews itself tile after tile); the stage
    // ring (a stage is refilled once both have released it) bounds the lag. Same arithmetic, same bits.
    if (FK_GEMM_WG_LAG_NS > 0 && cw == 1) __nanosleep(FK_GEMM_WG_LAG_NS);

    // The epilogue of tile (tm, tn): v = act(alpha x + C + bias) with amax; 16-bit and 8-bit outputs are
    // packed into pairs, then stored (direct or staged); fp32 outputs are stored from x.
    unsigned pk[GemmOut<OUT>::bytes <= 2 ? BN / 4 : 1];
    float amax_run = 0.f;                            // FK_GEMM_AMAX_ONCE: this thread's amax so far
    auto epilogue = [&](float (&x)[NR], int tm, int tn) {
      const int r0 = tm * kGemmBM + row_in_tile, c0 = tn * BN + 2 * (lane & 3);   // rows r0, r0 + 8
      gemm_epilogue_math<OUT, BN>(x, out, bias, alpha, r0, c0, M, N, bias_kind, act, accumulate);
      if (amax != nullptr) gemm_amax<BN>(x, amax, amax_run, r0, c0, M, N);
      if constexpr (GemmOut<OUT>::bytes <= 2) {
        gemm_pack<OUT, BN>(x, pk, oscale);
        if constexpr (STORE == GEMM_STORE_DIRECT) {
          gemm_store_packed<OUT, BN>(pk, out, r0, c0, M, N);
        } else {
          gemm_store_staged<OUT, BN, STORE>(pk, &tma_d, out_stage + cw * OUT_STAGE, cw, tm * kGemmBM + 64 * cw,
                                            tn * BN);
        }
      } else {
        gemm_store_f32<BN>(x, out, r0, c0, M, N);
      }
    };
    auto tile_coords = [&](int t, int& tm, int& tn) {
      int tu;
      gemm_tile_coords(t, m_units, n_tiles, tu, tn);
      tm = tu * CLUSTER + rank;
    };
    // The end of a segment: whole tiles run the epilogue; with stream-K a tail parks x instead, and a
    // head collects its tail first.
    auto finish = [&](float (&x)[NR], int tm, int tn, int kb0, int kb1) {
      if constexpr (SCHED == GEMM_SCHED_STREAMK) {
        const size_t slot_floats = (size_t)2 * NR * 128;
        if (kb0 > 0) {
          gemm_sk_park<NR>(x, sk_part + blockIdx.x * slot_floats + cw * NR * 128, sk_flag + 2 * blockIdx.x + cw,
                           sk_epoch, cw);
          return;
        }
        if (kb1 < k_blocks)
          gemm_sk_collect<NR>(x, sk_part + (blockIdx.x + 1) * slot_floats + cw * NR * 128,
                              sk_flag + 2 * (blockIdx.x + 1) + cw, sk_epoch, cw);
      }
      epilogue(x, tm, tn);
    };

    if constexpr (MODE == GEMM_FAST) {
      for (GemmWalk<SCHED> w(unit0, unit_step, dp_end, num_units, k_blocks); w.next();) {
        int tm, tn;
        tile_coords(w.t, tm, tn);
        const int kb0 = w.kb0, kb1 = w.kb1;          // acc = the product over K blocks [kb0, kb1)
        int prev = 0;
        for (int kb = kb0; kb < kb1; ++kb) {
          mbar_wait(full_bar(s), phase);
          const unsigned long long da = wgmma_desc(stage_a(s) + a_off), db = wgmma_desc(stage_b(s));
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < kGemmBK / 32; ++k)
            Wgmma<BN, TA, TB>::mma(acc, da + 2 * k, db + 2 * k, (kb > kb0 || k > 0) ? 1 : 0);
          wgmma_commit();
          wgmma_wait<1>();                           // the previous block's group is done: free its stage
          if (kb > kb0) gemm_release<CLUSTER>(empty_bar(prev), lane);
          prev = s;
          if (++s == STAGES) { s = 0; phase ^= 1u; }
        }
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
        gemm_release<CLUSTER>(empty_bar(prev), lane);
        finish(acc, tm, tn, kb0, kb1);
      }
    } else {
      // Two wgmma accumulators in turn, in pairs of K blocks: block kb + 1 runs on the tensor cores
      // while block kb is promoted into fin (wait_group 1); the pair's second promotion still waits for
      // an empty tensor pipe. No group stays in flight across the loop's back edge: with one in flight
      // ptxas serialised every wgmma (C7514), and pairs unrolled into chunks of 4 or more spill.
      // Offset pairs (FK_GEMM_OFFSET_PAIRS): the second warpgroup promotes block 0 alone and then pairs
      // (1, 2), (3, 4), ...: each warpgroup's exposed promotion (after the second block of its pair)
      // then falls while the other warpgroup has a block in flight. The order of additions per thread
      // is unchanged, so are the results. H200 A/B in one run (094930Z against 095013Z): BLOCK +2.6 to
      // +5.3% at all five benchmark shapes; SPLIT -7.6 to +1.7% (mixed; the fast-accumulation rows,
      // unaffected by the flag, moved up to 6% between the two runs) -> on for BLOCK only.
      constexpr bool kOffsetPairs = FK_GEMM_OFFSET_PAIRS == 2 || (FK_GEMM_OFFSET_PAIRS == 1 && MODE == GEMM_BLOCK);
      // (Issuing the next tile's first K block before a tile's epilogue, while fin still holds the tile,
      // gained nothing on the H200; with the next pair in flight instead the epilogue spilled 150-210 B.)
      int tm = 0, tn = 0;
      int sa_row0 = 0, sa_row1 = 0;                  // this thread's rows, clamped (block scales)
      float s0a = 1.f, s1a = 1.f, s0b = 1.f, s1b = 1.f;   // block scales of the blocks in acc / acc2
      int blk_a = 0, blk_b = 0;                             // their stages, released once promoted
      auto issue = [&](float (&d)[NR], float& sc0, float& sc1, int& blk, int kb) {
        gemm_block_scales<MODE>(scale_a, scale_b, sa_row0, sa_row1, tn, k_blocks, kb, sc0, sc1);
        gemm_issue_block<BN, TA, TB>(d, full_bar(s), phase, stage_a(s) + a_off, stage_b(s));
        blk = s;
        if (++s == STAGES) { s = 0; phase ^= 1u; }
      };
      auto retire = [&](float (&d)[NR], float sc0, float sc1, int blk) {
        wgmma_fence_operands(d);
        gemm_promote<MODE, NR>(fin, d, sc0, sc1);
        gemm_release<CLUSTER>(empty_bar(blk), lane);
      };
      for (GemmWalk<SCHED> w(unit0, unit_step, dp_end, num_units, k_blocks); w.next();) {
        tile_coords(w.t, tm, tn);
        const int kb0 = w.kb0, kb1 = w.kb1;          // fin = the sum over K blocks [kb0, kb1)
        const int r0 = tm * kGemmBM + row_in_tile;
        sa_row0 = min(r0, M - 1);
        sa_row1 = min(r0 + 8, M - 1);
        int kb = kb0;
#pragma unroll
        for (int i = 0; i < NR; ++i) fin[i] = 0.f;
        if (kOffsetPairs && cw == 1 && kb1 > kb0) {
          issue(acc, s0a, s1a, blk_a, kb0);
          wgmma_wait<0>();
          retire(acc, s0a, s1a, blk_a);
          kb = kb0 + 1;
        }
        for (; kb + 2 <= kb1; kb += 2) {              // a pair: kb in acc, kb + 1 in acc2
          issue(acc, s0a, s1a, blk_a, kb);
          issue(acc2, s0b, s1b, blk_b, kb + 1);
          wgmma_wait<1>();                            // kb has retired, kb + 1 runs while it is promoted
          retire(acc, s0a, s1a, blk_a);
          wgmma_wait<0>();
          retire(acc2, s0b, s1b, blk_b);
        }
        if (kb < kb1) {                               // an odd last block, alone
          issue(acc, s0a, s1a, blk_a, kb);
          wgmma_wait<0>();
          retire(acc, s0a, s1a, blk_a);
        }
        finish(fin, tm, tn, kb0, kb1);
      }
    }
    if (FK_GEMM_AMAX_ONCE && amax != nullptr) warp_amax_merge(amax_run, amax);  // every lane of the warp
    // The last staged stores have read shared memory before the block's shared memory is released.
    if constexpr (STORE != GEMM_STORE_DIRECT) {
      if ((threadIdx.x & 127) == 0) bulk_wait_all<false>();
    }
  }
  if constexpr (CLUSTER > 1) {  // no CTA leaves while a peer may still multicast into it or arrive on it
    __syncwarp();
    cluster_sync_all();
  }
#else
  __trap();  // sm_90a only: the Python dispatch never launches it elsewhere
#endif
}

}  // namespace fk
