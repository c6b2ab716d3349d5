#!/bin/bash
# The twenty-seventh session's GPU driver: bash docs/perf/2026-11-25-run1/run.sh <parts>, logs
# under $OUT:  tail: exp_tail.py (merge_tail against the table at 1024-8192 tokens, [TA_ARGS]);
#   tailtests: the MoE's CUDA tests;  otherwise the earlier sessions' parts
#   (docs/perf/2026-11-24-run148/run.sh: tiles, grouped, warps, tests, step512, step, bmoe ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-25-run1
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tail) timeout 500 python3 $D/exp_tail.py ${TA_ARGS} 2>&1 | grep -v -i warn \
            | tee "$OUT/tail.log" ;;
    tailtests) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider \
                 tests/test_moe_cuda.py > "$OUT/tailtests.log" 2>&1; tail -5 "$OUT/tailtests.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run148/run.sh $part ;;
  esac
done
