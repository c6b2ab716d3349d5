#!/bin/bash
# The fourteenth session's GPU driver: bash docs/perf/2026-11-24-run57/run.sh <parts>
#   moetests: the MoE CUDA tests;  layer / step: exp_inline.py (LAYER_ARGS / STEP_ARGS);
#   flags: exp_flags.py (FLAG_ARGS);  timeline: 2026-11-23-run68/exp_timeline.py (TL_ARGS);
#   anything else: 2026-11-24-run35/run.sh's (cudatests, mlatests, final, ...).
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    moetests) timeout 900 python3 -m pytest -q -x -m cuda tests/test_moe_cuda.py \
                -p no:cacheprovider 2>&1 | tail -30 ;;
    layer) timeout 900 python3 "$HERE/exp_inline.py" layer $LAYER_ARGS ;;
    step) timeout 900 python3 "$HERE/exp_inline.py" step $STEP_ARGS ;;
    flags) timeout 900 python3 "$HERE/exp_flags.py" $FLAG_ARGS ;;
    timeline) timeout 600 python3 docs/perf/2026-11-23-run68/exp_timeline.py $TL_ARGS 2>&1 \
                | grep -v -i warn ;;
    *) bash docs/perf/2026-11-24-run35/run.sh "$part" ;;
  esac
done
