"""A/B of the persistent staged kernels' ring depth (common/staged.cuh STAGES: rows loaded ahead) on
the long rows, bf16: the softmax forward at 512 x 262144 and 2048 x 65536 (shipped config against
cuda_softmax.STAGED_FWD_CANDIDATES), the softmax backward at 512 x 262144 (shipped against its split
with 2 buffers) and the fused cross-entropy (loss + gradient) at 8192 x 131072 and 4096 x 262144
(shipped against cuda_cross_entropy.PERSISTENT_CANDIDATES with a ring, and the benchmark's call
fk.cross_entropy beside the kernel alone). AB_ROUNDS (3) interleaved
rounds, each config a fraction of a copy timed in the same round; prints each config's grid cap
(resident clusters) and whether its output bits equal the first config's (a ring moves loads, not
sums, so they must). AB_CASES=softmax_fwd,ce_262144 keeps some cases. Writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_staged_ring.py out.json
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit.backends import cuda_cross_entropy as cce
from fusedkit.backends import cuda_softmax as cs
from fusedkit.bench import GpuTimer, copy_gbps, run_meta

ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))


def softmax_fwd_case(N):
    return lambda: _softmax_fwd(N)


def _softmax_fwd(N):
    M = 2**27 // N
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    shipped = cs.fwd_config(N, 2, True, staged=True)
    configs = [shipped] + [c for c in cs.STAGED_FWD_CANDIDATES[N] if c != shipped]

    def make(cfg):
        y = torch.empty_like(x)

        def run():
            cs.forward(x.data_ptr(), 0, y.data_ptr(), M, N, "bfloat16", "bfloat16", 1.0, False, cs.MASK_NONE,
                       cs.NO_MASK, 0, stream, config=cfg)
            return y
        return run
    return f"softmax_fwd {M}x{N}", 4 * M * N, configs, make, lambda cfg: _cap(cs._fwd_plans, cfg, 6)


def softmax_bwd_case():
    M, N = 512, 262144
    g = torch.Generator(device="cuda").manual_seed(1)
    y = torch.softmax(torch.randn(M, N, device="cuda", generator=g) * 2, -1).to(torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    shipped = cs.bwd_config(N, 2, True, staged=True)
    configs = [shipped, shipped[:5] + (2,)]

    def make(cfg):
        dx = torch.empty_like(y)

        def run():
            cs.backward(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), M, N, "bfloat16", 1.0, False, 0, stream,
                        config=cfg)
            return dx
        return run
    return "softmax_bwd 512x262144", 6 * M * N, configs, make, lambda cfg: _cap(cs._bwd_plans, cfg, 4)


def ce_case(M, N):
    def case():
        g = torch.Generator(device="cuda").manual_seed(2)
        x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
        t = torch.randint(0, N, (M,), device="cuda", generator=g)
        loss = torch.empty(M, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        shipped = cce.fwd_config(N, 2)
        # ("api",): the benchmark's call, fk.cross_entropy (mean: a count kernel, the fused kernel with the
        # shipped config, a reduction), so the gap between the kernel alone and the call shows (its
        # gradient is scaled by 1 / M: its bits differ)
        rings = [("persistent", 8) + tuple(c) for c in cce.PERSISTENT_CANDIDATES[N] if len(c) > 3]
        configs = [shipped] + rings + [("api",)]

        def make(cfg):
            if cfg == ("api",):
                return lambda: fk.cross_entropy(x, t, return_grad=True)[1]
            grad = torch.empty_like(x)

            def run():  # the kernel alone (per-token loss, no reduction) and the gradient: 4MN bytes
                cce.forward(x.data_ptr(), t.data_ptr(), False, grad.data_ptr(), loss.data_ptr(), 0, 0, M, N,
                            "bfloat16", -100, 0.0, 0.0, 1.0, 0, stream, config=cfg)
                return grad
            return run
        return f"cross_entropy {M}x{N}", 4 * M * N, configs, make, lambda cfg: _cap(cce._plans, cfg, 3)
    return case


def _cap(plans, cfg, key_index):
    """The grid cap of the plan built for ``cfg`` (the config at ``key_index`` of the plan cache's key)."""
    caps = [p.cap for k, p in plans.items() if k[key_index] == cfg]
    return caps[0] if caps and caps[0] is not None else 0


CASES = {"softmax_fwd": softmax_fwd_case(262144), "softmax_fwd_65536": softmax_fwd_case(65536),
         "softmax_bwd": softmax_bwd_case,
         "ce_131072": ce_case(8192, 131072), "ce_262144": ce_case(4096, 262144)}


def main(out_path):
    timer = GpuTimer(torch)
    keep = os.environ.get("AB_CASES")
    out = []
    for name, build in CASES.items():
        if keep and name not in keep.split(","):
            continue
        label, nbytes, configs, make, cap_of = build()
        runs, outs, caps = {}, {}, {}
        for cfg in configs:
            runs[cfg] = make(cfg)
            outs[cfg] = runs[cfg]().clone()
            torch.cuda.synchronize()
            caps[cfg] = cap_of(cfg)
        ref = outs[configs[0]].view(torch.int16)
        same = {str(c): bool(torch.equal(outs[c].view(torch.int16), ref)) for c in configs}
        del outs
        rows = []
        for r in range(ROUNDS):
            copy = copy_gbps(torch, timer)
            for cfg in configs:
                ms = timer.ms(runs[cfg], rep=20)
                gbps = nbytes / ms / 1e6
                rows.append({"round": r, "config": list(cfg), "cap": caps[cfg], "ms": ms, "GBps": gbps,
                             "of_copy": gbps / copy})
                print(f"{label:24s} round {r} {str(cfg):34s} cap {caps[cfg]:4d} {ms * 1e3:8.1f} us "
                      f"{gbps / copy:.3f} of copy  same bits: {same[str(cfg)]}", flush=True)
        for cfg in configs:
            fr = [x["of_copy"] for x in rows if x["config"] == list(cfg)]
            print(f"{label:24s} {str(cfg):34s} rounds {' / '.join(f'{f:.3f}' for f in fr)}", flush=True)
        out.append({"case": label, "bytes": nbytes, "same_bits": same, "rows": rows})
        del runs
        torch.cuda.empty_cache()
    json.dump({**run_meta(torch.cuda.get_device_name()), "cases": out}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
