#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order, in
# one command (docs/perf_notes.rst, the latest session's section, says why each part is there). Part 1
# runs on any card (GPU tests and sanitizer of kernels changed since their last GPU run, then probes
# whose figures are per card); part 2 only on an H200 (the A/B runs and benchmarks that decide configs
# and go into the README table). Every part writes under its own folder of $OUT and prints a summary.
#   device call: cd .snap && bash tools/next_device_call.sh      (after bash tools/gpu_snapshot.sh;
#   carry [".snap"]; about 200 s on an H100, 480 s on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"

# 1. Any card. Programmatic dependent launches (PDL; H100 09:43Z: +0.3 points on every norm fwdbwd and
# cross-entropy call, ab_pdl_H100_2026-12-07T0943Z.json; their tests fail with the waits compiled out,
# 09:50Z). Now ce_reduce counts the targets before its wait: the cross-entropy GPU tests and sanitizer,
# the norm dependent-launch tests (the switch moved to fusedkit._env.PDL), the call probe at the three
# benchmark shapes.
OUT=$OUT/tests STAGES=test,sanitize PYTEST_ARGS="tests/test_cross_entropy.py" SANITIZE=cross_entropy BUDGET=150 \
  PYTEST_K="not numpy and not torch_cpu" bash tools/gpu_check.sh > "$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log"
OUT=$OUT/tests_norms STAGES=test PYTEST_ARGS="tests/test_norms.py" PYTEST_K="dependent" BUDGET=60 \
  bash tools/gpu_check.sh > "$OUT/tests_norms.log" 2>&1
tail -2 "$OUT/tests_norms.log"
mkdir -p "$OUT/probe"
for shape in 16384,32768 8192,131072 4096,262144; do
  PROBE_CE_SHAPE=$shape timeout 90 python3 tools/probe_ce_call.py "$OUT/probe/probe_ce_call_${shape/,/x}.json" \
    > "$OUT/probe/probe_${shape/,/x}.log" 2>&1
  grep -E "reduce|api|dependent|fused" "$OUT/probe/probe_${shape/,/x}.log"
done
case "$G" in *H200*) ;; *) echo "not an H200: part 2 skipped"; exit 0;; esac

# 2. H200 only, most wanted first (a call cut short still returns what finished): the cross-entropy
# benchmark (the README rows, with ce_grad_scale); the staged kernels' ring depths and the cross-entropy
# call beside its kernel; Nsight Compute of RMSNorm 16384 x 8192 against torch.compile; the FP8 norms'
# grid sweep (LayerNorm -> FP8 at 8192: the H100 and the H200 disagree).
OUT=$OUT/bench STAGES=bench BENCH_ARGS="--only cross_entropy --rounds 3" BUDGET=150 \
  bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
tail -12 "$OUT/bench/bench.log"
mkdir -p "$OUT/ab"
AB_CASES=softmax_fwd,softmax_bwd,ce_131072,ce_262144 AB_ROUNDS=2 timeout 150 \
  python3 tools/ab_staged_ring.py "$OUT/ab/ab_staged_ring.json" > "$OUT/ab/ab_staged_ring.log" 2>&1
grep rounds "$OUT/ab/ab_staged_ring.log"
OUT=$OUT/ncu STAGES=profile PROFILE_CASES=rms8192 NCU_KERNELS="norm_fwd|triton" NCU_COUNT=4 BUDGET=100 \
  bash tools/gpu_check.sh > "$OUT/ncu.log" 2>&1
grep -E "Context|DRAM Through|Duration|L1/TEX Hit|L2 Hit|Achieved Occ" "$OUT/ncu/ncu.txt" | head -24
OUT=$OUT/fp8 STAGES=fp8sweep BUDGET=120 bash tools/gpu_check.sh > "$OUT/fp8.log" 2>&1
tail -12 "$OUT/fp8/sweep_fp8_grid.log"
