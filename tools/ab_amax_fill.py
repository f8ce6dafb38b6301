"""A/B on the GPU: what zeroing the FP8 ops' amax costs per call. Every FP8 op merges its amax into a fresh
zeroed fp32 element (fusedkit._interop.full); variants: "fill" zeroes it with torch's fill kernel (as
before 2026-12-04), "memset" with cudaMemsetAsync on the launch stream (what _interop.full does now),
"nofill" hands out one buffer zeroed outside the timed region, so the op's kernel runs alone (its amax is
then wrong: timing only). Same timer as the benchmark (L2 flushed, median), interleaved rounds; prints a
table, writes JSON to argv[1]. H200, 2026-12-04: fill 2.1-2.5 us a call, memset about half of that
(ab_amax_fill_2026-12-04T1700Z.json, ab_amax_memset_2026-12-04T1715Z.json).

    PYTHONPATH=. python3 tools/ab_amax_fill.py $OUT/ab_amax_fill.json [quick]
"""
import json
import sys

import torch

import fusedkit as fk
from fusedkit import _interop
from fusedkit.bench import GpuTimer, copy_gbps, norm_fp8_inputs, run_meta

SHAPES = ((32768, 4096), (16384, 8192))
real_full = _interop.full  # zeros by cudaMemsetAsync
_cache = {}


def cached_full(kind, like, shape, dtype, value):
    key = (kind, tuple(shape), dtype, value)
    if key not in _cache:
        _cache[key] = real_full(kind, like, shape, dtype, value)
    return _cache[key]


def kernel_full(kind, like, shape, dtype, value):
    """torch's fill kernel for every value (the benchmark runs torch tensors)."""
    t = torch.full(shape, value, dtype=getattr(torch, dtype), device=like.obj.device)
    return t, t.data_ptr()


VARIANTS = {"fill": kernel_full, "memset": real_full, "nofill": cached_full}


def cases(M, N):
    x, w, b, s_norm = norm_fp8_inputs(torch, M, N, torch.bfloat16)
    s_cast = torch.full((1,), 0.37, device="cuda")
    return [("layer_norm_fp8_fwd", 3 * M * N, lambda: fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=s_norm)),
            ("rms_norm_fp8_fwd", 3 * M * N, lambda: fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=s_norm)),
            ("fp8_quantize_delayed", 3 * M * N, lambda: fk.quantize(x, fmt="e4m3", scale=s_cast)),
            ("fp8_cast_transpose", 4 * M * N, lambda: fk.cast_transpose(x, fmt="e4m3", scale=s_cast)),
            ("layer_norm_fwd (no fill)", 4 * M * N, lambda: fk.layer_norm(x, w, b))]


def main(out_path):
    timer = GpuTimer(torch)
    copy = copy_gbps(torch, timer)
    rows = []
    shapes = SHAPES[:1] if sys.argv[2:3] == ["quick"] else SHAPES  # quick: the first shape only
    for M, N in shapes:
        for op, nbytes, fn in cases(M, N):
            for rnd in range(3):
                for variant, full in VARIANTS.items():
                    _interop.full = full
                    ms = timer.ms(fn)
                    _interop.full = real_full
                    r = dict(op=op, shape=[M, N], variant=variant, round=rnd, ms=ms, of_copy=nbytes / ms / 1e6 / copy)
                    rows.append(r)
                    print(f"{op:26s} {M}x{N} {variant:7s} round {rnd}: {ms * 1e3:7.1f} us {r['of_copy']:.3f} of copy",
                          flush=True)
    print(f"copy {copy:.0f} GB/s")
    for M, N in shapes:
        for op in dict.fromkeys(r["op"] for r in rows):
            sel = [r for r in rows if r["op"] == op and r["shape"] == [M, N]]
            best = {v: min(r["ms"] for r in sel if r["variant"] == v) for v in VARIANTS}
            print(f"SUMMARY {op:26s} {M}x{N}: " + "  ".join(f"{v} {t * 1e3:7.1f} us" for v, t in best.items()))
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), copy_GBps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ab_amax_fill.json")
