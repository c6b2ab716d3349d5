#!/bin/bash
# The seventeenth session's GPU driver: bash docs/perf/2026-11-24-run83/run.sh <parts>, the
# final tree re-measured with the project's own commands, logs and JSON under $OUT:
#   tests: scripts/gpu_check.sh tests (the whole CUDA suite);  artifacts: gpu_check.sh capture
#   (scripts/capture.py, the V2-Lite capture report);  moe: `bench moe`;  capture: `bench
#   capture`;  step: `bench step` with STEP_PARTS (default decode hf), contexts 1024 4096;
#   merge: exp_merge.py (EM_ARGS; needs baseline/);  mlatests: the MLA and capture CUDA tests.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) OUT=$OUT bash scripts/gpu_check.sh tests | grep -v "^===" ;;
    artifacts) OUT=$OUT bash scripts/gpu_check.sh capture | grep -v "^===" ;;
    moe|capture) timeout 400 python3 -m scripts.bench $part --out "$OUT" \
                   > "$OUT/bench_$part.log" 2>&1
                 grep -v -i warn "$OUT/bench_$part.log" | tail -${TAIL:-25} ;;
    step) timeout 580 python3 -m scripts.bench step --parts ${STEP_PARTS:-decode hf} \
            --contexts 1024 4096 --out "$OUT/step" > "$OUT/step.log" 2>&1
          grep -v -i warn "$OUT/step.log" | grep -v "^{" | tail -40 ;;
    merge) timeout 560 python3 docs/perf/2026-11-24-run83/exp_merge.py $EM_ARGS 2>&1 \
             | grep -v -i warn ;;
    mlatests) timeout 560 python3 -m pytest -q -m cuda -p no:cacheprovider \
                tests/test_kernels_mla_cuda.py tests/test_capture_cuda.py 2>&1 | tail -5 ;;
    *) echo "unknown part $part" ;;
  esac
done
