#!/bin/bash
# The twenty-ninth session's GPU driver: bash docs/perf/2026-11-25-run12/run.sh <parts>, logs
# under $OUT:  units: exp_units.py (what bounds the routed GEMMs at 4096 tokens);
#   fork: exp_fork.py (where the shared experts' side stream forks, [FK_ARGS]);
#   eager: exp_eager.py (the side stream in the eager prefill step past 2560 tokens, [EA_ARGS]);
#   host: exp_host.py (cProfile of eager prefill steps, [HO_ARGS]);
#   final: bench step, decode (ctx 512), prefill and generate;  cap: prefill with graphs up to
#   CAP_MAX tokens (default 4096) against eager;  otherwise
#   the earlier sessions' parts (docs/perf/2026-11-25-run6/run.sh: mid, stream, aot, tail,
#   tests, bmoe, step512, step, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-25-run12
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    units) timeout 500 python3 $D/exp_units.py 2>&1 | grep -v -i warn | tee "$OUT/units.log" ;;
    eager) timeout 550 python3 $D/exp_eager.py ${EA_ARGS} 2>&1 | grep -v -i warn \
             | tee "$OUT/eager.log" ;;
    host) timeout 300 python3 $D/exp_host.py ${HO_ARGS} 2>&1 | grep -v -i warn \
            | tee "$OUT/host.log" ;;
    final) timeout 590 python3 -m scripts.bench step --parts decode prefill generate \
             --contexts 512 --out "$OUT/step" > "$OUT/step.log" 2>&1
           grep -v -i warn "$OUT/step.log" | grep -v "^{" | tail -45 ;;
    cap) timeout 590 python3 -m scripts.bench step --parts prefill --prefill-tokens \
           ${CAP_TOKENS:-2304 2560 2816 3072 3328 3584 4096} --max-tokens ${CAP_MAX:-4096} \
           --prefill-rounds 6 --out "$OUT/cap" > "$OUT/cap.log" 2>&1
         grep -v -i warn "$OUT/cap.log" | grep -v "^{" | grep -v "capturing" | tail -20 ;;
    fork) timeout 550 python3 $D/exp_fork.py ${FK_ARGS} 2>&1 | grep -v -i warn \
            | tee "$OUT/fork.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-25-run6/run.sh $part ;;
  esac
done
