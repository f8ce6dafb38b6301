"""A/B of the FP8 casts' walks, on the GPU, in one process: fp8_quantize (delayed and current scaling)
under cuda_fp8.QUANT_UNROLL in QUANT (vectors per thread of the one-pass walk), fp8_dequantize under
DEQUANT_UNROLL in DEQUANT (0: the row walk; U > 0: one pass, U vectors per thread), the block-scaled
quantize (MXFP8, 1 x 128) under BLOCKS_UNROLL in BLOCKS (0: the grid-stride walk; U > 0: the flat one)
and cast_transpose_dbias / dact_cast_transpose (GeLU, dbias) under DBIAS_TILES in DBIAS (128-row tiles
per block, each block's partial sums one scratch row), at the benchmark's FP8 shapes (bf16 <-> E4M3 /
E5M2), beside a device copy (and torch.compile's dequantize).
Rounds are interleaved (every variant of a shape timed once per round, each keeps its fastest median);
the quantize call cache is cleared between variants, since its plans hold the launcher and the grid.
Prints fractions of copy, writes JSON to argv[1].

    PYTHONPATH=. python3 tools/ab_unroll.py $OUT/ab_unroll.json [--rounds 3] [--ops fp8_dequantize,...]
"""
import argparse
import json

import torch

from fusedkit import _callcache, _registry
from fusedkit.backends import cuda_fp8
from fusedkit.bench import (FP8_SHAPES, GpuTimer, _fp8_block_impls, _fp8_grad_impls, _fp8_impls, copy_gbps,
                            run_meta)

QUANT = (2, 4)
DEQUANT = (0, 2, 4)
BLOCKS = (0, 2, 4)
DBIAS = (8, 4, 16)
OPS = {"fp8_quantize_delayed": ("QUANT_UNROLL", QUANT), "fp8_quantize_current": ("QUANT_UNROLL", QUANT),
       "fp8_dequantize": ("DEQUANT_UNROLL", DEQUANT),
       "fp8_quantize_mxfp8": ("BLOCKS_UNROLL", BLOCKS), "fp8_quantize_block_1x128": ("BLOCKS_UNROLL", BLOCKS),
       "fp8_cast_transpose_dbias": ("DBIAS_TILES", DBIAS),
       "fp8_dact_cast_transpose": ("DBIAS_TILES", DBIAS)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", default="", help="comma-separated subset of OPS (default: all)")
    args = p.parse_args()
    ops = {op: OPS[op] for op in (args.ops.split(",") if args.ops else OPS)}
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    rows = []
    for M, N in FP8_SHAPES:
        for op, (knob, values) in ops.items():
            make = (_fp8_block_impls if op.startswith("fp8_quantize_block") or "mxfp8" in op
                    else _fp8_grad_impls if "cast_transpose" in op else _fp8_impls)
            impls = make(torch, op, M, N, torch.bfloat16)
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
            nbytes = _registry.OPS[op].bytes_moved(M, N, 2)
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
