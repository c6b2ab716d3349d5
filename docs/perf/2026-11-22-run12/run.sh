#!/usr/bin/env bash
# Session run 12: MoE large-token candidates, step census at B=32/128, decode sweep at ctx 1024.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
D=docs/perf/2026-11-22-run12; ROOT=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
for part in ${*:-moetest moe profile dsweep msweep}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    moetest) timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_moe.py tests/test_kernels_fused.py \
               > "$OUT/cuda_moe_tests.log" 2>&1
             grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_moe_tests.log" | tail -8 ;;
    tests) timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests \
             > "$OUT/cuda_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -15 ;;
    moe) timeout 240 python3 $D/exp_moe.py ${MOE_T:-4096 1024 512} > "$OUT/exp_moe.log" 2>&1
         grep -E "^#|##|breakdown|    " "$OUT/exp_moe.log" | cut -c1-110 ;;
    profile) timeout 200 python3 -m scripts.profile_step --batch 32 128 --graph \
               > "$OUT/profile.log" 2>&1
             grep -A26 "whole-step graph replay" "$OUT/profile.log" | cut -c1-90; tail -5 "$OUT/profile.log" ;;
    dsweep) timeout 200 python3 $D/exp_dsweep.py > "$OUT/dsweep.log" 2>&1; tail -12 "$OUT/dsweep.log" ;;
    bmoe) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.bench moe \
               --tokens ${BMOE_T:-32 128 512 1024 4096} > "$OUT/bmoe_$v.log" 2>&1)
            echo "--- $v"; grep -A30 "## MoE layer" "$OUT/bmoe_$v.log" | grep -E "fused |fused_no|tokens" | cut -c1-110
          done ;;
    skinny) timeout 150 python3 $D/exp_skinny.py > "$OUT/skinny.log" 2>&1; tail -20 "$OUT/skinny.log" ;;
    step) for v in new base; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.bench step \
               --parts decode prefill --contexts 1024 --out "$OUT/step_$v" > "$OUT/step_$v.log" 2>&1)
            echo "--- $v"; grep -A7 "## decode step" "$OUT/step_$v.log"; grep -A9 "## prefill" "$OUT/step_$v.log"
          done ;;
    chain) timeout 150 python3 $D/exp_pdl_chain.py > "$OUT/chain.log" 2>&1; tail -12 "$OUT/chain.log" ;;
    host) for v in ${HOST_ORDER:-base new base new}; do
            dir=.; [ $v = base ] && dir=baseline
            echo "--- $v"; (cd $dir && PYTHONPATH=.:/tmp/site timeout 100 python3 $ROOT/$D/exp_host.py 2>&1 | tail -3)
          done ;;
    stepr) for v in base new; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 200 python3 -m scripts.bench step \
               --parts decode prefill --contexts 1024 --out "$OUT/stepr_$v" > "$OUT/stepr_$v.log" 2>&1)
            echo "--- $v"; grep -A7 "## decode step" "$OUT/stepr_$v.log"; grep -A9 "## prefill" "$OUT/stepr_$v.log"
          done ;;
    prefab) for v in base new base new; do
            dir=.; [ $v = base ] && dir=baseline
            (cd $dir && PYTHONPATH=.:/tmp/site timeout 150 python3 -m scripts.bench step \
               --parts prefill --prefill-tokens 128 512 1024 2048 --contexts 1024 \
               --out "$OUT/prefab_$v" > "$OUT/prefab_$v.log" 2>&1)
            echo "--- $v"; grep -A6 "## prefill" "$OUT/prefab_$v.log" | tail -4
          done ;;
    kern) timeout 200 python3 -m scripts.bench kernels --heads 16 --batch 128 --ctx 4096 16384 \
            --page 1 64 --no-ref --prompt 1024 > "$OUT/kern.log" 2>&1; tail -14 "$OUT/kern.log" | cut -c1-150 ;;
    tma) timeout 300 python3 $D/exp_tma.py ${TMA_T:-8 32 128 256 512} > "$OUT/tma.log" 2>&1; grep -E "^#|t=|WRONG" "$OUT/tma.log" ;;
    router) timeout 400 python3 $D/exp_router.py ${ROUTER_T:-1024 4096 8192} > "$OUT/router.log" 2>&1; grep -E "^#|default|WRONG|False" "$OUT/router.log" | head -40 ;;
    rcmp) timeout 200 python3 $D/exp_router.py --compare 1536 2048 3072 4096 6144 > "$OUT/rcmp.log" 2>&1; grep -E "t=" "$OUT/rcmp.log" ;;
    rtest) timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_router.py \
             tests/test_moe.py > "$OUT/cuda_router_tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_router_tests.log" | tail -8 ;;
    msweep) timeout 200 python3 -m scripts.bench_moe --sweep --tokens 32 128 --out "$OUT" \
              > "$OUT/msweep.log" 2>&1; grep -A14 -i "sweep" "$OUT/msweep.log" | tail -30 | cut -c1-110 ;;
  esac
done
# (bench: new vs baseline tree, if present)
