#!/bin/bash
# The nineteenth session's GPU driver (run 102): exp_ws.py, one process a variant so that a
# warp-specialised launch that never ends is cut off by its timeout, not the whole run.
export PYTHONUNBUFFERED=1 PYTHONPATH=.:docs/perf/2026-11-24-run102
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in ${WS_VARIANTS:-"plain4 plain3 cublas" ws4 ws3}; do
  echo "=== $v $(date -u +%H:%M:%S)"
  timeout ${WS_TIMEOUT:-90} python3 docs/perf/2026-11-24-run102/exp_ws.py --variants $v \
    $WS_ARGS 2>&1 | grep -v -i warn
  echo "rc ${PIPESTATUS[0]}"
done
