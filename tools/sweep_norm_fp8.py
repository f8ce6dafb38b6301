"""Sweep the grid of the FP8-output norm forward on the GPU (cuda_norms.FWD_FP8_WAVES): one row group per
block (None, the launch of the plain forward) against grid-stride grids of 1, 2 and 4 waves of resident
blocks. Also times the plain bf16-output forward of the same shape as a yardstick (4MN bytes against 3MN).

Bytes: read x (2MN) + write the FP8 bytes (MN) = 3MN. Prints every variant's time, GB/s and fraction of a
copy timed in the same run, and the best per (op, shape); writes JSON to argv[1].
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_norms as cn
from fusedkit.bench import GpuTimer, copy_gbps, FP8_SHAPES

WAVES = (None, 1, 2, 4)


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    print(f"copy {copy:.0f} GB/s")
    results = []
    for M, N in FP8_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(M, N, device="cuda", generator=g) * 0.5 - 2.3).bfloat16()
        w = (torch.randn(N, device="cuda", generator=g) * 0.3 + 1).bfloat16()
        b = (torch.randn(N, device="cuda", generator=g) * 0.3).bfloat16()
        scale = torch.full((1,), 448.0 / 6.0, device="cuda")
        for rms in (False, True):
            op = "rms_norm_fp8_fwd" if rms else "layer_norm_fp8_fwd"

            def run(fp8=True):
                kw = dict(fp8_fmt="e4m3", fp8_scale=scale) if fp8 else {}
                return fk.rms_norm(x, w, **kw) if rms else fk.layer_norm(x, w, b, **kw)
            plain_ms = timer.ms(lambda: run(False))
            rows = []
            for _round in range(2):  # two interleaved rounds: drift shows up as disagreement
                for waves in WAVES:
                    cn.FWD_FP8_WAVES = waves
                    ms = timer.ms(run)
                    gbps = 3 * M * N / ms / 1e6
                    rows.append(dict(op=op, shape=[M, N], waves=waves, round=_round, ms=ms, GBps=gbps,
                                     of_copy=gbps / copy))
                    print(f"{op:20s} {M}x{N} waves={str(waves):4s} round {_round}: {ms * 1e3:8.1f} us "
                          f"{gbps:6.0f} GB/s {gbps / copy:.3f} of copy", flush=True)
            cn.FWD_FP8_WAVES = 1
            best = min(rows, key=lambda r: r["ms"])
            print(f"BEST {op} {M}x{N}: waves={best['waves']} {best['of_copy']:.3f} of copy "
                  f"(plain bf16 out: {4 * M * N / plain_ms / 1e6 / copy:.3f} of copy, {plain_ms * 1e3:.1f} us)")
            results += rows + [dict(op=op.replace("_fp8", ""), shape=[M, N], ms=plain_ms,
                                    GBps=4 * M * N / plain_ms / 1e6, of_copy=4 * M * N / plain_ms / 1e6 / copy)]
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_GBps=copy, rows=results), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_norm_fp8.json")
