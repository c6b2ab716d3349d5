#!/bin/bash
# The twenty-second session's GPU driver: bash docs/perf/2026-11-24-run124/run.sh <parts>, logs
# under $OUT:  splits: exp_splits.py (SP_ARGS);  splits768: the same with generate's 12-page
# table at ctx 640;  splits2: B=8/16/64 at ctx 512 and B=32/64 at ctx 1024 (17 pages);
#   rule: exp_rule.py at ctx 512 (9 pages) and 1024 (17 pages);  timeline: exp_timeline.py
#   (TL_ARGS; default B=32 / 128 at ctx 512, 9 pages);  otherwise the earlier
#   sessions' parts (docs/perf/2026-11-24-run110/run.sh: tests, gen, step512, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run124
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    splits) timeout 400 python3 $D/exp_splits.py $SP_ARGS 2>&1 | grep -v -i warn \
              | tee "$OUT/splits.log" ;;
    splits768) timeout 300 python3 $D/exp_splits.py --ctx 640 --max-pages 12 --batch 32 128 \
                 --rounds 4 2>&1 | grep -v -i warn | tee "$OUT/splits768.log" ;;
    splits2) timeout 330 python3 $D/exp_splits.py --ctx 512 --max-pages 9 --batch 8 16 64 \
               --splits 4 6 8 12 16 --rounds 4 2>&1 | grep -v -i warn | tee "$OUT/splits2.log"
             timeout 250 python3 $D/exp_splits.py --ctx 1024 --max-pages 17 --batch 32 64 \
               --splits 2 4 6 8 --rounds 4 2>&1 | grep -v -i warn | tee "$OUT/splits3.log" ;;
    rule) timeout 280 python3 $D/exp_rule.py --ctx 512 --max-pages 9 2>&1 | grep -v -i warn \
            | tee "$OUT/rule512.log"
          timeout 280 python3 $D/exp_rule.py --ctx 1024 --max-pages 17 2>&1 \
            | grep -v -i warn | tee "$OUT/rule1024.log" ;;
    timeline) timeout 300 python3 $D/exp_timeline.py ${TL_ARGS:---batch 32 128 --ctx 512 \
                --max-pages 9} 2>&1 | grep -v -i warn | tee "$OUT/timeline.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run110/run.sh $part ;;
  esac
done
