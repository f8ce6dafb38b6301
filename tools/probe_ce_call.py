"""Where the time of fk.cross_entropy(x, t, return_grad=True) goes beyond its fused kernel, bf16, 8192 x
131072 (or PROBE_CE_SHAPE=M,N): the count kernel (ce_reduce over the targets), the final reduction, the
fused kernel without and with the count pointer (the mean's 1 / count), the three queued as the call
queues them (plain launches, then the fused kernel and the sum as programmatic dependents: FUSEDKIT_PDL),
and the call itself (without and with the dependent launches), each timed by the benchmark's GpuTimer
(L2 flushed before each call). PROBE_ROUNDS (3) rounds, the cases in a rotated order each round (the
first form of this probe ran them in one fixed order and read times that rose case after case, 1520 ->
1538 -> 1541 -> 1549 us on an H100, in both of its passes: drift, not cost, for all it could tell).
Until 2026-12-07 09:00Z the probe had a timer of its own (the median of 40 queued calls;
probe_ce_call_H100_2026-12-07T0803Z.json). Writes JSON to argv[1] when given.

    PYTHONPATH=. python3 tools/probe_ce_call.py [out.json]
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit import _env
from fusedkit.backends import cuda_cross_entropy as ce
from fusedkit.bench import GpuTimer, run_meta

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))


def main():
    M, N = (int(v) for v in os.environ.get("PROBE_CE_SHAPE", "8192,131072").split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, N, (M,), device="cuda", generator=g)
    s = torch.cuda.current_stream().cuda_stream
    loss, out = torch.empty(M, device="cuda"), torch.empty(1, device="cuda")
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
    grad = torch.empty_like(x)
    timer = GpuTimer(torch)

    def count():
        ce.reduce(0, t.data_ptr(), False, M, -100, 0, cnt.data_ptr(), False, 0, s, None)

    def reduce(dependent=False):
        ce.reduce(loss.data_ptr(), t.data_ptr(), False, M, -100, out.data_ptr(), 0, True, 0, s, None,
                  dependent=dependent)

    def fused(cp, dependent=False):
        ce.forward(x.data_ptr(), t.data_ptr(), False, grad.data_ptr(), loss.data_ptr(), 0, cp, M, N,
                   "bfloat16", -100, 0.0, 0.0, 1.0, 0, s, dependent=dependent)

    def api(pdl):  # the switch back on after each call: the dependent-launch case above needs it on
        _env.PDL = pdl
        try:
            fk.cross_entropy(x, t, return_grad=True)
        finally:
            _env.PDL = True

    cases = {"count": count, "reduce": reduce, "fused": lambda: fused(0),
             "fused_count": lambda: fused(cnt.data_ptr()),
             "count+fused_count+reduce": lambda: (count(), fused(cnt.data_ptr()), reduce()),
             "the same, dependent launches": lambda: (count(), fused(cnt.data_ptr(), True), reduce(True)),
             "api, plain launches": lambda: api(False),
             "api": lambda: api(True)}
    names = list(cases)
    rows = []
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            rows.append({"round": r, "case": name, "median_us": timer.ms(cases[name]) * 1e3})
    for name in names:
        us = [row["median_us"] for row in rows if row["case"] == name]
        print(f"{M}x{N} {name:26s} " + " / ".join(f"{u:8.1f}" for u in us) + " us")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({**run_meta(torch.cuda.get_device_name()), "shape": [M, N], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
