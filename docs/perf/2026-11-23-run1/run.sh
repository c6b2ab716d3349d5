#!/usr/bin/env bash
# Runs of 2026-11-23 (bash run.sh <parts>): 128-head decode through scratch (h128), the MLA
# kernel CUDA tests (ktest), the MoE shared experts on a side stream (stream), all CUDA tests
# (tests), kernels, MoE and prefill benchmarks new against baseline/ (kern, bmoe, step).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-23-run1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for part in ${*:-h128 ktest}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    h128) timeout 400 python3 $D/exp_h128.py ${H128_ARGS:-} > "$OUT/h128.log" 2>&1
          grep -E "^#|Error" "$OUT/h128.log" | cut -c1-200; sed -n '/## summary/,$p' "$OUT/h128.log" ;;
    ktest) timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider \
             tests/test_kernels_mla_cuda.py > "$OUT/cuda_kernel_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_kernel_tests.log" | tail -12 ;;
    stream) timeout 200 python3 $D/exp_shared_stream.py > "$OUT/stream.log" 2>&1
            tail -20 "$OUT/stream.log" ;;
    moetest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
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
