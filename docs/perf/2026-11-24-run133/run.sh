#!/bin/bash
# The twenty-third session's GPU driver: bash docs/perf/2026-11-24-run133/run.sh <parts>, logs
# under $OUT:  logits: exp_logits.py (ctx 512, 9 pages; B=1/32/128);  chain: exp_chain.py;
#   step512: bench step decode at ctx 512;  step: bench step decode at 1024 / 4096;  otherwise
#   the earlier sessions' parts (docs/perf/2026-11-24-run124/run.sh: tests, timeline, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run133
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    logits) timeout 300 python3 $D/exp_logits.py ${LG_ARGS} 2>&1 | grep -v -i warn \
              | tee "$OUT/logits.log" ;;
    chain) timeout 200 python3 $D/exp_chain.py ${CH_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/chain.log" ;;
    step512) timeout 400 python3 -m scripts.bench step --parts decode --contexts 512 \
               --batches 1 8 32 128 --out "$OUT/step512" > "$OUT/step512.log" 2>&1
             grep -v -i warn "$OUT/step512.log" | grep -v "^{" | tail -20 ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run124/run.sh $part ;;
  esac
done
