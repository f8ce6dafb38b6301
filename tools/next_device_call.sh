#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order, in
# one command (docs/perf_notes.rst, the latest session's section, says why each part is there). Part 1
# runs on any card (GPU tests and sanitizer of kernels changed since their last GPU run, then probes
# whose figures are per card); part 2 only on an H200 (the A/B runs and benchmarks that decide configs
# and go into the README table). Every part writes under its own folder of $OUT and prints a summary.
#   device call: cd .snap && bash tools/next_device_call.sh      (after bash tools/gpu_snapshot.sh;
#   carry [".snap"]; a few seconds on an H100, 600 s more on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"

# 1. Any card: nothing waits (every change since the last H200 run passed its GPU tests on an H100,
# the last at 10:10Z; the H100 A/B of the dependent launches: ab_pdl_H100_2026-12-07T0943Z.json and
# ab_pdl_fp8_H100_2026-12-07T1002Z.json).
case "$G" in *H200*) ;; *) echo "not an H200: part 2 skipped"; exit 0;; esac

# 2. H200 only, most wanted first (a call cut short still returns what finished): the benchmark of the
# norms, cross-entropy and current-scaling quantize (the README rows; programmatic dependent launches
# and ce_grad_scale since the last H200 run: does RMSNorm forward + backward at 16384 x 8192 reach
# 1.2x Liger, cross-entropy 0.85 at 131072?); the PDL A/B on this card; the staged kernels' ring
# depths; Nsight Compute of RMSNorm 16384 x 8192 against torch.compile; the FP8 norms' grid sweep
# (LayerNorm -> FP8 at 8192: the cards disagree).
OUT=$OUT/bench STAGES=bench BUDGET=330 BENCH_ARGS="--only _norm_fwd,cross_entropy,fp8_quantize_current --rounds 3" \
  bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
tail -14 "$OUT/bench/bench.log"
mkdir -p "$OUT/ab"
AB_ROUNDS=2 timeout 90 python3 tools/ab_pdl.py "$OUT/ab/ab_pdl.json" > "$OUT/ab/ab_pdl.log" 2>&1
tail -17 "$OUT/ab/ab_pdl.log"
AB_CASES=softmax_fwd,softmax_bwd,ce_131072,ce_262144 AB_ROUNDS=2 timeout 120 \
  python3 tools/ab_staged_ring.py "$OUT/ab/ab_staged_ring.json" > "$OUT/ab/ab_staged_ring.log" 2>&1
grep rounds "$OUT/ab/ab_staged_ring.log"
OUT=$OUT/ncu STAGES=profile PROFILE_CASES=rms8192 NCU_KERNELS="norm_fwd|triton" NCU_COUNT=4 BUDGET=100 \
  bash tools/gpu_check.sh > "$OUT/ncu.log" 2>&1
grep -E "Context|DRAM Through|Duration|L1/TEX Hit|L2 Hit|Achieved Occ" "$OUT/ncu/ncu.txt" | head -24
OUT=$OUT/fp8 STAGES=fp8sweep BUDGET=120 bash tools/gpu_check.sh > "$OUT/fp8.log" 2>&1
tail -12 "$OUT/fp8/sweep_fp8_grid.log"
