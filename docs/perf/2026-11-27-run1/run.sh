#!/bin/bash
# The thirty-second session's GPU driver: bash docs/perf/2026-11-27-run1/run.sh <parts>, logs
# under $OUT:
#   moe: `bench moe` with the matmul rate probed around every timing (x_floor_paired) and
#     the SM clock read after it, [MOE_ARGS, default 7 rounds at the token counts];
#   tests: the whole CUDA suite (`pytest -m cuda`), [T_ARGS] appended;
#   scripts: the GPU paths of the user scripts on the tiny preset (as run 29 of 2026-11-25).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
  --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    moe) timeout 420 python3 -m scripts.bench moe --out "$OUT/moe" ${MOE_ARGS:---rounds 7} \
           > "$OUT/moe.log" 2>&1; echo "bench moe rc=$?"
         grep -v -i warn "$OUT/moe.log" | grep -v "^ *{" | tail -45 | cut -c1-170 ;;
    tests) timeout 560 python3 -m pytest -q -m cuda -p no:cacheprovider ${T_ARGS:-tests} \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -20 ;;
    scripts) { timeout 200 python3 scripts/capture.py --preset tiny --out "$OUT/capture_tiny" \
                 --max-tokens 64 --max-seqs 16 --check 1,8,16,64; echo "capture.py rc=$?"
               timeout 120 python3 -m scripts.profile_step --batch 1 --ctx 256; echo "profile_step rc=$?"
             } > "$OUT/scripts.log" 2>&1
             grep -v -i warn "$OUT/scripts.log" | tail -20 ;;
    *) echo "unknown part $part" ;;
  esac
  echo "=== end $part $(date -u +%H:%M:%S)"
done
