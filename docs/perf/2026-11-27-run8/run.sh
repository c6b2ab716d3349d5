#!/bin/bash
# The thirty-third session's GPU driver: bash docs/perf/2026-11-27-run8/run.sh <parts>, logs
# under $OUT:
#   read: exp_read.py, read-only streaming rates against the copy bandwidth;
#   latency: exp_latency.py, a dependent load's and a dependent launch's cost;
#   step: `bench step --parts decode` at contexts [CTX, default 512 1024 4096], with the
#     read-only floor beside the copy floor;
#   btests: the CUDA tests of the benchmarks (tests/test_bench.py);
#   ceil: `measure_ceilings` three times (the read probes' spread);
#   tl: one middle layer's kernel timeline at B=1 and 128, ctx 512, 9-page table
#     (docs/perf/2026-11-24-run124/exp_timeline.py).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
D=docs/perf/2026-11-27-run8
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    read) timeout 400 python3 $D/exp_read.py > "$OUT/read.log" 2>&1; echo "exp_read rc=$?"
          cat "$OUT/read.log" | cut -c1-120 ;;
    latency) timeout 300 python3 $D/exp_latency.py > "$OUT/latency.log" 2>&1
             echo "exp_latency rc=$?"; cut -c1-120 "$OUT/latency.log" ;;
    step) timeout 590 python3 -m scripts.bench step --parts decode --contexts ${CTX:-512 1024 4096} \
            --out "$OUT/step" > "$OUT/step.log" 2>&1; echo "bench step rc=$?"
          grep -v -i warn "$OUT/step.log" | grep -v "^{" | tail -24 | cut -c1-230 ;;
    btests) timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_bench.py \
              > "$OUT/bench_tests.log" 2>&1
            grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/bench_tests.log" | tail -10 ;;
    ceil) timeout 200 python3 -c "from scripts.bench_common import measure_ceilings as m
for _ in range(3): print(m())" 2>&1 | tee "$OUT/ceil.log" ;;
    tl) timeout 300 python3 docs/perf/2026-11-24-run124/exp_timeline.py --batch 1 128 --ctx 512 \
          --max-pages 9 2>&1 | grep -v -i warn > "$OUT/timeline.log"; echo "timeline rc=$?"
        cut -c1-100 "$OUT/timeline.log" | head -80 ;;
    *) echo "unknown part $part" ;;
  esac
  echo "=== end $part $(date -u +%H:%M:%S)"
done
