#!/bin/bash
# The sixteenth session's GPU driver: bash docs/perf/2026-11-24-run81/run.sh <parts>
#   down: exp_down.py (ED_ARGS);  warm: exp_warm.py (EW_ARGS);  tests: pytest -m cuda on TESTS;
#   anything else: 2026-11-24-run74/run.sh's (lflags, moetl, lstep, llayer, flags, step, ...).
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    warm) timeout 900 python3 "$HERE/exp_warm.py" $EW_ARGS 2>&1 | grep -v -i warn ;;
    down) timeout 900 python3 "$HERE/exp_down.py" $ED_ARGS 2>&1 | grep -v -i warn ;;
    tests) timeout 900 python3 -m pytest -q -m cuda $TESTS -p no:cacheprovider 2>&1 \
             | tail -15 ;;
    *) bash docs/perf/2026-11-24-run74/run.sh "$part" ;;
  esac
done
