#!/bin/bash
# The thirteenth session's GPU driver: bash docs/perf/2026-11-24-run35/run.sh <parts>
#   moetests: the MoE CUDA tests;  layer / step: exp_chunks.py (LAYER_ARGS / STEP_ARGS);
#   anything else: 2026-11-24-run15/run.sh's (cudatests, final, ...).
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for part in "$@"; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    moetests) timeout 900 python3 -m pytest -q -x -m cuda tests/test_moe_cuda.py \
                -p no:cacheprovider 2>&1 | tail -30 ;;
    layer) timeout 900 python3 "$HERE/exp_chunks.py" layer $LAYER_ARGS ;;
    step) timeout 900 python3 "$HERE/exp_chunks.py" step $STEP_ARGS ;;
    tiles) timeout 900 python3 "$HERE/exp_chunks.py" tiles $TILES_ARGS ;;
    host) timeout 900 python3 "$HERE/exp_step_host.py" $HOST_ARGS ;;
    hs) timeout 900 python3 "$HERE/exp_hs.py" $HS_ARGS ;;
    gap) timeout 900 python3 "$HERE/exp_launch_gap.py" $GAP_ARGS ;;
    ws16) timeout 900 python3 "$HERE/exp_ws16.py" $WS16_ARGS ;;
    wsearly) PYTHONPATH=.:tests:/tmp/site timeout 900 python3 "$HERE/exp_ws_early.py" \
               $WSE_ARGS ;;
    mlatests) timeout 900 python3 -m pytest -q -m cuda tests/test_kernels_mla_ws_cuda.py \
                tests/test_kernels_mla_cuda.py -p no:cacheprovider 2>&1 | tail -15 ;;
    stalls) for b in ${STALL_B:-128 32}; do  # the split kernel's warp stall reasons
              m=""
              for r in long_scoreboard short_scoreboard math_pipe_throttle wait barrier \
                       mio_throttle lg_throttle dispatch_stall not_selected selected \
                       no_instruction branch_resolving membar drain sleeping tex_throttle \
                       imc_miss misc; do
                m="$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
              done
              PYTHONPATH=.:tests:/tmp/site timeout 300 ncu --clock-control none \
                --kernel-name regex:split_kernel --launch-skip 3 --launch-count 1 \
                --section SpeedOfLight --section Occupancy --section WarpStateStats \
                --metrics "${m#,},smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
                python3 $HERE/ncu_split.py --batch $b --ctx ${STALL_CTX:-1024} ${STALL_ARGS:-} \
                > "$OUT/stalls_$b.log" 2>&1
              echo "--- B=$b"
              grep -E "Duration|DRAM Throughput|stalled|inst_executed|hmma|Warp Cycles Per Issued|Achieved Occ|DecodePlan" "$OUT/stalls_$b.log" | sed 's/smsp__average_warps_issue_stalled_//' | head -40
            done ;;
    ncu) for v in ${NCU_V:-tab ch ch-t}; do  # the MoE kernels of the 5th call
           PYTHONPATH=.:/tmp/site timeout 300 ncu --clock-control none \
             --kernel-name regex:"gate_up_kernel|down_kernel|chunk_kernel|chunk_sum|sum_kernel" \
             --launch-skip $([ $v = tab ] && echo 9 || echo 8) --launch-count ${NCU_COUNT:-2} --section SpeedOfLight \
             --section Occupancy --section LaunchStats --section WarpStateStats \
             --section MemoryWorkloadAnalysis python3 $HERE/ncu_chunks.py \
             --tokens ${NCU_T:-1} --variant $v > "$OUT/ncu_$v.log" 2>&1
           echo "--- $v"
           grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occ|Theoretical Occ|Waves Per SM|Grid Size|Shared Memory Config|Dynamic Shared|Warp Cycles Per Issued|L2 Hit Rate|Mem Busy|Max Bandwidth" "$OUT/ncu_$v.log" | head -60
         done ;;
    *) bash docs/perf/2026-11-24-run15/run.sh "$part" ;;
  esac
done
