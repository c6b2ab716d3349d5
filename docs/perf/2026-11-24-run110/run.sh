#!/bin/bash
# The twenty-first session's GPU driver: bash docs/perf/2026-11-24-run110/run.sh <parts>, logs
# under $OUT:  gen: exp_gen.py (GE_ARGS);  step512: `bench step` decode at ctx 512 (the
# issue's anchor context; STEP_ARGS);  hostprof: exp_hostprof.py (HP_ARGS);
#   ops: exp_ops.py (OP_ARGS);  direct: exp_direct.py (DR_ARGS);  otherwise the earlier sessions' parts
# (docs/perf/2026-11-24-run104/run.sh: tests, step, moe, dispatch, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run110
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    gen) timeout 580 python3 $D/exp_gen.py $GE_ARGS 2>&1 | grep -v -i warn \
           | tee "$OUT/gen.log" ;;
    hostprof) timeout 580 python3 $D/exp_hostprof.py $HP_ARGS 2>&1 | grep -v -i warn \
                | tee "$OUT/hostprof.log" ;;
    ops) timeout 580 python3 $D/exp_ops.py $OP_ARGS 2>&1 | grep -v -i warn \
           | tee "$OUT/ops.log" ;;
    direct) timeout 580 python3 $D/exp_direct.py $DR_ARGS 2>&1 | grep -v -i warn \
              | tee "$OUT/direct.log" ;;
    step512) timeout 580 python3 -m scripts.bench step --parts decode \
               --contexts 512 ${STEP_ARGS:---batches 1 32 128} --out "$OUT/step512" \
               > "$OUT/step512.log" 2>&1
             grep -v -i warn "$OUT/step512.log" | grep -v "^{" | tail -30 ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run104/run.sh $part ;;
  esac
done
