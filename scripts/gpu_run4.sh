#!/usr/bin/env bash
# GPU session part: v2-lite capture report, then the step benchmark (HF + decode) and prefill.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl && export PYTHONPATH=.:/tmp/site
timeout 120 python3 scripts/capture.py --preset v2-lite --backend triton --out /tmp/v2lite \
  > "$OUT/capture_v2lite.log" 2>&1; tail -1 "$OUT/capture_v2lite.log"
cp /tmp/v2lite/capture_report.json "$OUT/" 2>/dev/null
timeout 420 python3 -m scripts.bench step --parts hf decode prefill \
  --prefill-tokens 128 512 2048 8192 --out "$OUT" > "$OUT/step.log" 2>&1
tail -32 "$OUT/step.log"
