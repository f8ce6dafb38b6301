// fusedkit/cuda/fp8_scaling.cu -- delayed-scaling state update for many tensors in one launch.
//
// fp8_update_scales: history is (L x n) fp32, row 0 the most recent amax of each of n tensors (the
// quantize kernels write it); scale and scale_inv are n floats. One thread per tensor j (reads of a
// history row are coalesced across threads):
//   amax  = max over the L rows (NaN propagates, as numpy's max does) or row 0 ("most recent");
//   roll  = history[i] <- history[i + 1], history[L - 1] <- old history[0], then history[0] <- 0
//           (Transformer Engine's roll(-1) then zero; L = 1 just zeroes row 0);
//   scale = (fp8_max / amax) / 2^margin in fp32 (IEEE divisions), the previous scale kept when amax is
//           0, inf or NaN, fp32 max when the quotient overflows; scale_inv = 1 / scale.
// Bytes: 2 x L x n x 4 (read and rewrite the history) + 12n; a few microseconds for any real model,
// one launch instead of one per tensor. Numerics: exactly fusedkit.fp8.recipes (update_amax_history,
// delayed_scale), tested bit for bit.
// Status: bit for bit with the reference on the H200 (tests/test_fp8_scaling.py, GPU run of 2026-12-03).

namespace fk {

__device__ __forceinline__ float max_propagate_nan(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

__global__ void __launch_bounds__(256)
fp8_update_scales(float* __restrict__ history, float* __restrict__ scale, float* __restrict__ scale_inv,
                  int L, int n, float fp8_max, float pow2_margin, int most_recent) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const float first = history[j];
  float amax = first;
  if (!most_recent)
    for (int i = 1; i < L; ++i) amax = max_propagate_nan(amax, history[(long long)i * n + j]);
  for (int i = 0; i + 1 < L; ++i) history[(long long)i * n + j] = history[(long long)(i + 1) * n + j];
  if (L > 1) history[(long long)(L - 1) * n + j] = first;
  history[j] = 0.f;
  float s = scale[j];
  if (amax > 0.f && isfinite(amax)) {
    s = __fdiv_rn(__fdiv_rn(fp8_max, amax), pow2_margin);
    if (isinf(s)) s = 3.402823466e38f;
  }
  scale[j] = s;
  if (scale_inv != nullptr) scale_inv[j] = __fdiv_rn(1.f, s);
}

}  // namespace fk
