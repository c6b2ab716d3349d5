#!/usr/bin/env bash
# Session run: CUDA tests, alignment experiment, MoE bench, decode step new vs baseline.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
for part in ${*:-tests align moe step}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) timeout 220 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    align) timeout 120 python3 exp_align.py > "$OUT/exp_align.log" 2>&1; tail -12 "$OUT/exp_align.log" ;;
    moe) timeout 200 python3 -m scripts.bench moe --tokens ${MOE_TOKENS:-1 2 4 8 32 128 512 4096} \
           --out "$OUT" > "$OUT/bench_moe.log" 2>&1; grep -B2 -A45 "## MoE layer" "$OUT/bench_moe.log" | cut -c1-100 ;;
    step) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 150 python3 -m scripts.bench step \
               --parts decode --contexts 1024 --out "$OUT/step_$v" > "$OUT/step_$v.log" 2>&1)
            echo "--- $v"; grep -A7 "## decode step" "$OUT/step_$v.log"
          done ;;
    dispatch) timeout 200 python3 exp_dispatch.py > "$OUT/exp_dispatch.log" 2>&1; tail -60 "$OUT/exp_dispatch.log" ;;
    capture) timeout 150 python3 scripts/capture.py --preset v2-lite --backend triton \
               --out /tmp/v2lite > "$OUT/capture_v2lite.log" 2>&1
             tail -1 "$OUT/capture_v2lite.log"; cp /tmp/v2lite/capture_report.json "$OUT/" ;;
    stephf) timeout 420 python3 -m scripts.bench step --parts hf hfcompile decode prefill \
              --contexts 1024 --out "$OUT/step_hf" > "$OUT/step_hf.log" 2>&1
            tail -32 "$OUT/step_hf.log"
            (cd baseline && PYTHONPATH=.:/tmp/site timeout 150 python3 -m scripts.bench step \
               --parts decode --contexts 1024 --out "$OUT/step_base" > "$OUT/step_base.log" 2>&1)
            echo "--- base"; grep -A7 "## decode step" "$OUT/step_base.log" ;;
    stepgen) timeout 400 python3 -m scripts.bench step --parts decode generate --contexts 4096 \
               --out "$OUT/step_gen" > "$OUT/step_gen.log" 2>&1; tail -20 "$OUT/step_gen.log" ;;
    qkv) timeout 100 python3 exp_qkv.py > "$OUT/exp_qkv.log" 2>&1; tail -8 "$OUT/exp_qkv.log" ;;
    profile) for v in new base; do
               dir=.; [ $v = base ] && dir=baseline
               (cd $dir && PYTHONPATH=.:/tmp/site timeout 150 python3 -m scripts.profile_step \
                  --batch 1 128 --graph > "$OUT/profile_$v.log" 2>&1)
               echo "--- $v"; grep -A32 "whole-step graph replay" "$OUT/profile_$v.log" | cut -c1-90
               tail -5 "$OUT/profile_$v.log"
             done ;;
  esac
done
