"""A/B of programmatic dependent launches (fusedkit._env.PDL off / on) in one run, interleaved rounds,
each case timed by the benchmark's GpuTimer (L2 flushed before each call) beside a device copy of the
same bytes: the multi-launch calls, with the benchmark's inputs and byte models.
  rms_norm_fwdbwd / layer_norm_fwdbwd (10MN bytes: forward with statistics, then the backward, whose
    column_sum of dweight / dbias partial rows is the dependent launch) at the benchmark's shapes;
  cross_entropy_fwdbwd (4MN: count -> fused kernel -> sum, the last two dependent);
  fp8_quantize_current (5MN: the amax pass, then the cast as its dependent) and the current-scaling
    cast-transpose (6MN: amax pass, then both casts) at the FP8 benchmark's shapes.
AB_PDL_CASES (comma-separated prefixes of the case names, default all), AB_ROUNDS (3). JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_pdl.py [out.json]
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit import _env
from fusedkit.bench import GpuTimer, run_meta

ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))
NORM_SHAPES = [(131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384)]
CE_SHAPES = [(16384, 32768), (8192, 131072), (4096, 262144)]
FP8_SHAPES = [(32768, 4096), (16384, 8192), (16384, 14336)]


def norm_case(rms, M, N):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 0.5 - 2.3).to(torch.bfloat16)
    w = (torch.randn(N, device="cuda", generator=g) * 0.3 + 1).to(torch.bfloat16)
    b = (torch.randn(N, device="cuda", generator=g) * 0.3).to(torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)

    def run():
        if rms:
            _, r = fk.rms_norm(x, w, return_stats=True)
            return fk.rms_norm_backward(dy, x, w, r)
        _, m, r = fk.layer_norm(x, w, b, return_stats=True)
        return fk.layer_norm_backward(dy, x, w, m, r)
    return run, 10 * M * N


def ce_case(M, N):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
    t = torch.randint(0, N, (M,), device="cuda", generator=g)
    return (lambda: fk.cross_entropy(x, t, return_grad=True)), 4 * M * N


def fp8_case(transpose, M, N):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 100).to(torch.bfloat16)
    fn = fk.cast_transpose if transpose else fk.quantize
    return (lambda: fn(x, fmt="e4m3")), (6 if transpose else 5) * M * N


def main():
    cases = {}
    for rms in (True, False):
        for M, N in NORM_SHAPES:
            name = f"{'rms' if rms else 'layer'}_norm_fwdbwd {M}x{N}"
            cases[name] = lambda rms=rms, M=M, N=N: norm_case(rms, M, N)
    for M, N in CE_SHAPES:
        cases[f"cross_entropy_fwdbwd {M}x{N}"] = lambda M=M, N=N: ce_case(M, N)
    for M, N in FP8_SHAPES:
        cases[f"fp8_quantize_current {M}x{N}"] = lambda M=M, N=N: fp8_case(False, M, N)
        cases[f"fp8_cast_transpose_current {M}x{N}"] = lambda M=M, N=N: fp8_case(True, M, N)
    want = [p for p in os.environ.get("AB_PDL_CASES", "").split(",") if p]
    names = [n for n in cases if not want or any(n.startswith(p) for p in want)]
    timer = GpuTimer(torch)
    rows = []
    for name in names:
        fn, nbytes = cases[name]()
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        for r in range(ROUNDS):
            copy_ms = timer.ms(lambda: dst.copy_(src))
            for pdl in ((False, True) if r % 2 == 0 else (True, False)):
                _env.PDL = pdl
                ms = timer.ms(fn)
                rows.append({"case": name, "round": r, "pdl": pdl, "ms": ms, "copy_ms": copy_ms,
                             "of_copy": copy_ms / ms})
        _env.PDL = True
        del src, dst
        line = []
        for pdl in (False, True):
            f = [row["of_copy"] for row in rows if row["case"] == name and row["pdl"] == pdl]
            line.append(f"{'on ' if pdl else 'off'} " + " / ".join(f"{v:.3f}" for v in f))
        print(f"{name:34s} of copy: " + "   ".join(line), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({**run_meta(torch.cuda.get_device_name()), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
