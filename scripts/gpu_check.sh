#!/usr/bin/env bash
# One GPU machine, one command: CUDA tests, the V2-Lite capture report, benchmarks; logs and
# JSON under $OUT (default out/), short tables last. Parts: tests capture step moe kernels
# profile hostprof (default: tests capture step moe profile).
# Example: bash scripts/gpu_check.sh tests step
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
if [ -d .whl ]; then  # wheels the GPU image lacks (beartype), carried from the dev machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
parts=${*:-tests capture step moe profile}
for part in $parts; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    tests) timeout 560 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    capture) timeout 150 python3 scripts/capture.py --preset v2-lite --backend triton \
               --out /tmp/v2lite > "$OUT/capture_v2lite.log" 2>&1
             tail -1 "$OUT/capture_v2lite.log"; cp /tmp/v2lite/capture_report.json "$OUT/" ;;
    step) timeout 360 python3 -m scripts.bench step --parts decode generate --out "$OUT" \
            > "$OUT/step.log" 2>&1; tail -22 "$OUT/step.log" ;;
    hostprof) timeout 200 python3 -m scripts.profile_generate > "$OUT/profile_generate.log" 2>&1
              head -40 "$OUT/profile_generate.log" ;;
    profile) timeout 150 python3 -m scripts.profile_step --batch 1 128 > "$OUT/profile.log" 2>&1
             tail -8 "$OUT/profile.log" ;;
    *) timeout 300 python3 -m scripts.bench "$part" --out "$OUT" > "$OUT/bench_$part.log" 2>&1
       tail -40 "$OUT/bench_$part.log" ;;
  esac
done
