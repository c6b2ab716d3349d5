#!/usr/bin/env bash
# One GPU session: CUDA tests, then benchmarks; logs under $OUT (or out/), short tables last.
# Usage on the device machine: bash scripts/gpu_check.sh [tests] [kernels] [moe] [capture] [step]
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
parts=${*:-tests kernels moe capture step}
for part in $parts; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) python3 -m pytest -q -m cuda -x -p no:cacheprovider tests 2>&1 \
             | tee "$OUT/cuda_tests.log" | tail -25 ;;
    step) python3 -m scripts.bench step --out "$OUT" 2>&1 | tee "$OUT/bench_step.log" \
             | tail -40 ;;
    *) python3 -m scripts.bench "$part" --out "$OUT" 2>&1 | tee "$OUT/bench_$part.log" \
             | tail -30 ;;
  esac
done
