#!/bin/bash
# The thirty-third session's GPU driver: bash docs/perf/2026-11-27-run8/run.sh <parts>, logs
# under $OUT:
#   read: exp_read.py, read-only streaming rates against the copy bandwidth.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
D=docs/perf/2026-11-27-run8
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    read) timeout 400 python3 $D/exp_read.py > "$OUT/read.log" 2>&1; echo "exp_read rc=$?"
          cat "$OUT/read.log" | cut -c1-120 ;;
    *) echo "unknown part $part" ;;
  esac
  echo "=== end $part $(date -u +%H:%M:%S)"
done
