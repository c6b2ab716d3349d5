#!/bin/bash
# The twenty-sixth session's GPU driver: bash docs/perf/2026-11-24-run148/run.sh <parts>, logs
# under $OUT:  tiles: exp_tiles.py (the MoE's 1-4-token tiles in the whole step, [TL_ARGS]);
#   grouped: exp_grouped.py (grouped GEMM rates at the 4096-token shapes);  warps:
#   exp_warps.py (the few-row kernels' warps in the whole step, [WP_ARGS]);  otherwise the
#   earlier sessions' parts (docs/perf/2026-11-24-run144/run.sh: defer, nl, tl1, nltests,
#   tests, step512, step, bmoe, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run148
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tiles) timeout 560 python3 $D/exp_tiles.py ${TL_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/tiles.log" ;;
    grouped) timeout 400 python3 $D/exp_grouped.py 2>&1 | grep -v -i warn \
               | tee "$OUT/grouped.log" ;;
    warps) timeout 500 python3 $D/exp_warps.py ${WP_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/warps.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run144/run.sh $part ;;
  esac
done
