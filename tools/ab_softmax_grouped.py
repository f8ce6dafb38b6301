"""A/B of the softmax forward at 512 x 262144 (bf16): the shipped staged config (clusters) against the
grouped candidates (cuda_softmax.STAGED_FWD_CANDIDATES: no clusters, an L2 mailbox per row group, every
CTA slot filled), AB_ROUNDS (3) interleaved rounds, each a fraction of a copy timed in the same round.
Prints the resident clusters / groups of each and checks that every variant's output bits equal the
shipped one's. Writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_softmax_grouped.py out.json
"""
import json
import os
import sys

import torch

from fusedkit.backends import cuda_softmax as cs
from fusedkit.bench import GpuTimer, copy_gbps, run_meta

ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))


def main(out_path):
    timer = GpuTimer(torch)
    M, N = 512, 262144
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    shipped = cs.fwd_config(N, 2, True, staged=True)
    configs = [shipped] + [c for c in cs.STAGED_FWD_CANDIDATES[N] if c != shipped]
    ys, runs, caps = {}, {}, {}
    for cfg in configs:
        y = torch.empty_like(x)

        def run(cfg=cfg, y=y):
            cs.forward(x.data_ptr(), 0, y.data_ptr(), M, N, "bfloat16", "bfloat16", 1.0, False, cs.MASK_NONE,
                       cs.NO_MASK, 0, stream, config=cfg)
        run()
        torch.cuda.synchronize()
        ys[cfg], runs[cfg] = y, run
        caps[cfg] = [p[5] for k, p in cs._fwd_plans.items() if k[6] == cfg][0]
    ref = ys[shipped].view(torch.int16)
    same = {str(c): bool(torch.equal(ys[c].view(torch.int16), ref)) for c in configs}
    rows = []
    for r in range(ROUNDS):
        copy = copy_gbps(torch, timer)
        for cfg in configs:
            ms = timer.ms(runs[cfg], rep=20)
            gbps = 4 * M * N / ms / 1e6
            rows.append({"round": r, "config": list(cfg), "cap": caps[cfg], "ms": ms, "GBps": gbps,
                         "of_copy": gbps / copy})
            print(f"round {r}  {str(cfg):32s} cap {caps[cfg]:4d}  {ms * 1e3:8.1f} us  {gbps / copy:.3f} of copy"
                  f"  same bits: {same[str(cfg)]}", flush=True)
    for cfg in configs:
        fr = [x["of_copy"] for x in rows if x["config"] == list(cfg)]
        print(f"{str(cfg):32s} rounds {' / '.join(f'{f:.3f}' for f in fr)}", flush=True)
    json.dump({**run_meta(torch.cuda.get_device_name()), "M": M, "N": N, "same_bits": same, "rows": rows},
              open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
