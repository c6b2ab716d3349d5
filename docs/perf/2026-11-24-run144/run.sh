#!/bin/bash
# The twenty-fifth session's GPU driver: bash docs/perf/2026-11-24-run144/run.sh <parts>, logs
# under $OUT:  defer: exp_defer.py (B=1 and 2 at ctx 512 / 1024 / 4096);  nl: exp_nl.py
#   (norm_linear's tiles at B=1);  tl1: the B=1 timeline at ctx 512;  nltests: the CUDA
#   tests of norm_linear, small_linear, the MoE and the model;  otherwise the earlier
#   sessions' parts (docs/perf/2026-11-24-run137/run.sh: tests, step512, step, bmoe, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run144
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    defer) timeout 500 python3 $D/exp_defer.py ${DF_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/defer.log" ;;
    nl) timeout 400 python3 $D/exp_nl.py ${NL_ARGS} 2>&1 | grep -v -i warn | tee "$OUT/nl.log" ;;
    tl1) timeout 300 python3 docs/perf/2026-11-24-run124/exp_timeline.py --batch 1 --ctx 512 \
           --max-pages 9 2>&1 | grep -v -i warn | tee "$OUT/timeline.log" ;;
    nltests) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider \
               tests/test_kernels_norm_linear.py tests/test_kernels_small_linear.py \
               tests/test_kernels_proj_norm.py \
               tests/test_moe_cuda.py tests/test_model.py tests/test_capture_cuda.py \
               > "$OUT/nltests.log" 2>&1; tail -5 "$OUT/nltests.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run137/run.sh $part ;;
  esac
done
