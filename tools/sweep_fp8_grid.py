"""Sweep the grid of the FP8 kernels whose blocks walk their work grid-stride, on the GPU: the norm
forward with FP8 output (cuda_norms.FWD_FP8_WAVES, TUNED_FP8_WAVES emptied for the sweep), bytes 3MN
(read x, write FP8). None (the non-persistent kernel: one row group per block, the amax merged per warp)
against the grid-stride kernel on 1, 2 and 4 waves of resident blocks, two interleaved rounds (drift
shows up as disagreement), bf16, the benchmark's FP8 shapes. Prints every variant's time, GB/s and
fraction of a copy timed in the same run, and the best per (op, shape); writes JSON to argv[1].

History (H200, 2026-12-04, sweep_fp8_grid_2026-12-04T*.json): None within 1-2 % of 1 / 2 / 4 waves
(1630Z; RMSNorm a little ahead with None, LayerNorm not); a row widened to fp32 once in registers (24-48
fewer instructions, 9-13 more registers) and fp32 weights both lost (1645Z); gamma / beta in shared
memory as fp32 lost 6-25 % (1850Z); two rows per thread (weights loaded once for both) lost or tied
(1923Z). The grid-stride walk on fp8_ct_tile's cast-transpose was dropped too: 0.67-0.82 of copy against
0.85-0.87 with one tile per block (sweep_fp8_grid_2026-12-03T0949Z.json). H100, 2026-12-06
(sweep_fp8_grid_H100_2026-12-06T1056Z.json): None won LayerNorm 8192 by 6 points and RMSNorm 8192 /
14336 by 1-2 (now TUNED_FP8_WAVES); 4 waves won LayerNorm 14336 by 3 at the persistent kernel's config,
None with its own (7, 8) by 7 (the config sweep below, sweep_fp8_configs_*_H100_2026-12-06T1105Z.json).

SWEEP_FP8_CONFIGS=1 sweeps the launch config instead, on each shape's shipped grid: every (vectors per
thread <= 8, warps <= 16) that covers the row with at most an eighth of its vector slots idle, warp
counts that are not powers of two included (14336 = 1792 vectors: 4 x 14 warps fits it exactly where
the rule's 4 x 16 leaves an eighth of the threads idle on the last vector). SWEEP_FP8_WAVES=none (or a
number) sweeps them on that grid instead of each shape's shipped one (TUNED_FP8_WAVES / FWD_FP8_WAVES).
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit._launch import cupy_stream
from fusedkit.backends import cuda_norms
from fusedkit.bench import (FP8_SHAPES, GpuTimer, copy_gbps, norm_fp8_inputs, precompile, run_meta,
                            sweep_configs)

WAVES = (None, 1, 2, 4)


def cases(M, N):
    """(op, knob module, knob name, bytes, callable)."""
    x, w, b, scale = norm_fp8_inputs(torch, M, N, torch.bfloat16)
    return [
        ("layer_norm_fp8_fwd", cuda_norms, "FWD_FP8_WAVES", 3 * M * N,
         lambda: fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=scale)),
        ("rms_norm_fp8_fwd", cuda_norms, "FWD_FP8_WAVES", 3 * M * N,
         lambda: fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=scale)),
    ]


def fp8_configs(N):
    vec = cuda_norms.vec_width(N, 2)
    nv = N // vec
    out = []
    for warps in range(1, 17):
        items = -(-nv // (32 * warps))
        if items <= 8 and nv >= 0.875 * 32 * warps * items:  # at most an eighth of the slots idle
            out.append(("rows", vec, items, warps))
    return out


def sweep_configs_main(out_path, timer, copy):
    waves = os.environ.get("SWEEP_FP8_WAVES")
    if waves is not None:  # one grid for every shape
        cuda_norms.TUNED_FP8_WAVES, cuda_norms.FWD_FP8_WAVES = {}, None if waves == "none" else int(waves)
    precompile(cuda_norms.FILE, [
        cuda_norms.fwd_fp8_expr(c, "bfloat16", "bfloat16", "e4m3", rms, plain_w=True, N=N,
                                persistent=cuda_norms.fwd_fp8_waves(N, 2, rms) is not None)
        for _, N in FP8_SHAPES for c in fp8_configs(N) for rms in (False, True)])
    import cupy
    stream = cupy_stream(torch.cuda.current_stream().cuda_stream)
    results = []
    for M, N in FP8_SHAPES:
        x, w, b, scale = norm_fp8_inputs(torch, M, N, torch.bfloat16)
        y8 = torch.empty(M, N, device="cuda", dtype=torch.uint8)
        sinv, amax = torch.empty(1, device="cuda"), torch.zeros(1, device="cuda")
        for rms in (False, True):
            op = "rms_norm_fp8_fwd" if rms else "layer_norm_fp8_fwd"

            def make(cfg):  # the backend call fk.layer_norm / fk.rms_norm makes, with the config forced
                return lambda: cuda_norms.forward_fp8(
                    x.data_ptr(), 0, w.data_ptr(), 0 if rms else b.data_ptr(), y8.data_ptr(), 0, 0, 0,
                    scale.data_ptr(), sinv.data_ptr(), amax.data_ptr(), M, N, "bfloat16", "bfloat16", "e4m3",
                    1e-5, 0, rms, 0, stream, config=cfg)
            shipped = cuda_norms.fwd_fp8_config(N, 2, rms)
            sweep_configs(timer, copy, f"{op} {M}x{N} (shipped {shipped})", fp8_configs(N), make, 3 * M * N,
                          results, op=op, shape=[M, N], shipped=list(shipped))
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), copy_GBps=copy, kind="configs", waves=waves,
                       rows=results), f, indent=1)


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    print(f"copy {copy:.0f} GB/s")
    if os.environ.get("SWEEP_FP8_CONFIGS") == "1":
        return sweep_configs_main(out_path, timer, copy)
    results = []
    tuned, cuda_norms.TUNED_FP8_WAVES = cuda_norms.TUNED_FP8_WAVES, {}  # FWD_FP8_WAVES decides every shape
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
    cuda_norms.TUNED_FP8_WAVES = tuned
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), copy_GBps=copy, rows=results), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sweep_fp8_grid.json")
