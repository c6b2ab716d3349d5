"""The warp-specialised 128-head decode (kernels/mla_decode_ws.py) against the Triton plan,
split kernel + merge, µs from CUDA-graph replays (scripts/bench_kernels.time_plan), next to
the floor measured in the same process. Page 64, V3's 128 heads, every row at ctx keys.

    PYTHONPATH=. python3 docs/perf/2026-11-24-run15/exp_ws.py [--batch ..] [--ctx ..]
"""

import argparse
from dataclasses import replace

import torch

from mla_func.kernels.decode_plan import plan_decode
from scripts.bench_kernels import ceilings, decode_inputs, floors, plan_label, time_plan

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096, 16384])
ap.add_argument("--heads", type=int, default=128)
ap.add_argument("--tiles", nargs="+", default=["32x4", "64x2", "32x3"])
ap.add_argument("--splits", type=int, nargs="*", default=[], help="splits to try besides the "
                "plan's and one / two waves of one program a SM")
args = ap.parse_args()
ceil = ceilings()
print(f"copy {ceil['copy_GBps']:.0f} GB/s, matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s",
      flush=True)
sms = torch.cuda.get_device_properties(0).multi_processor_count
rows = []
for ctx in args.ctx:
    for batch in args.batch:
        p = decode_inputs(args.heads, batch, ctx, 64)
        plan = plan_decode(batch, p["page_table"].shape[1] * 64, sms, args.heads, page_size=64)
        _, floor_us = floors(args.heads, batch, ctx, ceil)
        base_us = time_plan(p, plan)
        # One program a SM: splits that fill one or two waves of 132, and the plan's.
        heads_blocks = -(-args.heads // 64)
        cands = sorted({plan.num_splits, max(1, -(-sms // (batch * heads_blocks))),
                        max(1, -(-2 * sms // (batch * heads_blocks))), *args.splits})
        best = None
        for tile in args.tiles:
            bn, st = (int(x) for x in tile.split("x"))
            for s in [s for s in cands if s <= min(128, ctx // bn)]:
                wp = replace(plan, ws=True, shared_p=False, block_n=bn, num_stages=st,
                             num_splits=s)
                us = time_plan(p, wp)
                print(f"  B={batch:4d} ctx={ctx:6d} ws n{bn} st{st} splits {s:3d}: "
                      f"{us:8.1f} us  x{us / floor_us:5.2f}", flush=True)
                if best is None or us < best[0]:
                    best = (us, bn, st, s)
        rows.append((batch, ctx, plan.num_splits, base_us, best, floor_us))
        print(f"B={batch:4d} ctx={ctx:6d} triton {plan_label(plan)} splits {plan.num_splits}: "
              f"{base_us:8.1f} us x{base_us / floor_us:5.2f} | best ws {best[0]:8.1f} us "
              f"x{best[0] / floor_us:5.2f} (n{best[1]} st{best[2]} splits {best[3]}) | floor "
              f"{floor_us:7.1f}", flush=True)
        del p
        torch.cuda.empty_cache()
print("\n| B | ctx | Triton plan µs | × floor | ws best µs | × floor | ws config | floor µs |")
print("|---|---|---|---|---|---|---|---|")
for batch, ctx, splits, base_us, best, floor_us in rows:
    print(f"| {batch} | {ctx} | {base_us:.1f} ({splits} splits) | {base_us / floor_us:.2f} | "
          f"{best[0]:.1f} | {best[0] / floor_us:.2f} | n{best[1]} st{best[2]} s{best[3]} | "
          f"{floor_us:.1f} |")
