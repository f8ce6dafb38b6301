"""Sweep the two knobs of the norm backward that matter when M is small, on the GPU:

- cuda_norms.MIN_ROWS_PER_SLOT: the fewest rows each row slot of the persistent backward walks. It caps
  P, the fp32 partial rows of dweight / dbias (P x N each, written by the backward and read back by
  column_sum); at 4096 x 1024 with 4 rows per slot the partials are as many bytes as x.
- cuda_norms.COLSUM_LANES: column_sum's rows of threads per block (its loads come from L2 and are
  latency-bound, so more lanes keep more of them in flight).

Times fusedkit's forward + backward (the benchmark's closure: the host path included, which is what
decides at 4096 x 1024) and the backward alone, bf16, LayerNorm and RMSNorm, with torch eager's
forward + backward timed in the same run beside it. Writes JSON to argv[1].
"""
import datetime
import json
import sys

import torch

import fusedkit as fk
from fusedkit import _callcache
from fusedkit.backends import cuda_norms
from fusedkit.bench import GpuTimer, copy_gbps, precompile, versions

SHAPES = [(4096, 1024), (16384, 1024), (4096, 4096), (131072, 1024)]
MIN_ROWS = (4, 8, 16, 32)
LANES = (8, 16, 32)


def closures(M, N, rms):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 0.5 - 2.3).bfloat16()
    w = (torch.randn(N, device="cuda", generator=g) * 0.3 + 1).bfloat16()
    b = (torch.randn(N, device="cuda", generator=g) * 0.3).bfloat16()
    dy = torch.randn(M, N, device="cuda", generator=g).bfloat16()
    if rms:
        _, r = fk.rms_norm(x, w, return_stats=True)

        def fwdbwd():
            _, r_ = fk.rms_norm(x, w, return_stats=True)
            return fk.rms_norm_backward(dy, x, w, r_)
        bwd = lambda: fk.rms_norm_backward(dy, x, w, r)  # noqa: E731
    else:
        _, m, r = fk.layer_norm(x, w, b, return_stats=True)

        def fwdbwd():
            _, m_, r_ = fk.layer_norm(x, w, b, return_stats=True)
            return fk.layer_norm_backward(dy, x, w, m_, r_)
        bwd = lambda: fk.layer_norm_backward(dy, x, w, m, r)  # noqa: E731
    xg, wg, bg = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    F = torch.nn.functional

    def eager():
        y = F.rms_norm(xg, (N,), wg, 1e-5) if rms else F.layer_norm(xg, (N,), wg, bg, 1e-5)
        return torch.autograd.grad(y, (xg, wg) if rms else (xg, wg, bg), dy)
    return fwdbwd, bwd, eager


def main(out_path):
    precompile(cuda_norms.FILE, [cuda_norms.colsum_expr("bfloat16", lanes) for lanes in LANES])
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    print(f"copy {copy:.0f} GB/s")
    rows = []
    saved = cuda_norms.MIN_ROWS_PER_SLOT, cuda_norms.COLSUM_LANES
    for M, N in SHAPES:
        for rms in (False, True):
            op = "rms_norm" if rms else "layer_norm"
            fwdbwd, bwd, eager = closures(M, N, rms)
            t_eager = timer.ms(eager)
            print(f"{op} {M}x{N}: torch eager fwd+bwd {t_eager * 1e3:.1f} us")
            for min_rows in MIN_ROWS:
                for lanes in LANES:
                    cuda_norms.MIN_ROWS_PER_SLOT, cuda_norms.COLSUM_LANES = min_rows, lanes
                    cuda_norms._bwd_plans.clear()
                    _callcache.clear()
                    t_fb, t_b = timer.ms(fwdbwd), timer.ms(bwd)
                    bytes_b = 6 * M * N  # read x, dy, write dx (bf16)
                    rows.append(dict(op=op, shape=[M, N], min_rows_per_slot=min_rows, colsum_lanes=lanes,
                                     fwdbwd_ms=t_fb, bwd_ms=t_b, eager_fwdbwd_ms=t_eager,
                                     bwd_frac_copy=bytes_b / t_b / 1e6 / copy, vs_eager=t_eager / t_fb))
                    print(f"  min_rows {min_rows:2d} lanes {lanes:2d}: fwd+bwd {t_fb * 1e3:7.1f} us "
                          f"({t_eager / t_fb:.2f}x eager)  bwd {t_b * 1e3:7.1f} us "
                          f"({bytes_b / t_b / 1e6 / copy:.3f} of copy)")
    cuda_norms.MIN_ROWS_PER_SLOT, cuda_norms.COLSUM_LANES = saved
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), versions=versions(),
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(), copy_GBps=copy, rows=rows,
                       shipped=dict(min_rows_per_slot=saved[0], colsum_lanes=saved[1])), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sweep_norm_bwd_small.json")
