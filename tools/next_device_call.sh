#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order
# (docs/perf_notes.rst, the latest session's section, says why each part is there). Every part writes
# under its own folder of $OUT and prints a summary; a call cut short still returns what finished.
#   device call: cd .snap && bash tools/next_device_call.sh   (after bash tools/gpu_snapshot.sh; carry
#   [".snap"]; about 500 s on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"
summary() { sed -n '/==== summary/,$p' "$1" | head -"$2"; }  # gpu_check.sh's closing summary of one part

# 1. H200 (the H100 A/B of 2026-12-07 15:15Z, ab_norm_l1_H100_2026-12-07T1515Z.json, read FK_NORM_L1=2
# 1 point slower on every plain forward and +5 points on LayerNorm -> FP8 at 8192; the RMSNorm forward
# miss, 0.933 against torch.compile's 0.983 at 16384 x 8192, is the H200's): the A/B of the L1 policies
# beside torch.compile, on the H200.
case "$G" in *H200*) AB_OPTIONS="-DFK_NORM_L1=2;-DFK_NORM_L1=3" AB_OPS="rms_norm_fwd,layer_norm_fwd 16384x8192,norm_fp8_fwd" \
  AB_PEERS=1 AB_ROUNDS=2 timeout 200 python3 tools/ab_nvrtc_options.py "$OUT/ab_norm_l1.json" > "$OUT/ab_norm_l1.log" 2>&1
grep SUMMARY "$OUT/ab_norm_l1.log" | tail -40;;
  *) echo "not an H200: its FK_NORM_L1 A/B ran on an H100 at 15:15Z, skipped";; esac

# 2. The occupancy of the plain forward at 8192: the shipped RMSNorm kernel (4, 8), FULL, holds 63
# registers (4 blocks of 256 threads per SM: ncu read 47 % occupancy against torch.compile's 92 %). The
# hinted kernels (min_blocks: 5 -> 45 registers, 6 -> 40) and 16 warps x 2 vectors (38; hint 4 -> 32),
# none spilling (-Xptxas=-v, NVRTC 13.0), beside torch.compile and Liger in the same rounds.
X="8192:('rows', 8, 4, 8, 5);8192:('rows', 8, 4, 8, 6);8192:('rows', 8, 2, 16, 1);8192:('rows', 8, 2, 16, 4)"
SWEEP_TUNED_ONLY=1 SWEEP_DIRS=fwd SWEEP_NS=8192 SWEEP_PEERS=1 SWEEP_ROUNDS=3 SWEEP_EXTRA="$X" \
  timeout 200 python3 tools/sweep_norms.py "$OUT/sweep_fwd8192.json" > "$OUT/sweep_fwd8192.log" 2>&1
tail -30 "$OUT/sweep_fwd8192.log"

case "$G" in *H200*) ;; *) echo "not an H200: the benchmark skipped"; exit 0;; esac
# 3. The norm benchmark with device-bound peers (the 2026-12-07 12:55Z run's forward + backward peers
# were host-bound; is RMSNorm forward + backward at 16384 x 8192 at 1.2x Liger with PDL?).
OUT=$OUT/bench STAGES=bench BUDGET=200 BENCH_ARGS="--only _norm_fwd --rounds 3" \
  bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
summary "$OUT/bench.log" 60
