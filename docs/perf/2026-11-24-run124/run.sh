#!/bin/bash
# The twenty-second session's GPU driver: bash docs/perf/2026-11-24-run124/run.sh <parts>, logs
# under $OUT:  splits: exp_splits.py (SP_ARGS);  splits768: the same with generate's 12-page
# table at ctx 640;  splits2: B=8/16/64 at ctx 512 and B=32/64 at ctx 1024 (17 pages);
#   rule: exp_rule.py at ctx 512 (9 pages) and 1024 (17 pages);  timeline: exp_timeline.py
#   (TL_ARGS; default B=32 / 128 at ctx 512, 9 pages);  rule65: exp_rule.py with bench step's
#   65-page table at ctx 1024 and 4096;  step: bench step decode at 1024 / 4096;  otherwise
#   the earlier sessions' parts (docs/perf/2026-11-24-run110/run.sh: tests, gen, step512, ...).
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
    rule65) for c in 1024 4096; do timeout 200 python3 $D/exp_rule.py --ctx $c --max-pages 65 \
              --batch 8 16 32 --rounds 4 2>&1 | grep -v -i warn | tee -a "$OUT/rule65.log"; done ;;
    step) timeout 580 python3 -m scripts.bench step --parts decode --contexts 1024 4096 \
            --batches 1 8 32 128 --out "$OUT/step" > "$OUT/step.log" 2>&1
          grep -v -i warn "$OUT/step.log" | grep -v "^{" | tail -30 ;;
    timeline) timeout 300 python3 $D/exp_timeline.py ${TL_ARGS:---batch 32 128 --ctx 512 \
                --max-pages 9} 2>&1 | grep -v -i warn | tee "$OUT/timeline.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run110/run.sh $part ;;
  esac
done
