#!/bin/bash
# The twentieth session's GPU driver: bash docs/perf/2026-11-24-run104/run.sh <parts>, logs
# under $OUT:  after: exp_after.py (AF_ARGS);  host, host2: exp_host.py, exp_host2.py
# (HO_ARGS);  launch: exp_launch.py (LA_ARGS);  graph: exp_graph.py (GR_ARGS);
#   dispatch: exp_dispatch.py (DI_ARGS);  otherwise the eighteenth session's parts
#   (docs/perf/2026-11-24-run90/run.sh: tests, step, moe, ...).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-24-run104
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    after) timeout 580 python3 $D/exp_after.py $AF_ARGS 2>&1 | grep -v -i warn \
             | tee "$OUT/after.log" ;;
    host) timeout 580 python3 $D/exp_host.py $HO_ARGS 2>&1 | grep -v -i warn \
            | tee "$OUT/host.log" ;;
    host2) timeout 580 python3 $D/exp_host2.py $HO_ARGS 2>&1 | grep -v -i warn \
             | tee "$OUT/host2.log" ;;
    graph) timeout 580 python3 $D/exp_graph.py $GR_ARGS 2>&1 | grep -v -i warn \
             | tee "$OUT/graph.log" ;;
    dispatch) timeout 580 python3 $D/exp_dispatch.py $DI_ARGS 2>&1 | grep -v -i warn \
                | tee "$OUT/dispatch.log" ;;
    launch) timeout 580 python3 $D/exp_launch.py $LA_ARGS 2>&1 | grep -v -i warn \
              | tee "$OUT/launch.log" ;;
    *) OUT=$OUT bash docs/perf/2026-11-24-run90/run.sh $part ;;
  esac
done
