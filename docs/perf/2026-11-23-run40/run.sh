#!/usr/bin/env bash
# Runs of 2026-11-23, fourth session (bash run.sh <parts>): CUDA tests (tests), decode step
# of the trees in STEP_ORDER side by side (step: new = this tree, base = baseline/ = 34b314a,
# the session's start; mid = baseline2/ = d32a563, the prologue fused into the absorb launch
# without the MoE add+norm), kernel census of a decode step (census, CENSUS_B; CENSUS_TREES),
# prefill eager against piecewise in alternating rounds (prefill, PREFILL_T, in the trees of
# PREFILL_TREES), the MoE sum with the add+norm against the two launches (sumnorm), and the
# final code's capture, HF side by side and generate (final); capture time, trees side by
# side (capab, CAP_ORDER), and the MLA decode kernels (kern, KHEADS, KERN_TREES).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
ROOT=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
tree() { case $1 in base) echo baseline ;; mid) echo baseline2 ;; *) echo . ;; esac; }
for part in ${*:-tests}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) timeout 500 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    step) n=0
          for v in ${STEP_ORDER:-new base mid new base mid}; do
            n=$((n + 1))
            (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 250 python3 -m scripts.bench step \
               --parts decode --contexts 1024 --out "$OUT/step_${n}_$v" \
               > "$OUT/step_${n}_$v.log" 2>&1)
            echo "--- $n $v"; grep -A7 "## decode step" "$OUT/step_${n}_$v.log" | tail -5
          done ;;
    census) for v in ${CENSUS_TREES:-new base}; do
              (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.profile_step \
                 --batch ${CENSUS_B:-1 32} --graph > "$OUT/census_$v.log" 2>&1)
              echo "--- $v"; grep -B2 -A18 "whole-step graph" "$OUT/census_$v.log" | cut -c1-110
            done ;;
    prefill) for v in ${PREFILL_TREES:-new}; do
               (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 400 python3 -m scripts.bench step \
                  --parts prefill --prefill-tokens ${PREFILL_T:-1024 2048 4096 8192} \
                  --out "$OUT/prefill_$v" > "$OUT/prefill_$v.log" 2>&1)
               echo "--- $v"; grep -A8 "## prefill" "$OUT/prefill_$v.log"
               grep -o "'tokens': [0-9]*.*" "$OUT/prefill_$v.log" | cut -c1-300
             done ;;
    sumnorm) timeout 200 python3 docs/perf/2026-11-23-run40/exp_sum_norm.py > "$OUT/sum_norm.log" 2>&1
             grep -E "^#|Error" "$OUT/sum_norm.log" ;;
    kern) for v in ${KERN_TREES:-new}; do  # MLA decode kernels, KHEADS heads, page 64
            (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 300 python3 -m scripts.bench kernels \
               --heads ${KHEADS:-16} --batch 1 8 32 128 --ctx 1024 4096 16384 --page 64 \
               --no-ref --prompt 1024 > "$OUT/kern_$v.log" 2>&1)
            echo "--- $v"; grep -A16 "## MLA decode" "$OUT/kern_$v.log" | cut -c1-175
          done ;;
    capab) n=0  # capture time of the trees in CAP_ORDER (the first run of a tree compiles)
           for v in ${CAP_ORDER:-base new base new}; do
             n=$((n + 1))
             (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.bench capture \
                --batches 1 --prefill 16 --reps 3 --out "$OUT/cap_${n}_$v" \
                > "$OUT/cap_${n}_$v.log" 2>&1)
             echo "--- $n $v"; grep "^capture |" "$OUT/cap_${n}_$v.log"
             tr '\r' '\n' < "$OUT/cap_${n}_$v.log" | grep capturing | awk 'NR % 25 == 1' | cut -c1-90
           done ;;
    final) timeout 200 python3 -m scripts.bench capture --out "$OUT/capture" > "$OUT/capture.log" 2>&1
           tail -25 "$OUT/capture.log" | cut -c1-200
           timeout 380 python3 -m scripts.bench step --parts ${FINAL_PARTS:-hf hfcompile decode generate} \
             --contexts ${FINAL_CTX:-1024} --out "$OUT/final" > "$OUT/final.log" 2>&1
           sed -n '/^GPU /,$p' "$OUT/final.log" | cut -c1-200 ;;
  esac
done
