#!/usr/bin/env bash
# GPU check on the H200 (device tool): tests, compute-sanitizer, JIT timing, config sweep, benchmark,
# asv. Run from the repo root; full logs go under $OUT, a short table is printed last.
#   STAGES="test,sanitize,jit,sweep,sweepab,actsweep,softsweep,cesweep,gemm,gemmsweep,gemmrepeat,fp8sweep,abflush,abunroll,abopts,abweights,bwdsmall,longrows,profile,bench,expbench,asv" bash tools/gpu_check.sh
#   (default: test,sanitize,jit,bench,asv; gemm runs the FP8 GEMM tests, sanitizer and benchmark on their
#   own; profile runs ncu over tools/profile_kernels.py)
#   EXP_OPTIONS="-DA=1;-DB=2" AB_DIRS=fwd: the sweepab stage's experiments. The expbench stage benches
#   EXP_ONLY ops built with EXP_OPTIONS, with EXP_BENCH_ARGS (e.g. "--rounds 3": this machine's noise
#   between two runs of one call reached 17 % on 2026-12-04; compare with --rounds 3 on both sides).
#   ASV_TIMEOUT (default 300 s) bounds asv run. NCU_KERNELS / NCU_COUNT / NCU_SECTIONS / PROFILE_CASES
#   steer the profile stage; GEMM_SANITIZE=0 / GEMM_BENCH=0 skip the gemm stage's memcheck / benchmark; AB_TIMEOUT (default 240 s)
#   bounds the abopts stage (GEMM cases compile for minutes: give them more). GEMMSWEEP_TIMEOUT (default
#   200 s) bounds gemmsweep (FK_SCHEDS=dp,sk doubles its rows: give it ~320; FK_SHAPES="MxKxN,..." keeps
#   some of its five shapes).
#   PYTEST_PART=1 / 2: the suite in two halves that each fit one 600 s call (the GEMM file is the gemm
#   stage's; every other test file is in one half: a new file must match one of the globs below).
#   PYTEST_ARGS="tests/test_norms.py" PYTEST_K="paths or misaligned" narrow the test stage (default: all;
#   $OUT/test_times.tsv gets a line per test as it ends, and pytest.log a per-file summary);
#   TEST_OPTIONS="-DX=1" builds its kernels with those NVRTC defines (the other stages keep the shipped ones).
#   BENCH_WINNERS=1: the bench stage runs with the sweep stage's fastest backward configs in place
#   (tools/bench_sweep_winners.py; sweep and confirmation in one call).
set -u
OUT=${OUT:-/tmp/fk_out}; mkdir -p "$OUT"
STAGES=${STAGES:-test,sanitize,jit,bench,asv}
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 FUSEDKIT_CACHE_DIR=/tmp/fkcache
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# Every stage ends inside BUDGET seconds (default 540) so the summary always prints inside a 600 s call.
deadline=$((SECONDS + ${BUDGET:-540}))
left() { local l=$((deadline - SECONDS)); [ "$l" -gt "${1:-100000}" ] && l=${1}; [ "$l" -lt 5 ] && l=5; echo "$l"; }
has() { case ",$STAGES," in *",$1,"*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m fusedkit info | tee "$OUT/info.txt"

if has jit; then
  rm -rf /tmp/fkcache_jit
  FUSEDKIT_CACHE_DIR=/tmp/fkcache_jit python3 - <<'PY' 2>&1 | tee "$OUT/jit.txt"
import time, fusedkit._jit as j
from fusedkit.backends import cuda_norms as cn
e = cn.fwd_expr(cn.fwd_config(4096, 2), "bfloat16", "bfloat16", "bfloat16", False)
t = time.perf_counter(); j.get_kernel(cn.FILE, e, 0); print(f"jit first compile+load: {(time.perf_counter()-t)*1e3:.0f} ms")
PY
  FUSEDKIT_CACHE_DIR=/tmp/fkcache_jit python3 - <<'PY' 2>&1 | tee -a "$OUT/jit.txt"
import time, fusedkit._jit as j
from fusedkit.backends import cuda_norms as cn
e = cn.fwd_expr(cn.fwd_config(4096, 2), "bfloat16", "bfloat16", "bfloat16", False)
t = time.perf_counter(); j.get_kernel(cn.FILE, e, 0); print(f"jit cached load (new process): {(time.perf_counter()-t)*1e3:.1f} ms")
PY
fi

case "${PYTEST_PART:-}" in
  1) PYTEST_ARGS="tests/test_[a-e]*.py tests/test_fp8_[a-d]*.py tests/test_fp8_[h-p]*.py tests/test_[g-k]*.py" ;;
  2) PYTEST_ARGS="tests/test_fp8_[q-z]*.py tests/test_[l-z]*.py" ;;
esac
pids=()
if has test; then
  # the forced-cluster GEMM test runs in the gemm stage, first and under its own timeout (a hang there
  # must not eat the whole test stage)
  K="not cluster_multicast${PYTEST_K:+ and ($PYTEST_K)}"
  # TEST_OPTIONS: NVRTC defines for the test stage only (an experiment's tests beside a shipped-build A/B)
  ( [ -n "${TEST_OPTIONS:-}" ] && export FUSEDKIT_NVRTC_OPTIONS="$TEST_OPTIONS"
    if [[ "${PYTEST_ARGS:-}" == *fp8_gemm* ]]; then  # its GEMM kernels compiled in parallel, not one by one
      timeout $(left 150) python3 tools/precompile_gemm.py > "$OUT/test_precompile.log" 2>&1
    fi
    FUSEDKIT_TEST_TIMES="$OUT/test_times.tsv" timeout $(left ${TEST_TIMEOUT:-420}) python3 -m pytest -q -p no:cacheprovider \
      ${PYTEST_ARGS:-tests} -k "$K" -rs --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest.log"
    # per file: tests ended, failures, seconds (survives a timeout, unlike the junit file)
    [ -f "$OUT/test_times.tsv" ] && awk -F'\t' '{split($1, p, "::"); n[p[1]]++; t[p[1]] += $4;
        if ($3 == "failed") f[p[1]]++} END {for (k in n) printf "  %-40s %6d tests %4d failed %7.1f s\n", k, n[k], f[k], t[k]}' \
        "$OUT/test_times.tsv" | sort >> "$OUT/pytest.log" ) & pids+=($!)
fi
if has sanitize; then
  # SANITIZE lists the scripts (tools/sanitize_<name>.py); each runs under memcheck, then racecheck
  ( for tool in memcheck racecheck; do
      for name in ${SANITIZE:-norms fp8 softmax cross_entropy}; do
        timeout $(left ${SANITIZE_TIMEOUT:-150}) compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 tools/sanitize_$name.py >> "$OUT/$tool.log" 2>&1
        echo "$tool $name rc=$?" >> "$OUT/$tool.log"
      done
    done ) & pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done

if has gemm; then  # the FP8 GEMM on its own (keep it out of the test stage: PYTEST_K="not gemm ...")
  # every registered GEMM kernel compiled first, in parallel (one NVRTC call each takes seconds; the tests
  # would otherwise compile ~50 of them one after the other)
  timeout $(left 150) python3 tools/precompile_gemm.py > "$OUT/gemm_precompile.log" 2>&1
  echo "gemm precompile rc=$?" >> "$OUT/gemm_precompile.log"
  # two-CTA cluster kernels first, under a short timeout: if they fail or hang, the rest skips them
  if ! timeout $(left 90) python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_gemm.py -k cluster_multicast \
      > "$OUT/gemm_cluster.log" 2>&1; then
    export GEMM_K="not cluster_multicast" FK_NO_CLUSTER=1; echo "cluster tests FAILED: skipped below" >> "$OUT/gemm_cluster.log"
  fi
  # the staged output stores likewise (FK_STORES=none: the sweep, the sanitizer and the profile leave them out)
  if ! timeout $(left 90) python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_gemm.py -k staged_stores \
      > "$OUT/gemm_staged.log" 2>&1; then
    export GEMM_K="${GEMM_K:+$GEMM_K and }not staged_stores" FK_STORES=none
    echo "staged-store tests FAILED: skipped below" >> "$OUT/gemm_staged.log"
  fi
  ( timeout $(left 300) python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_gemm.py -rs ${GEMM_K:+-k "$GEMM_K"}
    echo "gemm tests rc=$?"
    if [ "${GEMM_SANITIZE:-1}" = 1 ]; then
      # --report-api-errors no: cuda.bindings probes driver entry points that this driver lacks
      # (cuGetProcAddress_v2 "invalid argument", 34 per process on 2026-12-05); the kernels' accesses are
      # what memcheck is for, and every driver call fusedkit makes checks its own result
      timeout $(left 120) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tools/sanitize_gemm.py --small
      echo "gemm memcheck rc=$?"
    fi
    if [ "${GEMM_BENCH:-1}" = 1 ]; then
      timeout $(left 240) python3 -m fusedkit bench --only gemm --out "$OUT/results"
      echo "gemm bench rc=$?"
    fi ) > "$OUT/gemm.log" 2>&1
fi
if has profile; then  # Nsight Compute on the kernels below target (tools/profile_kernels.py)
  timeout $(left 240) ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats ${NCU_SECTIONS:-} \
    -k regex:"${NCU_KERNELS:-norm_fwd|norm_bwd|softmax_fwd|ce_fwd|fp8_ct_tile}" -c ${NCU_COUNT:-40} \
    python3 tools/profile_kernels.py ${PROFILE_CASES:-} > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?" >> "$OUT/ncu.txt"
fi
if has sweep; then timeout $(left ${SWEEP_TIMEOUT:-300}) python3 tools/sweep_norms.py "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?" >> "$OUT/sweep.log"; fi
if has sweepab; then  # A/B of compile-time experiments on the shipped norm configs: default vs each
  # ';'-separated set of NVRTC defines in EXP_OPTIONS (exp1, exp2, ...); AB_DIRS: fwd, bwd or both
  IFS=';' read -ra exps <<< "${EXP_OPTIONS:-}"
  n=0
  for opts in "" "${exps[@]}"; do
    ab=base; [ $n -gt 0 ] && ab=exp$n; n=$((n + 1))
    SWEEP_TUNED_ONLY=1 SWEEP_DIRS=${AB_DIRS:-fwd,bwd} FUSEDKIT_NVRTC_OPTIONS="$opts" FUSEDKIT_CACHE_DIR=/tmp/fkcache_$ab timeout $(left 120) \
      python3 tools/sweep_norms.py "$OUT/sweep_ab_$ab.json" > "$OUT/sweep_ab_$ab.log" 2>&1
    echo "sweepab $ab [$opts] rc=$?" >> "$OUT/sweep_ab_$ab.log"
  done
fi
if has softsweep; then timeout $(left 200) python3 tools/sweep_softmax.py "$OUT/sweep_softmax.json" > "$OUT/sweep_softmax.log" 2>&1; echo "softsweep rc=$?" >> "$OUT/sweep_softmax.log"; fi
if has cesweep; then timeout $(left 200) python3 tools/sweep_cross_entropy.py "$OUT/sweep_ce.json" > "$OUT/sweep_ce.log" 2>&1; echo "cesweep rc=$?" >> "$OUT/sweep_ce.log"; fi
if has gemmsweep; then timeout $(left ${GEMMSWEEP_TIMEOUT:-200}) python3 tools/sweep_gemm.py "$OUT/sweep_gemm.json" > "$OUT/sweep_gemm.log" 2>&1; echo "gemmsweep rc=$?" >> "$OUT/sweep_gemm.log"; fi
if has gemmrepeat; then  # run-to-run spread of the FP8 GEMM vs cuBLASLt, with the SM clock / power logged beside it
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$OUT/smi_gemm.csv" 2>&1 &
  smi=$!
  timeout $(left 240) python3 tools/gemm_repeat.py "$OUT/sweep_gemm_repeat.json" > "$OUT/gemm_repeat.log" 2>&1; echo "gemmrepeat rc=$?" >> "$OUT/gemm_repeat.log"
  kill $smi 2>/dev/null
fi
if has fp8sweep; then timeout $(left 200) python3 tools/sweep_fp8_grid.py "$OUT/sweep_fp8_grid.json" > "$OUT/sweep_fp8_grid.log" 2>&1; echo "fp8sweep rc=$?" >> "$OUT/sweep_fp8_grid.log"; fi
if has abunroll; then  # the FP8 casts' walks (quantize, dequantize, block-scaled), interleaved rounds (tools/ab_unroll.py;
  # AB_UNROLL_OPS=op,op keeps some of its ops)
  timeout $(left 240) python3 tools/ab_unroll.py "$OUT/ab_unroll.json" --rounds 3 ${AB_UNROLL_OPS:+--ops "$AB_UNROLL_OPS"} > "$OUT/ab_unroll.log" 2>&1; echo "abunroll rc=$?" >> "$OUT/ab_unroll.log"
fi
if has longrows; then  # the long-row kernels: ring depths of the staged kernels (tools/ab_staged_ring.py),
  # time against rows walked (tools/probe_staged_rows.py), copy bandwidth against SMs (tools/probe_sm_copy.py)
  for t in ab_staged_ring probe_staged_rows probe_sm_copy; do
    timeout $(left 120) python3 tools/$t.py "$OUT/$t.json" > "$OUT/$t.log" 2>&1; echo "$t rc=$?" >> "$OUT/$t.log"
  done
fi
if has abflush; then  # the share of the ratios the benchmark's dirty-L2 flush takes (tools/ab_flush.py)
  timeout $(left 200) python3 tools/ab_flush.py "$OUT/ab_flush.json" > "$OUT/ab_flush.log" 2>&1; echo "abflush rc=$?" >> "$OUT/ab_flush.log"
fi
if has abopts; then  # compile-time experiments A/B in one process: AB_OPTIONS, AB_OPS (tools/ab_nvrtc_options.py)
  if [[ "${AB_OPS:-}" == *gemm* ]]; then  # the GEMM kernels of every variant, compiled in parallel first
    IFS=';' read -ra vs <<< ";${AB_OPTIONS:-}"
    for v in "${vs[@]}"; do
      for st in ", 1, 1>" ", 1, 2>"; do
        FUSEDKIT_NVRTC_OPTIONS="${v%%@*}" timeout $(left 120) python3 tools/precompile_gemm.py --no-sk "E4M3, fk::E4M3" "$st" \
          >> "$OUT/ab_precompile.log" 2>&1
      done
    done
  fi
  timeout $(left ${AB_TIMEOUT:-240}) python3 tools/ab_nvrtc_options.py "$OUT/ab_nvrtc_options.json" > "$OUT/ab_nvrtc_options.log" 2>&1; echo "abopts rc=$?" >> "$OUT/ab_nvrtc_options.log"
fi
if has abweights; then  # FP8-output norms with bf16 against fp32 weights (tools/ab_norm_fp8_weights.py)
  timeout $(left 150) python3 tools/ab_norm_fp8_weights.py "$OUT/ab_norm_fp8_weights.json" > "$OUT/ab_norm_fp8_weights.log" 2>&1; echo "abweights rc=$?" >> "$OUT/ab_norm_fp8_weights.log"
fi
if has bwdsmall; then timeout $(left 200) python3 tools/sweep_norm_bwd_small.py "$OUT/sweep_norm_bwd_small.json" > "$OUT/sweep_norm_bwd_small.log" 2>&1; echo "bwdsmall rc=$?" >> "$OUT/sweep_norm_bwd_small.log"; fi
if has actsweep; then timeout $(left 150) python3 tools/sweep_activations.py "$OUT/sweep_act.json" > "$OUT/sweep_act.log" 2>&1; echo "actsweep rc=$?" >> "$OUT/sweep_act.log"; fi
if has bench; then
  # the SM clock and power beside the benchmark: a slow spell of the card (runs 160711Z, 1834Z) shows here
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 200 \
    > "$OUT/smi_bench.csv" 2>&1 &
  smi=$!
  # BENCH_WINNERS=1: the sweep stage's fastest backward configs in place (tools/bench_sweep_winners.py)
  bench_cmd=(python3 -m fusedkit bench); [ -n "${BENCH_WINNERS:-}" ] && bench_cmd=(python3 tools/bench_sweep_winners.py "$OUT/sweep.json")
  timeout $(left 420) "${bench_cmd[@]}" ${BENCH_ARGS:-} --out "$OUT/results" > "$OUT/bench.log" 2>&1; echo "bench rc=$?" >> "$OUT/bench.log"
  kill $smi 2>/dev/null
fi
if has expbench; then  # A/B of a compile-time experiment: EXP_OPTIONS (NVRTC defines) on EXP_ONLY ops
  FUSEDKIT_NVRTC_OPTIONS="${EXP_OPTIONS:--DFK_FAST_EXP=0}" FUSEDKIT_CACHE_DIR=/tmp/fkcache_exp \
    timeout $(left 300) python3 -m fusedkit bench --only "${EXP_ONLY:-softmax,cross_entropy}" ${EXP_BENCH_ARGS:-} \
      --out "$OUT/results" \
    > "$OUT/expbench.log" 2>&1; echo "expbench rc=$?" >> "$OUT/expbench.log"
fi
if has asv; then
  # The device copy has no .git: rebuild main's history from the carried bundle (tools/gpu_bundle.sh)
  # so asv files the results under the real commit; the benchmarks run on the working tree.
  ( if [ ! -d .git ]; then
      git init -q && if [ -f .gitbundle/main.bundle ]; then git fetch -q .gitbundle/main.bundle main:main && git symbolic-ref HEAD refs/heads/main && git reset -q;
      else git add -A && git -c user.email=ci@fusedkit -c user.name=ci commit -qm snapshot; fi
    fi
    # one asv machine per card kind, so an H100 run never lands in the H200 history
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
      *H200*) machine=h200 ;; *H100*) machine=h100 ;; *) machine=gpu ;;
    esac
    cd asv_bench && python3 -m asv machine --yes --machine $machine > "$OUT/asv.log" 2>&1
    timeout $(left ${ASV_TIMEOUT:-300}) python3 -m asv run --python=same --machine $machine --set-commit-hash=$(git rev-parse HEAD) --show-stderr >> "$OUT/asv.log" 2>&1
    echo "asv run rc=$?" >> "$OUT/asv.log"; python3 -m asv publish >> "$OUT/asv.log" 2>&1; echo "asv publish rc=$?" >> "$OUT/asv.log"
    tar czf "$OUT/asv_results.tgz" results html 2>/dev/null )
fi

# at most 8 files come back: logs in one archive, the results JSON and chart at the top
( cd "$OUT" && mv results/*.json results/*.png . 2>/dev/null; rmdir results 2>/dev/null
  tar czf logs.tgz --remove-files $(ls *.log *.xml *.txt *.csv sweep*.json 2>/dev/null) 2>/dev/null; rm -rf /tmp/fk_logs; mkdir -p /tmp/fk_logs; tar xzf logs.tgz -C /tmp/fk_logs )
echo "================ summary ================"
L=/tmp/fk_logs
cat "$L/jit.txt" 2>/dev/null
tail -n 3 "$L/pytest.log" 2>/dev/null; grep -E "^(FAILED|ERROR)" "$L/pytest.log" 2>/dev/null | head -20
for t in memcheck racecheck; do grep -E "ERROR SUMMARY|rc=|MISMATCH" "$L/$t.log" 2>/dev/null | tail -12; done
grep BEST "$L/sweep.log" 2>/dev/null; tail -n 2 "$L/sweep.log" 2>/dev/null
for f in "$L"/sweep_ab_*.log; do [ -f "$f" ] && grep -E "^N=|rc=" "$f" | sed "s/^/$(basename "$f" .log | sed s/sweep_ab_//) /"; done
grep -E "BEST|rc=" "$L/sweep_act.log" "$L/sweep_softmax.log" "$L/sweep_ce.log" "$L/sweep_gemm.log" "$L/sweep_fp8_grid.log" 2>/dev/null
cat "$L/sweep_norm_bwd_small.log" 2>/dev/null | tail -n 110
grep -E "rc=" "$L/asv.log" 2>/dev/null
grep -E "SUMMARY|rc=" "$L/gemm_repeat.log" 2>/dev/null
grep -E "SUMMARY|rc=" "$L/ab_flush.log" 2>/dev/null
grep -hE "rounds|per step|SMs|rc=" "$L/ab_staged_ring.log" "$L/probe_staged_rows.log" "$L/probe_sm_copy.log" 2>/dev/null
grep -E "of copy|rc=|Error" "$L/ab_unroll.log" 2>/dev/null
grep -E "SUMMARY|rc=|Error" "$L/ab_nvrtc_options.log" 2>/dev/null
grep -E "SUMMARY|rc=|Error" "$L/ab_norm_fp8_weights.log" 2>/dev/null
tail -n 2 "$L/gemm_cluster.log" 2>/dev/null
grep -E "passed|failed|rc=|TFLOP" "$L/gemm.log" 2>/dev/null | tail -20
# ncu: one line per kernel launch: name, duration, DRAM throughput, achieved occupancy, registers
[ -f "$L/ncu.txt" ] && awk 'function out() { if (k != "") printf "%-58.58s dur %-12s dram%% %-6s sm%% %-6s ipc/sched %-5s occ%% %-6s regs %s\n", k, d, t, c, i, o, r }
  /^  [a-zA-Z_].*\(.*Context/ { out(); k = $0; sub(/^ +(void )?/, "", k); sub(/\(.*/, "", k); gsub(/fk::| /, "", k); d = t = o = r = c = i = "" }
  /^ +Duration / { d = $NF " " $(NF-1) } /^ +DRAM Throughput/ { t = $NF } /^ +Achieved Occupancy/ { o = $NF }
  /^ +Registers Per Thread/ { r = $NF } /^ +Compute \(SM\) Throughput/ { c = $NF } /^ +Issued Warp Per Scheduler/ { i = $NF }
  END { out() }' "$L/ncu.txt"
grep -E "rc=" "$L/ncu.txt" 2>/dev/null
grep -E "fusedkit |rc=" "$L/expbench.log" 2>/dev/null | head -40
cat "$L/bench.log" 2>/dev/null | grep -v "^\s*$" | tail -n 80
# SM clock (MHz) and power (W) over the benchmark: min / median / max of the 200 ms samples
if [ -s "$L/smi_bench.csv" ]; then python3 - "$L/smi_bench.csv" <<'PY'
import statistics, sys
rows = [r.split(",") for r in open(sys.argv[1]) if r.count(",") >= 3]
rows = [(float(r[1]), float(r[2])) for r in rows if r[1].strip().replace(".", "").isdigit()]
if rows:
    c, p = [r[0] for r in rows], [r[1] for r in rows]
    print(f"bench SM clock MHz min {min(c):.0f} median {statistics.median(c):.0f} max {max(c):.0f}; "
          f"power W min {min(p):.0f} median {statistics.median(p):.0f} max {max(p):.0f} ({len(rows)} samples)")
PY
fi
