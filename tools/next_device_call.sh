#!/usr/bin/env bash
# The next device call, kept current by each session: what is waiting for a GPU, in priority order
# (docs/perf_notes.rst, the latest session's section, says why each part is there). Every part writes
# under its own folder of $OUT and prints a summary; a call cut short still returns what finished.
#   device call: cd .snap && bash tools/next_device_call.sh   (after bash tools/gpu_snapshot.sh; carry
#   [".snap"]; run order 0, 0b, 2, 1, 0c, about 450 s on an H200 without 0c, which takes what is left of 560 s;
#   NEXT_OCC=0 / NEXT_AB=0 skip parts 1 / 2, NEXT_TESTS=1 runs 0c, NEXT_BENCH=1 part 3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=.
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$G"
summary() { sed -n '/==== summary/,$p' "$1" | head -"$2"; }  # gpu_check.sh's closing summary of one part

# Every part below has run on an H100 (the norm parts at 15:15Z / 16:00Z, part 0 at 19:00Z and with the
# stagger at 23:48Z) except part 2's FK_NORM_L1=4: stop there (NEXT_ANY_GPU=1 runs it anyway)
case "$G" in
  *H200*) ;;
  *) [ "${NEXT_ANY_GPU:-0}" = 1 ] || { echo "not an H200: nothing new to run here"; exit 0; } ;;
esac

# 0. Softmax forwards with one exponential per element (FK_SOFTMAX_ONE_EXP=3, cuda/softmax.cu): its A/B
# beside the shipped build. The register forwards at 1024-16384 (those of at most 32 elements a thread
# take it); 512 x 262144 at the shipped staged config (8, 16, 8: 113 registers with it, one CTA an SM)
# and at 32-element configs (4, 16, 16: 60-62 registers, two CTAs an SM; 4, 32, 8: one 1024-thread CTA;
# each also with a ring of 2); 2048 x 65536 shipped (64 elements a thread: unchanged) beside a cluster
# of 2 x 1024 threads x 32 elements and a staged 4 x 512 (ring of 1 and 2); the backward as a control.
# SASS (NVRTC 13.0), staged (8, 16, 8): 1384 -> 1200 instructions, MUFU.EX2 131 -> 68. The H100 A/B
# (ab_one_exp_H100_2026-12-07T1900Z.json): shipped config 0.921 -> 0.922, 32-element configs +0.6 to
# +1.3 points (still below the shipped config), 65536 cluster +1.0; the short rows tie. The softmax
# tests and compute-sanitizer built with it passed there (gpu_tests_one_exp3_H100_2026-12-07T1901Z.txt);
# NEXT_TESTS=1 runs them again here. Beside it, FK_SOFTMAX_FULL=1 (the register forwards' bounds tests
# compiled out where N fills the config; never timed on an H200) and torch.compile / Liger (AB_PEERS).
# And FK_SOFTMAX_STAGGER (cuda/softmax.cu): the staged forward's odd clusters start 4000 / 8000 cycles
# late (a row step is about 16,600 cycles on the H200), so co-resident CTAs leave lockstep (at 262144 only).
# H100, 23:48Z (ab_stagger_one_exp_H100_2026-12-07T2348Z.json): 4000 ties, 8000 loses 0.3-1.3 points at
# every config; one-exp there 0.908 -> 0.917 at the shipped config.
C="262144:staged,8,4,16,16;262144:staged,8,4,32,8;262144:staged,8,4,16,16,2;262144:staged,8,4,32,8,2"
C="$C;65536:cluster,8,4,32,2;65536:staged,8,4,16,4;65536:staged,8,4,16,4,2"
C="$C;262144:cluster,8,8,8,16"  # the non-persistent cluster kernel: 0.920 on the H100 (12-06), never on an H200
F="-DFK_SOFTMAX_FULL=1 @ 131072x1024,32768x4096,16384x8192,8192x16384"  # the register forwards' FULL
S="-DFK_SOFTMAX_STAGGER=4000 @ 262144;-DFK_SOFTMAX_STAGGER=8000 @ 262144"  # odd clusters start late
AB_OPTIONS="-DFK_SOFTMAX_ONE_EXP=3;$S;$F" AB_OPS=softmax_fwd,long_softmax AB_SOFTMAX_CFGS="$C" AB_PEERS=1 \
  AB_NUMERICS=1 AB_ROUNDS=3 timeout 200 python3 tools/ab_nvrtc_options.py "$OUT/ab_one_exp.json" \
  > "$OUT/ab_one_exp.log" 2>&1
grep -E "SUMMARY|differ" "$OUT/ab_one_exp.log" | tail -40
# 0b. Fill / drain and the tail of 512 rows on G clusters, on the H200 (the H100's: 7.9 us fixed, 11.0 us a
# step; 512 rows on 30 clusters are 18 steps where 17.07 would do). Shipped build; beside it the ring
# (4, 32 warps, 8 CTAs, 2 buffers), the H200's best staged config (0.864). (Clusters of 4 x 1024 threads,
# (8, 8, 32, 4), were dropped after the H100 run of 23:48Z: 30 resident clusters there, not 32-33, 0.910
# against the shipped 0.908.)
PROBE_FWD_CONFIGS="8,4,32,8,2" timeout 100 python3 tools/probe_staged_rows.py \
  "$OUT/probe_staged_rows.json" > "$OUT/probe_staged_rows.log" 2>&1
grep -E "per step|rc=|Error" "$OUT/probe_staged_rows.log" | head -12

# 2. The L1 policies of the norm forwards (FK_NORM_L1, cuda/norms.cu) beside torch.compile: the H100 A/B
# of 2026-12-07 15:15Z (ab_norm_l1_H100_2026-12-07T1515Z.json) read bit 2 one point slower on every
# plain forward and 5 points faster on LayerNorm -> FP8 at 8192 (the case that decides; its premise,
# missing weight loads, was refuted by the H100 ncu of 16:50Z: see cuda/norms.cu). Bit 3 (=4): bit 2 in the
# prefetching FP8 forwards alone (same SASS as =2 there), so the plain forwards keep their point; bit 1
# (nothing on the H100) left out.
[ "${NEXT_AB:-1}" = 1 ] && {  # NEXT_AB=0 skips this part
AB_OPTIONS="-DFK_NORM_L1=2;-DFK_NORM_L1=4" \
  AB_OPS="rms_norm_fwd,layer_norm_fwd 16384x8192,norm_fp8_fwd" AB_PEERS=1 AB_ROUNDS=2 \
  timeout 130 python3 tools/ab_nvrtc_options.py "$OUT/ab_norm_l1.json" > "$OUT/ab_norm_l1.log" 2>&1
grep SUMMARY "$OUT/ab_norm_l1.log" | tail -40
}

# 1. The plain forwards' occupancy at 4096 and 16384 (RMSNorm reads 0.99x the best peer there on the
# H200; 8192 is settled: the 12:56Z H200 sweep read (2, 16, 4), 32 registers at full occupancy, 0.940
# against the shipped 0.935 and torch.compile's 0.985). On the H100 every candidate below read within
# 0.5 points of the shipped kernel (sweep_fwd_occupancy_H100_2026-12-07T1600Z.json). The shipped RMSNorm
# kernels hold 38 registers (4096: (2, 8), 6 blocks of 256 threads per SM) and 63 (16384: (4, 16), 2
# blocks of 512). Candidates with an occupancy hint (fifth field) or half the vectors per thread on
# twice the warps, none spilling (-Xptxas=-v, NVRTC 13.0): 4096 (2, 8, 8) 32 registers, (1, 16, 4) 32;
# 16384 (4, 16, 3) 40, (2, 32, 2) 32. Beside torch.compile and Liger, 3 rounds.
[ "${NEXT_OCC:-1}" = 1 ] && {  # NEXT_OCC=0 skips this part
X="4096:('rows', 8, 2, 8, 8);4096:('rows', 8, 1, 16, 4);16384:('rows', 8, 4, 16, 3);16384:('rows', 8, 2, 32, 2)"
SWEEP_TUNED_ONLY=1 SWEEP_DIRS=fwd SWEEP_NS=4096,16384 SWEEP_PEERS=1 SWEEP_ROUNDS=3 SWEEP_EXTRA="$X" \
  timeout 150 python3 tools/sweep_norms.py "$OUT/sweep_fwd_occupancy.json" > "$OUT/sweep_fwd_occupancy.log" 2>&1
python3 - "$OUT/sweep_fwd_occupancy.json" <<'PY'
import collections, json, statistics, sys
d = json.load(open(sys.argv[1]))
t = collections.defaultdict(list)
for r in d["results"]:
    t[(r["N"], "rms" if r["rms"] else "ln", str(r["cfg"]), r["regs"])].append(r["of_copy"])
for (n, op, cfg, regs), v in sorted(t.items()):
    rounds = " ".join(f"{x:.3f}" for x in v)
    print(f"OCC {op:3s} {n:6d} {cfg:34s} regs={regs} median {statistics.median(v):.3f} rounds {rounds}")
PY
}

# 0c. The softmax GPU tests built with FK_SOFTMAX_ONE_EXP=3 (NEXT_TESTS=1; last: they need only be run
# again where part 0 makes the case for adopting it), in what is left of a 590 s call.
END=${NEXT_END:-560}  # seconds into the call by which 0c must end (the call's timeout less a margin)
if [ "${NEXT_TESTS:-0}" = 1 ] && [ $((END - SECONDS)) -gt 60 ]; then
  OUT=$OUT/one_exp_tests STAGES=test BUDGET=$((END - 10 - SECONDS)) TEST_OPTIONS="-DFK_SOFTMAX_ONE_EXP=3" \
    PYTEST_ARGS="tests/test_softmax.py" PYTEST_K="not numpy and not torch_cpu" \
    timeout $((END - SECONDS)) bash tools/gpu_check.sh > "$OUT/one_exp_tests.log" 2>&1
  summary "$OUT/one_exp_tests.log" 12
fi

# 3. The norm benchmark with device-bound peers (the 2026-12-07 12:55Z run's forward + backward peers
# were host-bound; is RMSNorm forward + backward at 16384 x 8192 at 1.2x Liger with PDL?).
[ "${NEXT_BENCH:-0}" = 1 ] || exit 0
OUT=$OUT/bench STAGES=bench BUDGET=100 BENCH_ARGS="--only _norm_fwd --rounds 3" \
  timeout 110 bash tools/gpu_check.sh > "$OUT/bench.log" 2>&1
summary "$OUT/bench.log" 60
