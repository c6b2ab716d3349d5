"""MLA decode at 128 heads (V3): the score -> value product through scratch (`shared_p`), so
that the score dot splits its keys over the two warpgroups instead of both computing all of
it, against the default plan, page 64 (and page 1 at one size); each at the plan's split count
and at twice it.

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/2026-11-23-run1/exp_h128.py
"""
import sys
from dataclasses import replace

import torch

from mla_func.kernels.decode_plan import DecodeWorkspace, plan_decode
from mla_func.kernels.mla_decode import effective_plan, mla_decode
from scripts.bench_common import measure_ceilings
from scripts.bench_kernels import KV_LORA, decode_inputs, floors, plan_label, time_plan


def output(p, plan):
    batch, heads = p["q_nope"].shape[:2]
    ws = DecodeWorkspace()
    dev = torch.device("cuda")
    q_lat, o_lat, part_o, part_lse = ws.get(dev, torch.bfloat16, batch, heads, KV_LORA,
                                            plan.num_splits)
    scratch = None
    if plan.shared_p:
        scratch = ws.shared_p(dev, torch.bfloat16, batch, heads, plan)
        for buf in scratch:
            buf.fill_(float("nan"))
    q_lat.copy_(torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"]))
    o_lat.fill_(float("nan"))
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, o_lat, part_o, part_lse, None, scratch)
    return o_lat.float().clone()


def variants(default):
    """The default, and through scratch with 64-key tiles (and 32-key, 3 stages, where the
    default has them); each also at twice the splits."""
    shared = replace(default, shared_p=True, block_n=64, num_stages=2)
    plans = [default, shared]
    if default.block_n == 32:
        plans.append(replace(default, shared_p=True))
    return plans + [replace(p, num_splits=2 * p.num_splits) for p in plans]


def main() -> None:
    torch.manual_seed(0)
    quick = "--quick" in sys.argv
    ceil = measure_ceilings()
    ceil = {"copy_GBps": ceil["copy_gbs"], "matmul_TFLOPs": ceil["matmul_tflops"]}
    print(f"# {torch.cuda.get_device_name()}: {ceil}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(128, 128, 4096, 64), (128, 32, 4096, 64), (128, 8, 4096, 64), (128, 1, 1024, 64),
             (128, 128, 1024, 64), (128, 128, 16384, 64), (128, 128, 4096, 1)]
    if quick:
        cases = cases[:2]
    rows = []
    for heads, batch, ctx, page in cases:
        p = decode_inputs(heads, batch, ctx, page)
        default = plan_decode(batch, p["page_table"].shape[1] * page, sms, heads,
                              page_size=page)
        _, floor = floors(heads, batch, ctx, ceil)
        want = output(p, default)
        for plan in variants(default):
            try:
                us = time_plan(p, plan)
                got = output(p, plan)
                err = ((got - want).abs().max() / want.abs().max()).item()
                again = output(p, plan)  # a race shows as a moving result
                same = torch.equal(got.nan_to_num(), again.nan_to_num())
            except Exception as e:  # noqa: BLE001  (an experiment: report and go on)
                print(f"  H={heads} B={batch} {plan_label(plan)}: {type(e).__name__} "
                      f"{str(e)[:200]}", flush=True)
                continue
            ran = effective_plan(plan)
            line = (f"H={heads:3d} B={batch:3d} ctx={ctx:5d} page={page:2d} "
                    f"s={plan.num_splits:3d} {plan_label(plan):42s} {us:8.1f} us "
                    f"{us / floor:5.2f}x floor err {err:.1e} repeat-equal {same}"
                    f"{'' if ran == plan else ' ran as ' + plan_label(ran)}")
            print(line, flush=True)
            rows.append(line)
        del p
        torch.cuda.empty_cache()
    print("\n## summary")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
