#!/usr/bin/env bash
# Runs of 2026-11-23, eighth session (bash run.sh <parts>): kernel timelines of the decode step
# (timeline: exp_timeline.py, one whole-step graph) and of the MoE layer at large steps
# (moetl: exp_moe_timeline.py); MoE variants at large steps (moevar: exp_moe_variants.py);
# bench moe in this tree and baseline/ (bmoe: BMOE_ORDER, BMOE_T); does an L2 prefetch on a
# side stream speed up the skinny GEMM after it (l2: exp_l2.py), and the decode step
# (pfstep: exp_prefetch_step.py); host time of a compiled full step, trees in turn (host:
# exp_host.py, HOST_ORDER); bench step decode, this tree (bstep); bf16 against fp32 split-KV
# partials in the decode step (partials: exp_partials.py); the skinny GEMMs in other forms and
# with larger cuBLAS workspaces (gemm: exp_gemm_forms.py); what PDL saves between small kernels
# (pdlgap: exp_pdl_gap.py) and in the decode step (pdlstep: exp_pdl_step.py); earlier drivers'
# parts:
# tests, step, prefill, capture, generate.
set -u
OUT=$(realpath ${OUT:-out}); mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site
HERE=docs/perf/2026-11-23-run68
for part in ${*:-timeline}; do
  echo "=== $part $(date -u +%H:%M:%S)"
  case $part in
    timeline) timeout 300 python3 $HERE/exp_timeline.py ${TL_ARGS:-} > "$OUT/timeline.log" 2>&1
              grep -v Warning "$OUT/timeline.log" | grep -v "^  " ;;
    moetl) timeout 200 python3 $HERE/exp_moe_timeline.py --tokens ${MOE_T:-4096} \
             > "$OUT/moe_timeline.log" 2>&1
           grep -v Warning "$OUT/moe_timeline.log" | grep -v "^  " ;;
    moevar) timeout 400 python3 $HERE/exp_moe_variants.py --tokens ${MOE_T:-4096 8192} \
              --parts ${MOEVAR_PARTS:-silu layer prefill} > "$OUT/moe_variants.log" 2>&1
            grep -v Warning "$OUT/moe_variants.log" | grep -v "^  " ;;
    bmoe) for v in ${BMOE_ORDER:-new base}; do  # bench moe, trees in turn
            d=.; [ $v = base ] && d=baseline
            (cd $d && PYTHONPATH=.:/tmp/site timeout 300 python3 -m scripts.bench moe \
               --tokens ${BMOE_T:-4096 8192} > "$OUT/bmoe_$v.log" 2>&1)
            echo "--- $v"; grep -E "^# | fused " "$OUT/bmoe_$v.log" | head -12
          done ;;
    pfstep) timeout 500 python3 $HERE/exp_prefetch_step.py ${PF_ARGS:-} > "$OUT/pfstep.log" 2>&1
            grep -v Warning "$OUT/pfstep.log" | grep -v "^  " ;;
    host) for v in ${HOST_ORDER:-new base}; do  # host time of a compiled full step, trees in turn
            d=.; [ $v = base ] && d=baseline
            (cd $d && PYTHONPATH=.:/tmp/site timeout 300 python3 $OLDPWD/$HERE/exp_host.py \
               > "$OUT/host_$v.log" 2>&1)
            echo "--- $v"; grep -v Warning "$OUT/host_$v.log" | grep -v "^  "
          done ;;
    bstep) timeout 500 python3 -m scripts.bench step --parts decode --contexts 1024 4096 \
             --out "$OUT/step" > "$OUT/bstep.log" 2>&1
           grep -A11 "## decode step" "$OUT/bstep.log" ;;
    partials) timeout 500 python3 $HERE/exp_partials.py > "$OUT/partials.log" 2>&1
              grep -v Warning "$OUT/partials.log" | grep -v "^  " ;;
    gemm) timeout 200 python3 $HERE/exp_gemm_forms.py > "$OUT/gemm_forms.log" 2>&1
          grep -v Warning "$OUT/gemm_forms.log" | grep -v "^  "
          TORCH_CUBLASLT_WORKSPACE_SIZE=65536 CUBLAS_WORKSPACE_CONFIG=:65536:8 timeout 200 \
            python3 $HERE/exp_gemm_forms.py > "$OUT/gemm_forms_ws.log" 2>&1
          grep -v Warning "$OUT/gemm_forms_ws.log" | grep -v "^  " ;;
    pdlgap) timeout 200 python3 $HERE/exp_pdl_gap.py > "$OUT/pdl_gap.log" 2>&1
            grep -v Warning "$OUT/pdl_gap.log" | grep -v "^  " ;;
    pdlstep) timeout 400 python3 $HERE/exp_pdl_step.py > "$OUT/pdl_step.log" 2>&1
             grep -v Warning "$OUT/pdl_step.log" | grep -v "^  " ;;
    l2) timeout 300 python3 $HERE/exp_l2.py ${SLEEP:-30000} > "$OUT/l2.log" 2>&1
        grep -v Warning "$OUT/l2.log" | grep -v "^  " ;;
    tests|step|prefill|capture|generate)
      OUT=$OUT bash docs/perf/2026-11-23-run58/run.sh $part 2>&1 | grep -v "^===" ;;
  esac
done
