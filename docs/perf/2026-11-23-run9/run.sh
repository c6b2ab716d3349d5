#!/usr/bin/env bash
# Runs of 2026-11-23, second session (bash run.sh <parts>): the warp-specialised MoE GEMMs (ws,
# wstest: they need ws_attempt.patch applied, since the attempt hung and was reverted), the
# router alone (router, router3), the generate loop (gen; genab: both trees, alternating), the
# staging/engine/capture CUDA tests (stest), the MoE and router CUDA tests (moetest), all CUDA
# tests (tests), end to end (e2e, E2E_PARTS), and the benchmarks new against baseline/ (kern,
# bmoe, step with STEP_PARTS). diag_ws.py and diag_ws2.py were run directly (runs 10-11).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-23-run9
ROOT=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for part in ${*:-tests}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    ktest) timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider \
             tests/test_kernels_mla_cuda.py > "$OUT/cuda_kernel_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_kernel_tests.log" | tail -12 ;;
    ws) timeout 400 python3 $D/exp_ws.py ${WS_T:-} > "$OUT/ws.log" 2>&1
        grep -E "Error|WRONG" "$OUT/ws.log" | cut -c1-250; sed -n '/## MoE layer/,$p' "$OUT/ws.log" ;;
    e2e) timeout 420 python3 -m scripts.bench step --parts ${E2E_PARTS:-decode hf generate} --contexts 1024 \
           --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
         grep -A7 "## decode step" "$OUT/e2e.log"; grep -B2 -A8 -i "## HF\|## generate" "$OUT/e2e.log" | cut -c1-200 ;;
    router) timeout 400 python3 $D/exp_router2.py ${ROUTER_T:-} > "$OUT/router.log" 2>&1
            grep -E "^##|Error" "$OUT/router.log" | cut -c1-250 ;;
    router3) timeout 300 python3 $D/exp_router3.py > "$OUT/router3.log" 2>&1
             grep -vE "^\s*$" "$OUT/router3.log" | tail -14 | cut -c1-250 ;;
    gen) timeout 500 python3 $D/exp_generate.py > "$OUT/gen.log" 2>&1
         grep -vE "^\s*$" "$OUT/gen.log" | grep -v Warning | head -60 | cut -c1-200 ;;
    genab) for v in ${GENAB:-base new base new}; do  # exp_generate on each tree, alternating
             dir=.; [ $v = base ] && dir=baseline; n=$((${n:-0} + 1))
             (cd $dir && PYTHONPATH=.:/tmp/site timeout 300 python3 $ROOT/$D/exp_generate.py \
                > "$OUT/gen_${n}_$v.log" 2>&1)
             echo "--- $n $v"; grep -E "^(#|measured|profiled)" "$OUT/gen_${n}_$v.log" | cut -c1-200
             grep -E "_pin_memory|cudaGraphLaunch|cudaEventSync" "$OUT/gen_${n}_$v.log" | cut -c1-150
           done ;;
    stest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_staging.py \
             tests/test_engine.py tests/test_capture_cuda.py > "$OUT/cuda_staging_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_staging_tests.log" | tail -8 ;;
    wstest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
              -k "warp_spec or tma" > "$OUT/cuda_ws_tests.log" 2>&1
            grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/cuda_ws_tests.log" | tail -8 ;;
    moetest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
               tests/test_router.py \
               > "$OUT/cuda_moe_tests.log" 2>&1
             grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_moe_tests.log" | tail -8 ;;
    tests) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    kern) for v in new base; do  # base: the session's starting code, copied to baseline/
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench kernels \
               --heads 128 --batch 1 8 32 128 --ctx 1024 4096 16384 --page ${KPAGE:-1 64} \
               --no-ref --prompt 1024 > "$OUT/kern_$v.log" 2>&1)
            echo "--- $v"; grep -A30 "## MLA decode" "$OUT/kern_$v.log" | cut -c1-175
          done ;;
    bmoe) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench moe \
               --tokens ${BMOE_T:-128 1024 2048 4096} > "$OUT/bmoe_$v.log" 2>&1)
            echo "--- $v"; grep -E "^# |fused |fused_no" "$OUT/bmoe_$v.log" | cut -c1-120
          done ;;
    step) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench step \
               --parts ${STEP_PARTS:-prefill} --contexts 1024 --out "$OUT/step_$v" \
               > "$OUT/step_$v.log" 2>&1)
            echo "--- $v"; grep -A7 "## decode step" "$OUT/step_$v.log"
            grep -A9 "## prefill" "$OUT/step_$v.log"
          done ;;
  esac
done
