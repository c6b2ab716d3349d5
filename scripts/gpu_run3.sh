#!/usr/bin/env bash
# GPU session part: CUDA tests, v2-lite capture report, decode-step benchmark.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl && export PYTHONPATH=.:/tmp/site
timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_capture_cuda.py \
  tests/test_kernels_fused.py tests/test_kernels_mla.py tests/test_moe.py tests/test_engine.py \
  -k "not v3" > "$OUT/cuda_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -25
timeout 150 python3 scripts/capture.py --preset v2-lite --backend triton --out /tmp/v2lite \
  > "$OUT/capture_v2lite.log" 2>&1; tail -5 "$OUT/capture_v2lite.log"
cp /tmp/v2lite/capture_report.json "$OUT/" 2>/dev/null
ls /tmp/v2lite | head -3; ls /tmp/v2lite | wc -l
timeout 200 python3 -m scripts.bench step --parts decode --out "$OUT" > "$OUT/step.log" 2>&1
tail -22 "$OUT/step.log"
