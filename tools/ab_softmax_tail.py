"""The softmax forward's tail split, A/B on the GPU (cuda_softmax.TAIL_SPLIT_MAX / TUNED_TAIL_FWD).

Rows of 65536 take one 1024-thread CTA each, one CTA per SM: 2048 rows run as 15.5 waves in the time
of 16. The split hands the last wave's rows to a second launch that spreads each row over a cluster.
Times the forward without the split and with each candidate tail config, bf16, at M = 2048 (the
benchmark's 2^27 elements), 1980 (15 whole waves: if 2048 takes 16/15 of its time rather than 2048/1980,
the last wave is lockstep), 1000 (7.6 waves), 200 (1.5) and 68 (half a wave: all rows split), three
interleaved rounds, as a fraction of a copy timed in the same run (4MN bytes); checks that every
variant's output matches the unsplit one's (within a bf16 rounding). Writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_softmax_tail.py $OUT/ab_softmax_tail.json
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_softmax as cs
from fusedkit.bench import GpuTimer, copy_gbps

N = 65536
MS = (2048, 1980, 1000, 200, 68)
# None: no split; else the tail's ("cluster", items, warps, C) (vec 8 for bf16)
VARIANTS = (None, ("cluster", 8, 16, 2), ("cluster", 4, 16, 4), ("cluster", 4, 32, 2), ("cluster", 2, 16, 8),
            ("cluster", 2, 32, 4))


def name(v):
    return "no split" if v is None else "tail " + ",".join(map(str, v[1:]))


def select(v):
    cs._fwd_plans.clear()
    cs._tail_plans.clear()
    if v is None:
        cs.TAIL_SPLIT_MAX = None
    else:
        cs.TAIL_SPLIT_MAX = 0.75
        cs.TUNED_TAIL_FWD[(N, 2)] = v


def main(out_path):
    timer = GpuTimer(torch)
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = {M: (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16) for M in MS}
    ref = {}
    for v in VARIANTS:  # compile and check every variant first
        select(v)
        for M in MS:
            y = fk.softmax(xs[M])
            if v is None:
                ref[M] = y
            else:
                diff = ((y.float() - ref[M].float()).abs().max() / ref[M].float().abs().max()).item()
                assert diff <= 2**-7, f"{name(v)} M={M}: differs from the unsplit output by {diff} (relative)"
    rows = []
    for rnd in range(3):
        copy = copy_gbps(torch, timer)
        for M in MS:
            for v in VARIANTS:
                select(v)
                x = xs[M]
                ms = timer.ms(lambda: fk.softmax(x))
                tp = next((t for t in cs._tail_plans.values() if t is not None), None)
                split = cs.split_rows(M, tp[0], tp[4]) if (tp and v is not None) else (M, 0)
                rows.append(dict(M=M, N=N, variant=name(v), round=rnd, ms=ms, copy_GBps=copy,
                                 of_copy=4 * M * N / ms / 1e6 / copy, head=split[0], tail=split[1]))
                print(f"softmax_fwd {M:5d} x {N} {name(v):18s} round {rnd}: {ms * 1e3:7.1f} us "
                      f"{rows[-1]['of_copy']:.3f} of copy  (head {split[0]}, tail {split[1]})", flush=True)
    for M in MS:
        for v in VARIANTS:
            got = sorted(r["of_copy"] for r in rows if r["M"] == M and r["variant"] == name(v))
            print(f"SUMMARY M={M:5d} {name(v):18s} median {got[len(got) // 2]:.3f}  best {got[-1]:.3f}")
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), N=N, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ab_softmax_tail.json")
