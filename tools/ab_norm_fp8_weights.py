"""The FP8-output norms with bf16 against fp32 weights, on the GPU (same x, same bytes of output).

LayerNorm -> FP8 is issue-bound (Nsight Compute, 2026-12-04: 17.1 instructions per element at 0.70 issued
per scheduler and cycle); widening gamma and beta from bf16 takes 2 of them per element. Weights kept in
fp32 (as Transformer Engine often keeps LayerNorm parameters) skip that widening but load twice the
weight bytes from L1 / L2 for every row. Times both at the benchmark's FP8 shapes, two interleaved rounds,
as a fraction of a copy timed in the same run (3MN bytes: the weights are not counted), and checks that
both give the same FP8 bytes (the weights are exact in both dtypes). Writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_norm_fp8_weights.py $OUT/ab_norm_fp8_weights.json
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.bench import FP8_SHAPES, GpuTimer, copy_gbps, norm_fp8_inputs, run_meta


def main(out_path):
    timer = GpuTimer(torch)
    rows = []
    cases = []
    for M, N in FP8_SHAPES:
        x, w, b, s = norm_fp8_inputs(torch, M, N, torch.bfloat16)
        w32, b32 = w.float(), b.float()
        for op in ("layer_norm_fp8_fwd", "rms_norm_fp8_fwd"):
            for wname, ww, bb in (("bf16", w, b), ("fp32", w32, b32)):
                if op.startswith("layer"):
                    fn = (lambda x=x, ww=ww, bb=bb, s=s: fk.layer_norm(x, ww, bb, fp8_fmt="e4m3", fp8_scale=s))
                else:
                    fn = (lambda x=x, ww=ww, s=s: fk.rms_norm(x, ww, fp8_fmt="e4m3", fp8_scale=s))
                cases.append((op, (M, N), wname, fn))
    for i in range(0, len(cases), 2):  # bf16 and fp32 weights give the same bytes
        a, b_ = cases[i][3]().data, cases[i + 1][3]().data
        assert torch.equal(a, b_), f"{cases[i][0]} {cases[i][1]}: fp32 weights changed the output"
    for rnd in range(2):
        copy = copy_gbps(torch, timer)
        for op, (M, N), wname, fn in cases:
            ms = timer.ms(fn)
            rows.append(dict(op=op, shape=[M, N], weights=wname, round=rnd, ms=ms, copy_GBps=copy,
                             of_copy=3 * M * N / ms / 1e6 / copy))
            print(f"{op:20s} {M}x{N:<6d} weights {wname} round {rnd}: {ms * 1e3:7.1f} us "
                  f"{rows[-1]['of_copy']:.3f} of copy", flush=True)
    for op, (M, N), wname, _ in cases:
        got = [r["of_copy"] for r in rows if r["op"] == op and r["shape"] == [M, N] and r["weights"] == wname]
        print(f"SUMMARY {op:20s} {M}x{N:<6d} weights {wname}: best {max(got):.3f}")
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ab_norm_fp8_weights.json")
