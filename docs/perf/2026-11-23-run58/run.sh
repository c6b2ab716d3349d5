#!/usr/bin/env bash
# Runs of 2026-11-23, seventh session (bash run.sh <parts>): where the eager prefill step's
# host time goes (sync: exp_eager_sync.py; pyspy: exp_eager_loop.py under py-spy --native,
# summarised by pyspy_summary.py); prefill eager against piecewise at bucket sizes
# and just past them, where piecewise pads (prefill: PREFILL_T, PREFILL_ORDER, run47's part);
# CUDA tests of the committed tree (tests: run52's part, baseline2/ = `git archive HEAD`);
# the decode step, full graphs (step: run40's part, STEP_ORDER); capture time and graph pool of
# `full_and_piecewise` at the default buckets, trees in turn (capture: CAPTURE_ORDER; new = this
# tree, base = baseline/, the session's start); end-to-end `generate`, 128 requests of 512 + 256
# tokens, trees in turn (generate: GEN_ORDER).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
HERE=docs/perf/2026-11-23-run58
for part in ${*:-sync}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    sync) timeout 300 python3 $HERE/exp_eager_sync.py > "$OUT/eager_sync.log" 2>&1
          grep -E "^#|Error" "$OUT/eager_sync.log"
          grep -A40 "^# profiled" "$OUT/eager_sync.log" | tail -38 | cut -c1-170 ;;
    prefill) OUT=$OUT bash docs/perf/2026-11-23-run47/run.sh prefill 2>&1 | grep -v "^===" ;;
    pyspy) timeout 170 /tmp/site/bin/py-spy record --native --format raw --rate 40 \
             -o "$OUT/pyspy_raw.txt" -- python3 $HERE/exp_eager_loop.py > "$OUT/pyspy.log" 2>&1
           tail -3 "$OUT/pyspy.log"
           python3 $HERE/pyspy_summary.py "$OUT/pyspy_raw.txt" > "$OUT/pyspy_summary.txt" 2>&1
           head -95 "$OUT/pyspy_summary.txt" ;;
    generate) for v in ${GEN_ORDER:-new base}; do  # end-to-end generate, trees in turn
                d=.; [ $v = base ] && d=baseline
                (cd $d && PYTHONPATH=.:/tmp/site timeout 280 python3 -m scripts.bench step \
                   --parts generate --out "/tmp/gen_$v" > "$OUT/generate_$v.log" 2>&1)
                echo "--- $v"; grep -A3 "## generate" "$OUT/generate_$v.log" | tail -2
              done ;;
    tests) OUT=$OUT bash docs/perf/2026-11-23-run52/run.sh tests 2>&1 | grep -v "^===" ;;
    step) OUT=$OUT bash docs/perf/2026-11-23-run40/run.sh step 2>&1 | grep -v "^===" ;;
    capture) for v in ${CAPTURE_ORDER:-new base}; do
               d=.; [ $v = base ] && d=baseline
               (cd $d && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.bench_capture \
                  --batches 1,32 --prefill 1024 > "$OUT/capture_$v.log" 2>&1)
               echo "--- $v"; grep -A3 "## capture" "$OUT/capture_$v.log" | tail -2
             done ;;
  esac
done
