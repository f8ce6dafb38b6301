#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order
# (docs/perf_notes.rst, the latest session's section, says why each part is there). Every part writes
# under its own folder of $OUT and prints a summary; a call cut short still returns what finished.
#   device call: cd .snap && bash tools/next_device_call.sh   (after bash tools/gpu_snapshot.sh; carry
#   [".snap"]; about 300 s on an H100, 550 s on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"
summary() { sed -n '/==== summary/,$p' "$1" | head -"$2"; }  # gpu_check.sh's closing summary of one part

# 1. Any card. The FK_NORM_L1 experiment (cuda/norms.cu: L1 eviction priorities in the norm forwards;
# Nsight Compute on the H200 read our RMSNorm 8192 forward's L1 hit rate at 33 % against torch.compile's
# 49 %): the norm GPU tests built with it, then its A/B against the shipped build with torch.compile in
# the same rounds. If bit 2 (rows L1::no_allocate) lifts RMSNorm 16384 x 8192 past torch.compile on the
# H200, make it the default (and rerun the benchmark: STAGES=bench BENCH_ARGS="--only _norm_fwd").
OUT=$OUT/l1_tests STAGES=test BUDGET=150 TEST_OPTIONS="-DFK_NORM_L1=2" \
  PYTEST_ARGS="tests/test_norms.py tests/test_norms_fp8.py" PYTEST_K="grid_stride or test_forward or misaligned" bash tools/gpu_check.sh > "$OUT/l1_tests.log" 2>&1
summary "$OUT/l1_tests.log" 10
AB_OPTIONS="-DFK_NORM_L1=2;-DFK_NORM_L1=3" AB_OPS="rms_norm_fwd,layer_norm_fwd,norm_fp8_fwd" AB_PEERS=1 \
  AB_ROUNDS=2 timeout 240 python3 tools/ab_nvrtc_options.py "$OUT/ab_norm_l1.json" > "$OUT/ab_norm_l1.log" 2>&1
tail -40 "$OUT/ab_norm_l1.log"
case "$G" in *H200*) ;; *) echo "not an H200: the H200 part skipped"; exit 0;; esac

# 2. H200 only: the norm benchmark with device-bound peers (the 2026-12-07 12:55Z run's forward +
# backward peers were host-bound; is RMSNorm forward + backward at 16384 x 8192 at 1.2x Liger with PDL?).
OUT=$OUT/bench STAGES=bench BUDGET=200 BENCH_ARGS="--only _norm_fwd --rounds 3" \
  bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
summary "$OUT/bench.log" 60
