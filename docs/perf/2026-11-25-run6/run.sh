#!/bin/bash
# The twenty-eighth session's GPU driver: bash docs/perf/2026-11-25-run6/run.sh <parts>, logs
# under $OUT:  mid: exp_mid.py (the MoE table's choices between its measured rows, [MD_ARGS]);
#   stream: exp_stream.py (shared_stream past 2048 tokens in the prefill step, [ST_ARGS]);
#   aot: the ahead-of-time sm90 compile tests with this machine's Triton;  otherwise the
#   earlier sessions' parts (docs/perf/2026-11-25-run1/run.sh: tail, tailtests, tests,
#   step512, step, bmoe, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-25-run6
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    mid) timeout 500 python3 $D/exp_mid.py ${MD_ARGS} 2>&1 | grep -v -i warn \
           | tee "$OUT/mid.log" ;;
    stream) timeout 500 python3 $D/exp_stream.py ${ST_ARGS} 2>&1 | grep -v -i warn \
              | tee "$OUT/stream.log" ;;
    aot) timeout 300 python3 -m pytest -q -p no:cacheprovider -k "compile or sm90" tests \
           > "$OUT/aot.log" 2>&1; tail -3 "$OUT/aot.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-25-run1/run.sh $part ;;
  esac
done
