"""A/B of the FP8 casts' walks, on the GPU, in one process: fp8_quantize (delayed and current scaling)
under cuda_fp8.QUANT_UNROLL in QUANT (vectors per thread of the one-pass walk) and fp8_dequantize under
DEQUANT_UNROLL in DEQUANT (0: the row walk; U > 0: one pass, U vectors per thread), at the benchmark's FP8 shapes
(bf16 <-> E4M3), beside a device copy (and torch.compile's dequantize). Rounds are interleaved (every
variant of a shape timed once per round, each keeps its fastest median); the quantize call cache is
cleared between variants, since its plans hold the launcher and the grid. Prints fractions of copy,
writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_unroll.py $OUT/ab_unroll.json [--rounds 3]
"""
import argparse
import json

import torch

from fusedkit import _callcache
from fusedkit.backends import cuda_fp8
from fusedkit.bench import FP8_SHAPES, GpuTimer, _fp8_impls, copy_gbps, run_meta

QUANT = (2, 4)
DEQUANT = (2, 4)
OPS = {"fp8_quantize_delayed": ("QUANT_UNROLL", QUANT), "fp8_quantize_current": ("QUANT_UNROLL", QUANT),
       "fp8_dequantize": ("DEQUANT_UNROLL", DEQUANT)}
BYTES = {"fp8_quantize_delayed": 3, "fp8_quantize_current": 5, "fp8_dequantize": 3}  # x MN (bf16 <-> FP8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    rows = []
    for M, N in FP8_SHAPES:
        for op, (knob, values) in OPS.items():
            impls = _fp8_impls(torch, op, M, N, torch.bfloat16)
            # torch.compile only beside dequantize (its compiles cost device time; the quantize ratios
            # to it are in the benchmark)
            ours, compiled = impls["fusedkit"], impls.get("torch_compile") if op == "fp8_dequantize" else None
            shipped = getattr(cuda_fp8, knob)
            times = {v: [] for v in values}
            times["torch_compile"] = []
            for _ in range(args.rounds):
                for v in values:
                    setattr(cuda_fp8, knob, v)
                    _callcache.clear()
                    times[v].append(timer.ms(ours))
                if compiled is not None:
                    times["torch_compile"].append(timer.ms(compiled))
            setattr(cuda_fp8, knob, shipped)
            _callcache.clear()
            nbytes = BYTES[op] * M * N
            for v, ms in times.items():
                if not ms:
                    continue
                best = min(ms)
                rows.append(dict(op=op, M=M, N=N, variant=f"{knob}={v}" if v != "torch_compile" else v,
                                 ms=best, ms_rounds=ms, of_copy=nbytes / best / 1e6 / copy))
                print(f"{op:22s} {M:6d} x {N:6d} {rows[-1]['variant']:18s} {best * 1e3:8.1f} us "
                      f"{rows[-1]['of_copy']:.3f} of copy", flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), copy_GBps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
