#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order
# (docs/perf_notes.rst, the latest session's section, says why each part is there). Every part writes
# under its own folder of $OUT and prints a summary; a call cut short still returns what finished.
#   device call: cd .snap && bash tools/next_device_call.sh [more]   (after bash tools/gpu_snapshot.sh;
#   carry [".snap"]). Without "more": on an H100 the two-pass forward's GPU test and sweep (about 250 s);
#   on an H200 the benchmark and the two-pass sweep (about 550 s). "more" (the second H200 call): the
#   two-pass GPU test, the PDL A/B, the ring A/B, ncu of RMSNorm 8192 and the FP8 norms' grid sweep.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"
MODE=${1:-first}
summary() { sed -n '/==== summary/,$p' "$1" | head -"$2"; }  # gpu_check.sh's closing summary of one part

# The two-pass norm forward (norm_fwd_looped with 256-1024 threads, the row re-read from L1 / L2: the
# shape of torch.compile's RMSNorm forward, which reads 0.978 of copy at 16384 x 8192 on the H200 against
# our register kernel's 0.935): its GPU test, and RMSNorm's forward at 4096 / 8192 / 16384 with the
# shipped config, the two-pass candidates, the full-occupancy register config (2, 16, 4) and the
# benchmark's torch.compile / Liger / public fusedkit call in the same two rounds.
twopass_test() {
  OUT=$OUT/twopass_test STAGES=test BUDGET=${1:-150} PYTEST_ARGS=tests/test_norms.py \
    PYTEST_K="two_pass or registered or forced_config" bash tools/gpu_check.sh > "$OUT/twopass_test.log" 2>&1
  summary "$OUT/twopass_test.log" 8
}
twopass_sweep() {
  OUT=$OUT/twopass STAGES=sweep BUDGET=${1:-220} SWEEP_TIMEOUT=${1:-220} SWEEP_DIRS=fwd SWEEP_NS=8192,4096,16384 \
    SWEEP_OPS=rms SWEEP_TUNED_ONLY=1 SWEEP_LOOPED=1 SWEEP_PEERS=1 SWEEP_ROUNDS=2 \
    SWEEP_EXTRA="8192:('rows', 8, 2, 16, 4)" bash tools/gpu_check.sh > "$OUT/twopass.log" 2>&1
  grep -hE "^N=|BEST" /tmp/fk_logs/sweep.log 2>/dev/null | tail -40
}

case "$G" in
  *H200*) ;;
  *) twopass_test 100; twopass_sweep 200; echo "not an H200: the H200 parts skipped"; exit 0;;
esac

if [ "$MODE" != more ]; then
  # H200, first call: the benchmark of the norms, cross-entropy and current-scaling quantize (the README
  # rows; programmatic dependent launches and ce_grad_scale since the last H200 run: does RMSNorm
  # forward + backward at 16384 x 8192 reach 1.2x Liger, cross-entropy 0.85 at 131072?), then the
  # two-pass sweep.
  OUT=$OUT/bench STAGES=bench BUDGET=330 BENCH_ARGS="--only _norm_fwd,cross_entropy,fp8_quantize_current --rounds 3" \
    bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
  summary "$OUT/bench.log" 60
  twopass_sweep 220
  exit 0
fi

# H200, second call: the two-pass GPU test; the PDL A/B on this card; the staged kernels' ring depths;
# Nsight Compute of RMSNorm 16384 x 8192 against torch.compile; the FP8 norms' grid sweep (LayerNorm ->
# FP8 at 8192: the cards disagree).
twopass_test 90
mkdir -p "$OUT/ab"
AB_ROUNDS=2 timeout 90 python3 tools/ab_pdl.py "$OUT/ab/ab_pdl.json" > "$OUT/ab/ab_pdl.log" 2>&1
tail -17 "$OUT/ab/ab_pdl.log"
AB_CASES=softmax_fwd,softmax_bwd,ce_131072,ce_262144 AB_ROUNDS=2 timeout 120 \
  python3 tools/ab_staged_ring.py "$OUT/ab/ab_staged_ring.json" > "$OUT/ab/ab_staged_ring.log" 2>&1
grep rounds "$OUT/ab/ab_staged_ring.log"
OUT=$OUT/ncu STAGES=profile PROFILE_CASES=rms8192 NCU_KERNELS="norm_fwd|triton" NCU_COUNT=4 BUDGET=100 \
  bash tools/gpu_check.sh > "$OUT/ncu.log" 2>&1
summary "$OUT/ncu.log" 20
OUT=$OUT/fp8 STAGES=fp8sweep BUDGET=100 bash tools/gpu_check.sh > "$OUT/fp8.log" 2>&1
summary "$OUT/fp8.log" 20
