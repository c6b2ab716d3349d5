#!/bin/bash
# The twenty-fourth session's GPU driver: bash docs/perf/2026-11-24-run137/run.sh <parts>, logs
# under $OUT:  quick: the CUDA tests of the router, the MoE and the model;  router:
#   exp_router.py;  rstep: exp_step.py (ctx 512, 9 pages; B=1/32/128);  align: exp_align.py;
#   layer: exp_layer.py;  moetl: 2026-11-23-run68/exp_moe_timeline.py at 4096 tokens;
#   bmoe: bench moe;  otherwise the earlier sessions' parts (docs/perf/2026-11-24-run133/
#   run.sh: tests, step512, step, logits, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run137
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    quick) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_router.py \
             tests/test_router_rows.py tests/test_moe_cuda.py tests/test_model.py \
             > "$OUT/quick.log" 2>&1; tail -5 "$OUT/quick.log" ;;
    router) timeout 300 python3 $D/exp_router.py ${RT_ARGS} 2>&1 | grep -v -i warn \
              | tee "$OUT/router.log" ;;
    rstep) timeout 400 python3 $D/exp_step.py ${RS_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/rstep.log" ;;
    align) timeout 200 python3 $D/exp_align.py ${AL_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/align.log" ;;
    layer) timeout 300 python3 $D/exp_layer.py ${LY_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/layer.log" ;;
    moetl) timeout 200 python3 docs/perf/2026-11-23-run68/exp_moe_timeline.py ${MT_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/moetl.log" ;;
    bmoe) timeout 400 python3 -m scripts.bench moe ${BM_ARGS} --out "$OUT/moe" \
            > "$OUT/bmoe.log" 2>&1; grep -v -i warn "$OUT/bmoe.log" | grep -v "^{" | tail -25 ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run133/run.sh $part ;;
  esac
done
