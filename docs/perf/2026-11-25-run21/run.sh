#!/bin/bash
# The thirtieth session's GPU driver: bash docs/perf/2026-11-25-run21/run.sh <parts>, logs
# under $OUT:  mlp1: exp_mlp1.py (the MoE at one token in one streaming kernel, [M1_ARGS]);
#   h200: exp_h200_128.py (run 22's H200 pick at 128 tokens in the whole step, [H2_ARGS]);
#   otherwise the earlier sessions' parts (docs/perf/2026-11-25-run12/run.sh).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-25-run21
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    mlp1) timeout 500 python3 $D/exp_mlp1.py ${M1_ARGS} 2>&1 | grep -v -i warn \
            | tee "$OUT/mlp1.log" ;;
    h200) timeout 550 python3 $D/exp_h200_128.py ${H2_ARGS:---batch 128 --ctx 512 --only tree sw128} \
            2>&1 | grep -v -i warn | tee "$OUT/h200_128.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-25-run12/run.sh $part ;;
  esac
done
