#!/usr/bin/env bash
# Runs of 2026-11-23, sixth session (bash run.sh <parts>): CUDA tests of the committed tree
# (tests: baseline2/ = `git archive HEAD`, so that uncommitted work does not travel into
# them); the half-tile MoE patch (halves: applied to a copy of baseline2/, its GPU test, then
# ../2026-11-23-run47/exp_halves.py); prefill eager against piecewise, trees alternating
# (prefill: run47's part; new = this tree, base = baseline/ = 38e141b, this session's start);
# the MoE layer benchmark, new and base (moe: MOE_ORDER, MOE_T); the decode step, full
# graphs, context 1024 (step: run40's part, STEP_ORDER).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
ROOT=$(pwd)
for part in ${*:-tests}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) (cd baseline2 && timeout 420 python3 -m pytest -q -m cuda -p no:cacheprovider \
              tests > "$OUT/cuda_tests.log" 2>&1)
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    halves) rm -rf /tmp/halves && cp -r baseline2 /tmp/halves
            (cd /tmp/halves && patch -p1 -s < docs/perf/2026-11-23-run47/halves.patch \
             && timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
                -k halves > "$OUT/halves_test.log" 2>&1; tail -3 "$OUT/halves_test.log"
             timeout 300 python3 docs/perf/2026-11-23-run47/exp_halves.py \
                > "$OUT/halves.log" 2>&1; grep -E "^#|Error" "$OUT/halves.log") ;;
    prefill) OUT=$OUT bash docs/perf/2026-11-23-run47/run.sh prefill 2>&1 | grep -v "^===" ;;
    moe) for v in ${MOE_ORDER:-new base}; do  # the MoE layer benchmark, trees in turn
           d=.; [ $v = base ] && d=baseline
           (cd $d && PYTHONPATH=.:/tmp/site timeout 240 python3 -m scripts.bench moe \
              --tokens ${MOE_T:-4096 8192} --out "/tmp/moe_$v" > "$OUT/moe_$v.log" 2>&1)
           echo "--- $v"; grep -E "^[0-9]+ +\| fused  " "$OUT/moe_$v.log"
         done ;;
    step) OUT=$OUT bash docs/perf/2026-11-23-run40/run.sh step 2>&1 | grep -v "^===" ;;
  esac
done
