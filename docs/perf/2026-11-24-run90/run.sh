#!/bin/bash
# The eighteenth session's GPU driver: bash docs/perf/2026-11-24-run90/run.sh <parts>, logs
# under $OUT:  levels: exp_levels.py (LV_ARGS);  plan: exp_plan.py (PL_ARGS);  rows:
# exp_rows.py (RW_ARGS);  rtests: the router CUDA tests;  route: exp_route.py (RT_ARGS);
# wait: exp_route_wait.py (RT_ARGS);
# ptests: the router, projection, MoE and capture CUDA tests (of trees de2b1cc-f94d0e6 and
# f723fd8: runs 96-99, 101; their proj_route test is gone since);  otherwise the project's own commands
# as in docs/perf/2026-11-24-run83/run.sh (tests, step, moe, mlatests, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    levels) timeout 580 python3 docs/perf/2026-11-24-run90/exp_levels.py $LV_ARGS 2>&1 \
              | grep -v -i warn ;;
    rows) timeout 580 python3 docs/perf/2026-11-24-run90/exp_rows.py $RW_ARGS 2>&1 \
            | grep -v -i warn ;;
    wait) timeout 580 python3 docs/perf/2026-11-24-run90/exp_route_wait.py $RT_ARGS 2>&1 \
            | grep -v -i warn ;;
    route) timeout 580 python3 docs/perf/2026-11-24-run90/exp_route.py $RT_ARGS 2>&1 \
             | grep -v -i warn ;;
    ptests) timeout 560 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_router.py \
              tests/test_router_rows.py tests/test_kernels_proj_route.py \
              tests/test_kernels_proj_norm.py tests/test_moe_cuda.py tests/test_capture_cuda.py \
              2>&1 | tail -4 ;;
    plan) timeout 580 python3 docs/perf/2026-11-24-run90/exp_plan.py $PL_ARGS 2>&1 \
            | grep -v -i warn ;;
    rtests) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_router.py \
              tests/test_router_rows.py 2>&1 | tail -4 ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run83/run.sh $part | grep -v "^Name\|^NVIDIA" ;;
  esac
done
