// fusedkit/cuda/common/fastdiv.cuh
// Division of a 32-bit unsigned dividend by a divisor fixed for the whole launch, as a multiply-high with
// a multiplier computed on the host (fast_div in fusedkit/backends/cuda_softmax.py). A 32-bit `/` by a
// run-time divisor is ~20 SASS instructions (I2F.U32.RP, MUFU.RCP, F2I and fix-ups); this is four
// (IMAD.HI, an add with carry, a funnel shift).
//
// Method: Granlund & Montgomery, "Division by invariant integers using multiplication" (PLDI 1994),
// the "round-up" multiplier of their Fig. 4.1 with a 33-bit multiplier 2^32 + m. For 1 <= d < 2^32:
//   l = ceil(log2 d),  m = floor(2^32 (2^l - d) / d) + 1  (0 < m < 2^32),
//   n / d = (umulhi(n, m) + n) >> l,   exact for every n < 2^32.
// The sum umulhi(n, m) + n can carry into bit 32, so it is shifted as a 33-bit value: the carry and the
// low word go through one funnel shift (shf.r.clamp, l <= 32). d >= 2^32 is encoded as m = 0, l = 32,
// which gives 0 (exact for every n < 2^32 < d). d = 1: l = 0, m = 1; d = 2^l: m = 1.
// The host passes (m, l) packed into one 64-bit kernel parameter, m | l << 32 (no extra parameter
// codes, and the two halves load from the constant bank separately).
#pragma once

namespace fk {

struct FastDiv {
  unsigned mul;    // m
  unsigned shift;  // l, 0..32

  __device__ __forceinline__ explicit FastDiv(unsigned long long packed)
      : mul((unsigned)packed), shift((unsigned)(packed >> 32)) {}

  // n / d for n < 2^32.
  __device__ __forceinline__ unsigned div(unsigned n) const {
    const unsigned long long t = (unsigned long long)__umulhi(n, mul) + n;  // 33 bits
    return __funnelshift_rc((unsigned)t, (unsigned)(t >> 32), shift);     // low word of t >> min(shift, 32)
  }
};

}  // namespace fk
