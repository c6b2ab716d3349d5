#!/bin/bash
# The fifteenth session's GPU driver: bash docs/perf/2026-11-24-run74/run.sh <parts>
#   lflags: exp_layer_flags.py (LF_ARGS);  moetl: 2026-11-23-run68/exp_moe_timeline.py (MT_ARGS);
#   lstep / llayer: exp_last.py step / layer (LS_ARGS / LL_ARGS);  tests: pytest -m cuda
#   on TESTS (files and -k expressions);
#   anything else: 2026-11-24-run57/run.sh's (flags, step, layer, timeline, cudatests, ...).
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    lstep) timeout 900 python3 "$HERE/exp_last.py" step $LS_ARGS ;;
    llayer) timeout 900 python3 "$HERE/exp_last.py" layer $LL_ARGS ;;
    tests) timeout 900 python3 -m pytest -q -m cuda $TESTS -p no:cacheprovider 2>&1 \
             | tail -15 ;;
    lflags) timeout 900 python3 "$HERE/exp_layer_flags.py" $LF_ARGS ;;
    moetl) timeout 600 python3 docs/perf/2026-11-23-run68/exp_moe_timeline.py $MT_ARGS 2>&1 \
             | grep -v -i warn ;;
    *) bash docs/perf/2026-11-24-run57/run.sh "$part" ;;
  esac
done
