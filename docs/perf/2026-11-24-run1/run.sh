#!/usr/bin/env bash
# Runs of 2026-11-24, eleventh session (bash run.sh <parts>): the MoE GEMMs with TMA-store
# epilogues at 4096 tokens (store: exp_moe_store.py, STORE_ARGS); torch._grouped_mm on
# those shapes (gm: exp_grouped_mm.py, GM_ARGS); the output projection + add + norm in one
# launch in the decode step (proj: exp_proj_step.py, PROJ_ARGS) and its CUDA tests with the
# MLA and capture ones, run in baseline2/ (projtests, PROJT_K); every CUDA test of
# baseline2/ (cudatests); `bench step --parts decode` on this tree and on baseline/ (the
# session's start, 8d00290), one process each (final, FINAL_ORDER). Earlier drivers' parts
# (run97's: moestep, ncumoe, uvstep, uvtests, moetests, absorb; run83's and run68's).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
HERE=docs/perf/2026-11-24-run1
for part in ${*:-store}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    store) timeout 500 python3 $HERE/exp_moe_store.py ${STORE_ARGS:-} > "$OUT/store.log" 2>&1
           grep -v Warning "$OUT/store.log" ;;
    gm) timeout 300 python3 $HERE/exp_grouped_mm.py ${GM_ARGS:-} > "$OUT/gm.log" 2>&1
        grep -v Warning "$OUT/gm.log" ;;
    proj) timeout 500 python3 $HERE/exp_proj_step.py ${PROJ_ARGS:-} > "$OUT/proj.log" 2>&1
          grep -v Warning "$OUT/proj.log" | grep -v "^  " ;;
    projtests) (cd baseline2 && timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider \
                  tests/test_kernels_proj_norm.py tests/test_kernels_mla_cuda.py \
                  tests/test_capture_cuda.py ${PROJT_K:-} > "$OUT/proj_tests.log" 2>&1)
               grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/proj_tests.log" | tail -15 ;;
    cudatests) (cd baseline2 && timeout 420 python3 -m pytest -q -m cuda -p no:cacheprovider \
                  tests > "$OUT/cuda_tests.log" 2>&1)
               grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    final) for v in ${FINAL_ORDER:-new base}; do  # bench step, decode, this tree or baseline/
             d=.; [ $v = base ] && d=baseline
             (cd $d && PYTHONPATH=.:/tmp/site timeout 280 python3 -m scripts.bench step \
                --parts decode --contexts 1024 4096 --out "$OUT/step_$v" > "$OUT/step_$v.log" 2>&1)
             echo "--- $v"; grep -A11 "## decode step" "$OUT/step_$v.log" | tail -9
           done ;;
    *) OUT=$OUT bash docs/perf/2026-11-23-run97/run.sh $part 2>&1 | grep -v "^===" ;;
  esac
done
