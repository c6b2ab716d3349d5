#!/usr/bin/env bash
# Fourth session's runs (26..): MoE GEMM variants at 4096 tokens, the two-launch alignment,
# an H100 tile sweep at 64-256 tokens, the MoE layer new vs baseline, and the CUDA tests.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-22-run26; ROOT=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for part in ${*:-gemm align msweep bmoe moetest}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    gemm) timeout 300 python3 $D/exp_gemm.py ${GEMM_T:-4096} > "$OUT/gemm.log" 2>&1
          grep -E "^#|gate_up|down|cuBLAS|Error" "$OUT/gemm.log" | cut -c1-160 ;;
    align) for v in new base; do
             dir=.; [ $v = base ] && dir=baseline
             echo "--- $v"; (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 $ROOT/$D/exp_align.py \
               > "$OUT/align_$v.log" 2>&1); grep -E "t=|Error" "$OUT/align_$v.log" | cut -c1-140
           done ;;
    msweep) timeout 300 python3 -m scripts.bench_moe --sweep --tokens ${SWEEP_T:-64 128 256} \
              > "$OUT/msweep.log" 2>&1; grep -E "^#|tokens [0-9]+:|WRONG" "$OUT/msweep.log"
            grep -A14 "## best swept" "$OUT/msweep.log" | cut -c1-150 ;;
    bmoe) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench moe \
               --tokens ${BMOE_T:-128 512 1024 2048 4096} > "$OUT/bmoe_$v.log" 2>&1)
            echo "--- $v"; grep -E "^# |fused |fused_no|align_" "$OUT/bmoe_$v.log" | cut -c1-120
          done ;;
    moetest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
               tests/test_kernels_fused.py tests/test_router.py > "$OUT/cuda_moe_tests.log" 2>&1
             grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_moe_tests.log" | tail -8 ;;
    tests) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    step) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench step \
               --parts decode prefill --contexts 1024 --out "$OUT/step_$v" > "$OUT/step_$v.log" 2>&1)
            echo "--- $v"; grep -A7 "## decode step" "$OUT/step_$v.log"; grep -A9 "## prefill" "$OUT/step_$v.log"
          done ;;
    kern) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench kernels \
               --heads 128 --batch 1 8 32 128 --ctx 1024 4096 16384 --page 64 --no-ref \
               --prompt 1024 > "$OUT/kern_$v.log" 2>&1)
            echo "--- $v"; grep -A14 "## MLA decode" "$OUT/kern_$v.log" | cut -c1-175
          done ;;
  esac
done
