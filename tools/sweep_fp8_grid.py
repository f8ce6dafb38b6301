"""Sweep the grid of the FP8 kernels whose blocks walk their work grid-stride, on the GPU: the norm
forward with FP8 output (cuda_norms.FWD_FP8_WAVES), bytes 3MN (read x, write FP8). None (one row group
per block: the amax merged at the end of every block) against 1, 2 and 4 waves of resident blocks, two
interleaved rounds (drift shows up as disagreement), bf16, the benchmark's FP8 shapes. (The same knob on
fp8_ct_tile's cast-transpose was measured and dropped: 0.67-0.82 of copy against 0.85-0.87 with one
tile per block, sweep_fp8_grid_2026-12-03T0949Z.json.) Prints every variant's time, GB/s and fraction of a copy timed in the same run,
and the best per (op, shape); writes JSON to argv[1].
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_norms
from fusedkit.bench import FP8_SHAPES, GpuTimer, copy_gbps

WAVES = (None, 1, 2, 4)


def cases(M, N):
    """(op, knob module, knob name, bytes, callable)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 0.5 - 2.3).bfloat16()
    w = (torch.randn(N, device="cuda", generator=g) * 0.3 + 1).bfloat16()
    b = (torch.randn(N, device="cuda", generator=g) * 0.3).bfloat16()
    scale = torch.full((1,), 448.0 / 6.0, device="cuda")
    return [
        ("layer_norm_fp8_fwd", cuda_norms, "FWD_FP8_WAVES", 3 * M * N,
         lambda: fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=scale)),
        ("rms_norm_fp8_fwd", cuda_norms, "FWD_FP8_WAVES", 3 * M * N,
         lambda: fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=scale)),
    ]


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    print(f"copy {copy:.0f} GB/s")
    results = []
    for M, N in FP8_SHAPES:
        for op, mod, knob, nbytes, run in cases(M, N):
            default = getattr(mod, knob)
            rows = []
            for rnd in range(2):
                for waves in WAVES:
                    setattr(mod, knob, waves)
                    ms = timer.ms(run)
                    gbps = nbytes / ms / 1e6
                    rows.append(dict(op=op, shape=[M, N], knob=knob, waves=waves, round=rnd, ms=ms, GBps=gbps,
                                     of_copy=gbps / copy))
                    print(f"{op:20s} {M}x{N} {knob}={str(waves):4s} round {rnd}: {ms * 1e3:8.1f} us "
                          f"{gbps:6.0f} GB/s {gbps / copy:.3f} of copy", flush=True)
            setattr(mod, knob, default)
            best = min(rows, key=lambda r: r["ms"])
            print(f"BEST {op} {M}x{N}: {knob}={best['waves']} {best['of_copy']:.3f} of copy")
            results += rows
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_GBps=copy, rows=results), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_fp8_grid.json")
