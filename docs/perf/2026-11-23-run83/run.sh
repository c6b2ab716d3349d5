#!/usr/bin/env bash
# Runs of 2026-11-23, ninth session (bash run.sh <parts>): the decode split kernel launched
# early (DecodePlan.early) against plainly, in the whole-step graph (early: exp_early_step.py,
# EARLY_ARGS); where a synced graph replay loses time (launch: exp_launch.py); the MLA CUDA
# tests only (mlatests, MLA_K); Nsight Compute on the split kernel alone (ncu: ncu_split.py,
# NCU_ARGS). The keys-along-M kernel of runs 91-92 is keys_m.patch (not in the package).
# Earlier drivers' parts: timeline (run68's exp_timeline.py, TL_ARGS), bstep, bmoe, tests, step,
# prefill, capture, generate.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
HERE=docs/perf/2026-11-23-run83
for part in ${*:-early}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    early) timeout 400 python3 $HERE/exp_early_step.py ${EARLY_ARGS:-} > "$OUT/early.log" 2>&1
           grep -v Warning "$OUT/early.log" | grep -v "^  " ;;
    launch) timeout 300 python3 $HERE/exp_launch.py ${LAUNCH_ARGS:-} > "$OUT/launch.log" 2>&1
            grep -v Warning "$OUT/launch.log" | grep -v "^  " ;;
    ncu) PYTHONPATH=.:tests:/tmp/site timeout 300 ncu --clock-control none \
           --kernel-name regex:split_kernel --launch-skip 3 --launch-count 1 \
           --section SpeedOfLight --section Occupancy --section LaunchStats \
           --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
           python3 $HERE/ncu_split.py ${NCU_ARGS:-} > "$OUT/ncu.log" 2>&1
         grep -v "^==PROF==" "$OUT/ncu.log" | grep -vi warning | head -150 ;;
    mlatests) (cd baseline2 && timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider \
                 tests/test_kernels_mla_cuda.py tests/test_capture_cuda.py ${MLA_K:-} \
                 > "$OUT/mla_tests.log" 2>&1)
              grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/mla_tests.log" | tail -15 ;;
    *) OUT=$OUT bash docs/perf/2026-11-23-run68/run.sh $part 2>&1 | grep -v "^===" ;;
  esac
done
