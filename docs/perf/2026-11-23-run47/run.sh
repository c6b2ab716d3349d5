#!/usr/bin/env bash
# Runs of 2026-11-23, fifth session (bash run.sh <parts>): CUDA tests (tests); prefill eager
# against piecewise in alternating rounds, in the trees of PREFILL_ORDER (prefill: new = this
# tree, base = baseline/ = a8a8179, the session's start); the MoE sum's add+norm at V3's
# width, two-pass path, against the two launches (sumv3); eager prefill host time and a
# profile, trees alternating (eagerab, EAGER_ORDER); the MoE layer with whole against half
# tiles (halves: needs halves.patch applied first, `git apply docs/perf/2026-11-23-run47/
# halves.patch`; not run: no GPU was lent after run 51). Other parts: ../2026-11-23-run40.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
tree() { case $1 in base) echo baseline ;; *) echo . ;; esac; }
HERE=docs/perf/2026-11-23-run47
ROOT=$(pwd)
for part in ${*:-tests}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    prefill) n=0
             for v in ${PREFILL_ORDER:-new base}; do
               n=$((n + 1))
               (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 300 python3 -m scripts.bench \
                  step --parts prefill --prefill-tokens ${PREFILL_T:-1024 2048 4096 8192} \
                  --out "/tmp/prefill_${n}_$v" > "$OUT/prefill_${n}_$v.log" 2>&1)
               echo "--- $n $v"; grep -A7 "## prefill" "$OUT/prefill_${n}_$v.log" | tail -5
               grep -o "'tokens': [0-9]*.*" "$OUT/prefill_${n}_$v.log" \
                 | sed -E "s/'(eager|piecewise)_tok_s': [0-9.]+, //g" | cut -c1-330
             done ;;
    eagerab) n=0  # eager prefill host time, trees alternating (EAGER_ORDER)
             for v in ${EAGER_ORDER:-new base new base}; do
               n=$((n + 1))
               (cd $(tree $v) && PYTHONPATH=.:/tmp/site timeout 120 python3 \
                  $ROOT/$HERE/exp_eager_prefill.py > "$OUT/eager_${n}_$v.log" 2>&1)
               echo "--- $n $v"; grep -E "^# |Error" "$OUT/eager_${n}_$v.log"
               [ $n -le 2 ] && grep -A16 "Ordered by" "$OUT/eager_${n}_$v.log" | cut -c1-150
             done ;;
    halves) timeout 300 python3 $HERE/exp_halves.py > "$OUT/halves.log" 2>&1
            grep -E "^#|Error" "$OUT/halves.log" ;;
    sumv3) timeout 200 python3 $HERE/exp_sum_norm_v3.py > "$OUT/sum_v3.log" 2>&1
           grep -E "^#|Error" "$OUT/sum_v3.log" ;;
  esac
done
