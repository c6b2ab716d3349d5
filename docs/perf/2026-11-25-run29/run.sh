#!/bin/bash
# The thirty-first session's GPU driver: bash docs/perf/2026-11-25-run29/run.sh <parts>, logs
# under $OUT:
#   tests: the whole CUDA suite (`pytest -m cuda`), [T_ARGS] appended;
#   scripts: the GPU paths of the user scripts on the tiny preset (capture.py with its report,
#     profile_step, bench capture) after this session's changes to them;
#   step: `bench step --parts decode` at contexts [CTX, default 512 1024 4096] on the final tree.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) timeout 560 python3 -m pytest -q -m cuda -p no:cacheprovider ${T_ARGS:-tests} \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -20 ;;
    scripts) { timeout 200 python3 scripts/capture.py --preset tiny --out "$OUT/capture_tiny" \
                 --max-tokens 64 --max-seqs 16 --check 1,8,16,64; echo "capture.py rc=$?"
               timeout 120 python3 -m scripts.profile_step --batch 1 --ctx 256; echo "profile_step rc=$?"
               timeout 200 python3 -m scripts.bench capture --out "$OUT/bench_capture" \
                 --preset tiny --backend torch --batches 1,8 --prefill 16,64 --reps 5
               echo "bench capture rc=$?"; } > "$OUT/scripts.log" 2>&1
             grep -v -i warn "$OUT/scripts.log" | tail -30 ;;
    step) timeout 590 python3 -m scripts.bench step --parts decode --contexts ${CTX:-512 1024 4096} \
            --out "$OUT/step" > "$OUT/step.log" 2>&1
          grep -v -i warn "$OUT/step.log" | grep -v "^{" | tail -30 ;;
    *) echo "unknown part $part" ;;
  esac
done
