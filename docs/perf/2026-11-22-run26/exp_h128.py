"""MLA decode at 128 heads (V3): tilings the plan sweep never timed (64-key tiles at 2 stages
shrank from 3 stages and were skipped; 16 warps), against the default plan, page 64.

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/.../exp_h128.py
"""
from dataclasses import replace

import torch

from mla_func.kernels.decode_plan import DecodeWorkspace, plan_decode
from mla_func.kernels.mla_decode import effective_plan, mla_decode
from scripts.bench_common import measure_ceilings
from scripts.bench_kernels import KV_LORA, decode_inputs, floors, plan_label, time_plan


def output(p, plan):
    batch, heads = p["q_nope"].shape[:2]
    ws = DecodeWorkspace()
    q_lat, o_lat, part_o, part_lse = ws.get(torch.device("cuda"), torch.bfloat16, batch, heads,
                                            KV_LORA, plan.num_splits)
    q_lat.copy_(torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"]))
    o_lat.fill_(float("nan"))
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, o_lat, part_o, part_lse, None)
    return o_lat.float().clone()


def main() -> None:
    torch.manual_seed(0)
    ceil = measure_ceilings()
    ceil = {"copy_GBps": ceil["copy_gbs"], "matmul_TFLOPs": ceil["matmul_tflops"]}
    print(f"# {torch.cuda.get_device_name()}: {ceil}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, ctx in ((128, 4096), (32, 4096)):
        p = decode_inputs(128, batch, ctx, 64)
        default = plan_decode(batch, p["page_table"].shape[1] * 64, sms, 128)
        _, floor = floors(128, batch, ctx, ceil)
        want = output(p, default)
        for plan in [default, replace(default, block_n=64, num_stages=2),
                     replace(default, block_n=64, num_stages=1),
                     replace(default, block_n=16, num_stages=4),
                     replace(default, num_stages=4),
                     replace(default, num_warps=16),
                     replace(default, block_n=64, num_stages=2, num_warps=16),
                     replace(default, block_h=128, num_warps=16, num_stages=2),
                     replace(default, num_splits=2 * default.num_splits),
                     replace(default, block_n=64, num_stages=2,
                             num_splits=2 * default.num_splits)]:
            try:
                us = time_plan(p, plan)
                got = output(p, plan)
                err = ((got - want).abs().max() / want.abs().max()).item()
            except Exception as e:  # noqa: BLE001  (an experiment: report and go on)
                print(f"  B={batch} {plan_label(plan)}: {type(e).__name__} {str(e)[:200]}")
                continue
            ran = effective_plan(plan)
            print(f"  H=128 B={batch} ctx={ctx} s={plan.num_splits:3d} {plan_label(plan):32s} "
                  f"{us:8.1f} us {us / floor:5.2f}x floor err {err:.1e}"
                  f"{'' if ran == plan else ' ran as ' + plan_label(ran)}", flush=True)


if __name__ == "__main__":
    main()
