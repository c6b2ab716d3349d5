"""The 16-head decode's split kernel + merge with the default plan, page 64, with the page
table as wide as the decode-step benchmark's (8256 keys) and as the context, µs
(scripts/bench_kernels.time_plan; median of 3). Run in each tree (run.sh part `mergeab`): the
new tile merge reads only the splits a row's length reaches, the baseline's reads them all.

Run from a tree's root: PYTHONPATH=. python3 <this file>
"""

import torch

from mla_func.kernels.decode_plan import num_sms, plan_decode
from scripts.bench_kernels import decode_inputs, time_plan

sms = num_sms(torch.device("cuda"))
for ctx in (1024, 4096):
    for batch in (1, 8, 32, 128):
        for capacity in sorted({ctx, 8256}):
            p = decode_inputs(16, batch, ctx, 64)
            cols = -(-capacity // 64)
            table = torch.zeros(batch, cols, dtype=torch.int32, device="cuda")
            table[:, : p["page_table"].shape[1]] = p["page_table"]
            p["page_table"] = table
            plan = plan_decode(batch, cols * 64, sms, 16)
            us = sorted(time_plan(p, plan) for _ in range(3))[1]
            print(f"## ctx={ctx} B={batch} capacity={cols * 64} splits={plan.num_splits}: "
                  f"{us:.1f} us", flush=True)
