#!/bin/bash
# The eighteenth session's GPU driver: bash docs/perf/2026-11-24-run90/run.sh <parts>, logs
# under $OUT:  levels: exp_levels.py (LV_ARGS);  the project's own commands as in
# docs/perf/2026-11-24-run83/run.sh otherwise (tests, step, moe, mlatests, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    levels) timeout 580 python3 docs/perf/2026-11-24-run90/exp_levels.py $LV_ARGS 2>&1 \
              | grep -v -i warn ;;
    plan) timeout 580 python3 docs/perf/2026-11-24-run90/exp_plan.py $PL_ARGS 2>&1 \
            | grep -v -i warn ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run83/run.sh $part | grep -v "^Name\|^NVIDIA" ;;
  esac
done
