"""How much of a benchmark ratio the L2 flush takes, on the GPU. The benchmark's timer zeroes a 256 MiB
buffer before each call (as triton.testing.do_bench), so every call starts with L2 full of dirty lines
whose write-back it pays; a 2 x 2 GiB copy pays the same once on 4 GiB of traffic, a 400 MB op about 10 %.
Times a few ops and the copy under flush_mode "zero" (the benchmark's), "read" (L2 full of clean lines)
and "none", interleaved rounds, one process; prints each op's fraction of copy per mode and writes JSON to
argv[1]. Written 2026-12-04 (Nsight Compute put LayerNorm -> FP8 at 0.89 of copy alone where the
benchmark read 0.69-0.83); not run yet.

    PYTHONPATH=. python3 tools/ab_flush.py $OUT/ab_flush.json
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.bench import GpuTimer, copy_gbps, norm_fp8_inputs, run_meta

MODES = ("zero", "read", "none")


def cases():
    M, N = 32768, 4096
    x, w, b, s = norm_fp8_inputs(torch, M, N, torch.bfloat16)
    return [("layer_norm_fwd", 4 * M * N, lambda: fk.layer_norm(x, w, b)),
            ("layer_norm_fp8_fwd", 3 * M * N, lambda: fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=s)),
            ("rms_norm_fp8_fwd", 3 * M * N, lambda: fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=s)),
            ("fp8_quantize_delayed", 3 * M * N, lambda: fk.quantize(x, fmt="e4m3", scale=s)),
            ("softmax_fwd", 4 * M * N, lambda: fk.softmax(x))]


def main(out_path):
    timer = GpuTimer(torch)
    rows = []
    for rnd in range(2):
        for mode in MODES:
            timer.flush_mode = mode
            copy = copy_gbps(torch, timer)
            for op, nbytes, fn in cases():
                ms = timer.ms(fn)
                rows.append(dict(op=op, mode=mode, round=rnd, ms=ms, copy_GBps=copy,
                                 of_copy=nbytes / ms / 1e6 / copy))
                print(f"{op:22s} flush={mode:5s} round {rnd}: {ms * 1e3:7.1f} us  {rows[-1]['of_copy']:.3f} of copy "
                      f"(copy {copy:.0f} GB/s)", flush=True)
    for op in dict.fromkeys(r["op"] for r in rows):
        best = {m: max(r["of_copy"] for r in rows if r["op"] == op and r["mode"] == m) for m in MODES}
        print(f"SUMMARY {op:22s} " + "  ".join(f"{m} {v:.3f}" for m, v in best.items()))
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ab_flush.json")
