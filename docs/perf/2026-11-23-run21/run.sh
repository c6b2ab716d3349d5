#!/usr/bin/env bash
# Runs of 2026-11-23, third session (bash run.sh <parts>): the warp-specialised Gluon GEMM
# experiment (gluon: exp_gluon.py with gluon_ws.py; run 21 ran its first version, whose kernel
# is this one at pingpong=0, epi_tma=0), the Gluon MoE GEMMs in the layer (moewstest,
# moewsparts, moewslayer: they need ws_moe.patch applied, since that path was not kept), CUDA
# tests (tests; ktest: attention kernels only), and benchmarks new against baseline/ (the
# session's starting code, dca64e9): decode step (step, STEP_PARTS, STEP_ORDER), kernel census
# of a decode step (census, CENSUS_B), MoE layer (bmoe, BMOE_T), H=16 decode kernels (kern),
# the final code's capture, HF side by side and generate (final), and the experiments of runs
# 27-32: split counts (splits), the min_keys variant (minkeys; not kept, no longer runs), the
# merge reading reached splits only in both trees (mergeab), the Triton W_UV product against
# cuBLAS (absorbv; needs absorb_v.patch, not kept), and one wave of split programs against two
# (waves, run 37).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-23-run21
ROOT=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for part in ${*:-tests}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    gluon) timeout 500 python3 $D/exp_gluon.py ${GLUON_CASES:-} > "$OUT/gluon.log" 2>&1
           cut -c1-400 "$OUT/gluon.log" ;;
    moewstest) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py \
             -k "ws or tma or graph_replay" > "$OUT/cuda_moews_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/cuda_moews_tests.log" | tail -12 ;;
    moewsparts) timeout 200 python3 $D/exp_moe_ws_parts.py > "$OUT/moews_parts.log" 2>&1
           grep -E "^#|Error|error" "$OUT/moews_parts.log" | cut -c1-300 ;;
    moewslayer) timeout 400 python3 $D/exp_moe_ws.py ${MOEWS_T:-} > "$OUT/moews.log" 2>&1
           grep -E "^#|Error|error" "$OUT/moews.log" | cut -c1-300 ;;
    splits) timeout 300 python3 $D/exp_splits.py > "$OUT/splits.log" 2>&1
           grep -E "^#|^   |Error" "$OUT/splits.log" | cut -c1-400 ;;
    minkeys) timeout 300 python3 $D/exp_min_keys.py > "$OUT/min_keys.log" 2>&1
           grep -E "^#|Error" "$OUT/min_keys.log" | cut -c1-300 ;;
    mergeab) for v in ${MERGE_ORDER:-new base new base}; do  # BASE: the tree to compare with
             dir=.; [ $v = base ] && dir=${BASE:-baseline}; n=$((${n:-0} + 1))
             (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 $ROOT/$D/exp_merge_active.py \
                > "$OUT/merge_${n}_$v.log" 2>&1)
             echo "--- $n $v"; grep -E "^#|Error" "$OUT/merge_${n}_$v.log" | cut -c1-200
           done ;;
    absorbv) timeout 200 python3 $D/exp_absorb_v.py > "$OUT/absorb_v.log" 2>&1
           grep -E "^#|Error" "$OUT/absorb_v.log" | cut -c1-200 ;;
    waves) timeout 400 python3 $D/exp_waves.py > "$OUT/waves.log" 2>&1
           grep -E "^#|Error" "$OUT/waves.log" | cut -c1-200 ;;
    ktest) timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider \
             tests/test_kernels_mla_cuda.py tests/test_kernels_absorb.py \
             > "$OUT/cuda_kernel_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_kernel_tests.log" | tail -12 ;;
    tests) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    census) for v in new base; do
              dir=.; [ $v = base ] && dir=baseline
              (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.profile_step \
                 --batch ${CENSUS_B:-1 32} --graph > "$OUT/census_$v.log" 2>&1)
              echo "--- $v"; tail -${CENSUS_LINES:-40} "$OUT/census_$v.log" | cut -c1-160
            done ;;
    bmoe) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench moe \
               --tokens ${BMOE_T:-128 1024 2048 4096} > "$OUT/bmoe_$v.log" 2>&1)
            echo "--- $v"; grep -E "^# |fused |fused_no" "$OUT/bmoe_$v.log" | cut -c1-120
          done ;;
    kern) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench kernels \
               --heads ${KHEADS:-16} --batch 1 8 32 128 --ctx 1024 4096 --page 64 \
               --no-ref --prompt 1024 > "$OUT/kern_$v.log" 2>&1)
            echo "--- $v"; grep -A30 "## MLA decode" "$OUT/kern_$v.log" | cut -c1-175
          done ;;
    step) for v in ${STEP_ORDER:-new base new base}; do
            dir=.; [ $v = base ] && dir=baseline; n=$((${n:-0} + 1))
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench step \
               --parts ${STEP_PARTS:-decode} --contexts 1024 --out "$OUT/step_${n}_$v" \
               > "$OUT/step_${n}_$v.log" 2>&1)
            echo "--- $n $v"; grep -A7 "## decode step" "$OUT/step_${n}_$v.log"
            grep -A9 "## prefill" "$OUT/step_${n}_$v.log"
          done ;;
    final) timeout 200 python3 -m scripts.bench capture --out "$OUT/capture" > "$OUT/capture.log" 2>&1
           tail -25 "$OUT/capture.log" | cut -c1-200
           timeout 380 python3 -m scripts.bench step --parts ${FINAL_PARTS:-hf hfcompile decode generate} \
             --contexts 1024 --out "$OUT/final" > "$OUT/final.log" 2>&1
           sed -n '/^GPU /,$p' "$OUT/final.log" | cut -c1-200 ;;
  esac
done
