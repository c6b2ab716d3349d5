#!/usr/bin/env bash
# Runs of 2026-11-23, tenth session (bash run.sh <parts>): MoE configs in the whole decode step
# (moestep: exp_moe_step.py, MOESTEP_<B> variants per batch, MOESTEP_B batches); Nsight Compute
# on the MoE GEMMs (ncumoe: ncu_moe.py, NCUMOE_T token counts, NCUMOE_ARGS); the split-KV
# merge fused with W_UV in the step (uvstep: exp_uv_step.py, UV_ARGS) and the MLA + capture CUDA
# tests of baseline2/ (uvtests, UVT_K); its MoE CUDA tests (moetests, MOET_K); the absorb kernel's tiles in the step (absorb:
# exp_absorb_step.py, AB_ARGS). Earlier drivers' parts
# (run83's: early, launch, ncu, mlatests; run68's: timeline, bstep, bmoe, tests, step, ...).
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
HERE=docs/perf/2026-11-23-run97
for part in ${*:-moestep}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    moestep) for b in ${MOESTEP_B:-32 128}; do
               var=MOESTEP_$b
               timeout 300 python3 $HERE/exp_moe_step.py --batch $b --profile \
                 --variants ${!var:-cur apart} > "$OUT/moestep_$b.log" 2>&1
               grep -v Warning "$OUT/moestep_$b.log" | grep -v "^  "
             done ;;
    ncumoe) for t in ${NCUMOE_T:-32 128}; do  # gate_up and down of the 3rd call
              PYTHONPATH=.:/tmp/site timeout 300 ncu --clock-control none \
                --kernel-name regex:"gate_up_kernel|down_kernel" --launch-skip 4 \
                --launch-count 2 --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section SchedulerStats \
                --section MemoryWorkloadAnalysis python3 $HERE/ncu_moe.py --tokens $t \
                ${NCUMOE_ARGS:-} > "$OUT/ncu_moe_$t.log" 2>&1
              echo "--- tokens $t"
              grep -E "gate_up_kernel|down_kernel|^    (Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Dynamic Shared|Block Limit|Grid Size|Waves Per SM|Issued Ipc|No Eligible|Warp Cycles Per Issued|Theoretical Occ)" \
                "$OUT/ncu_moe_$t.log"
            done ;;
    uvstep) timeout 500 python3 $HERE/exp_uv_step.py ${UV_ARGS:-} > "$OUT/uvstep.log" 2>&1
            grep -v Warning "$OUT/uvstep.log" | grep -v "^  " ;;
    uvtests) (cd baseline2 && timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider \
                tests/test_kernels_mla_cuda.py tests/test_capture_cuda.py ${UVT_K:-} \
                > "$OUT/uv_tests.log" 2>&1)
             grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/uv_tests.log" | tail -15 ;;
    moetests) (cd baseline2 && timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider \
                 tests/test_moe_cuda.py ${MOET_K:-} > "$OUT/moe_tests.log" 2>&1)
              grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/moe_tests.log" | tail -15 ;;
    absorb) timeout 500 python3 $HERE/exp_absorb_step.py ${AB_ARGS:-} > "$OUT/absorb.log" 2>&1
            grep -v Warning "$OUT/absorb.log" | grep -v "^  " ;;
    *) OUT=$OUT bash docs/perf/2026-11-23-run83/run.sh $part 2>&1 | grep -v "^===" ;;
  esac
done
