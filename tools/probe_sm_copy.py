"""How many SMs a copy needs to reach the device's copy bandwidth.

    PYTHONPATH=. python3 tools/probe_sm_copy.py out.json

The long-row kernels (softmax_fwd_staged, ce_fwd_persistent / ce_fwd_staged) run as many thread-block
clusters as fit at once, and clusters of 8 or 16 CTAs leave SMs idle: ncu on the H100 read 30 clusters
of 8 (240 CTAs, 2 a SM) and 21 of 16 (336, 3 a SM), SMs active 87 % / 84 % of the cycles
(ncu_long_rows_H100_2026-12-06T1716Z.txt). Whether that costs bandwidth depends on how much one SM can
move: this times a grid-stride 16-byte copy (1 GiB each way, 1024 threads a block, one block a SM forced
by its shared memory, 4 loads in flight a thread) on 16 ... all SMs, each against torch's copy of the
same bytes timed beside it. Writes JSON to argv[1].
"""
import json
import sys

import cupy
import torch

from fusedkit._launch import cupy_stream
from fusedkit.bench import GpuTimer, run_meta

SRC = r"""
extern "C" __global__ void __launch_bounds__(1024) copy_sm(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                          long long n) {
  extern __shared__ unsigned char pad[];  // only there to hold one block per SM
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
  if (n < 0) pad[threadIdx.x] = 0;
}
"""


def main(out_path):
    timer = GpuTimer(torch)
    nbytes = 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    kern = cupy.RawKernel(SRC, "copy_sm")
    smem = 120 * 1024
    kern.max_dynamic_shared_size_bytes = smem
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n16 = nbytes // 16
    stream = cupy_stream(torch.cuda.current_stream().cuda_stream)
    t_copy = timer.ms(lambda: dst.copy_(src), rep=20)
    rows = []
    for n_sm in sorted({16, 33, 66, 88, 99, 110, 120, sms}):
        def run(n_sm=n_sm):
            with stream:
                kern((n_sm,), (1024,), (src.data_ptr(), dst.data_ptr(), n16), shared_mem=smem)
        run()
        assert torch.equal(dst[:4096], src[:4096]) and torch.equal(dst[-4096:], src[-4096:])
        t = timer.ms(run, rep=20)
        rows.append({"sms": n_sm, "ms": t, "GBps": 2 * nbytes / t / 1e6, "of_copy": t_copy / t})
        print(f"{n_sm:4d} SMs  {2 * nbytes / t / 1e6:8.0f} GB/s  {t_copy / t:.3f} of torch's copy", flush=True)
    json.dump({**run_meta(torch.cuda.get_device_name()), "copy_ms": t_copy, "rows": rows}, open(out_path, "w"),
              indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
