"""Where the time of fk.cross_entropy(x, t, return_grad=True) goes beyond its fused kernel, bf16, 8192 x
131072 (or PROBE_CE_SHAPE=M,N): the count kernel (ce_reduce over the targets), the final reduction, the
fused kernel without and with the count pointer (the mean's 1 / count), the three queued as the call
queues them, and the call itself. Each line is the median of 40 calls, L2 flushed before each (as the
benchmark) and not. Writes JSON to argv[1] when given.

    PYTHONPATH=. python3 tools/probe_ce_call.py [out.json]
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_cross_entropy as ce
from fusedkit.bench import run_meta


def main():
    M, N = (int(v) for v in os.environ.get("PROBE_CE_SHAPE", "8192,131072").split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, N, (M,), device="cuda", generator=g)
    s = torch.cuda.current_stream().cuda_stream
    loss, out = torch.empty(M, device="cuda"), torch.empty(1, device="cuda")
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
    grad = torch.empty_like(x)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def count():
        ce.reduce(0, t.data_ptr(), False, M, -100, 0, cnt.data_ptr(), False, 0, s, None)

    def reduce():
        ce.reduce(loss.data_ptr(), t.data_ptr(), False, M, -100, out.data_ptr(), 0, True, 0, s, None)

    def fused(cp):
        ce.forward(x.data_ptr(), t.data_ptr(), False, grad.data_ptr(), loss.data_ptr(), 0, cp, M, N, "bfloat16",
                   -100, 0.0, 0.0, 1.0, 0, s)

    cases = {"count": count, "reduce": reduce, "fused": lambda: fused(0), "fused_count": lambda: fused(cnt.data_ptr()),
             "count+fused_count+reduce": lambda: (count(), fused(cnt.data_ptr()), reduce()),
             "api": lambda: fk.cross_entropy(x, t, return_grad=True)}
    rows = []
    for flushed in (True, False):
        for name, fn in cases.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            evs = []
            for _ in range(40):
                if flushed:
                    flush.zero_()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                evs.append((a, b))
            torch.cuda.synchronize()
            us = sorted(a.elapsed_time(b) * 1e3 for a, b in evs)
            rows.append({"case": name, "flushed": flushed, "median_us": us[len(us) // 2], "min_us": us[0]})
            print(f"{M}x{N} flush={flushed!s:5s} {name:26s} median {us[len(us) // 2]:8.1f} us  min {us[0]:8.1f}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({**run_meta(torch.cuda.get_device_name()), "shape": [M, N], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
