"""`plan_decode`'s `waves` (programs per SM the split count aims at): 1 against the default
2, 16 heads, page 64, split kernel + merge, µs (scripts/bench_kernels.time_plan), with the page
table as wide as the decode-step benchmark's (8256 keys) and as the context. Alternating, 3
rounds, medians.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_waves.py
"""

import torch

from mla_func.kernels.decode_plan import num_sms, plan_decode
from scripts.bench_kernels import decode_inputs, time_plan

sms = num_sms(torch.device("cuda"))
for ctx in (1024, 4096, 16384):
    for batch in (1, 8, 32, 128):
        for capacity in sorted({ctx, max(ctx, 8256)}):
            p = decode_inputs(16, batch, ctx, 64)
            cols = -(-capacity // 64)
            table = torch.zeros(batch, cols, dtype=torch.int32, device="cuda")
            table[:, : p["page_table"].shape[1]] = p["page_table"]
            p["page_table"] = table
            plans = {w: plan_decode(batch, cols * 64, sms, 16, waves=w) for w in (1, 2)}
            t = {w: [] for w in plans}
            for _ in range(3):
                for w, plan in plans.items():
                    t[w].append(time_plan(p, plan))
            med = {w: sorted(v)[1] for w, v in t.items()}
            gain = (med[2] - med[1]) / med[2] * 100
            print(f"## ctx={ctx} B={batch} capacity={cols * 64}: waves 1 (s={plans[1].num_splits}"
                  f" n{plans[1].block_n}) {med[1]:.1f} us, waves 2 (s={plans[2].num_splits} "
                  f"n{plans[2].block_n}) {med[2]:.1f} us ({gain:+.0f}%)", flush=True)
