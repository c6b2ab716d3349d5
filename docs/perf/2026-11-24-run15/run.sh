#!/bin/bash
# The twelfth session's GPU driver: bash docs/perf/2026-11-24-run15/run.sh <parts>
#   wstests: the warp-specialised decode's CUDA tests;  ws: exp_ws.py (WS_ARGS);  ab: exp_ab.py;
#   cudatests: the whole CUDA suite;  kern: `bench kernels` at 128 heads, this tree, then the
#   session's start in baseline/ (KPAGE, KBATCH; KREF= to time the torch reference too);
#   anything else: 2026-11-24-run1/run.sh's.
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    wstests) timeout 900 python3 -m pytest -q -x -m cuda tests/test_kernels_mla_ws_cuda.py \
               -p no:cacheprovider 2>&1 | tail -30 ;;
    ws) timeout 900 python3 "$HERE/exp_ws.py" $WS_ARGS ;;
    ab) timeout 900 python3 "$HERE/exp_ab.py" ;;
    cudatests) timeout 900 python3 -m pytest -q -m cuda tests -p no:cacheprovider \
                 > "$OUT/cuda_tests.log" 2>&1
               grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    kern) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 400 python3 -m scripts.bench kernels \
               --heads 128 --batch ${KBATCH:-1 8 32 128} --ctx 1024 4096 16384 \
               --page ${KPAGE:-1 64} ${KREF---no-ref} --prompt 1024 > "$OUT/kern_$v.log" 2>&1)
            echo "--- $v"; grep -A30 "## MLA decode" "$OUT/kern_$v.log" | cut -c1-175
          done ;;
    *) bash docs/perf/2026-11-24-run1/run.sh "$part" ;;
  esac
done
