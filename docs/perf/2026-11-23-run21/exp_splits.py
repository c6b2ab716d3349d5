"""Split counts of the 16-head decode at context 1024 around the default plan, with the page
table as wide as in the decode-step benchmark (8256 keys of capacity) and as wide as the
context: split kernel + merge, µs (scripts/bench_kernels.time_plan, graph replay).

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_splits.py
"""

from dataclasses import replace

import torch

from mla_func.kernels.decode_plan import num_sms, plan_decode
from scripts.bench_kernels import decode_inputs, plan_label, time_plan

sms = num_sms(torch.device("cuda"))
for batch in (1, 8, 32, 128):
    for capacity in (1024, 8256):
        p = decode_inputs(16, batch, 1024, 64)
        cols = capacity // 64 + (capacity % 64 > 0)
        table = torch.zeros(batch, cols, dtype=torch.int32, device="cuda")
        table[:, : p["page_table"].shape[1]] = p["page_table"]
        p["page_table"] = table
        default = plan_decode(batch, cols * 64, sms, 16)
        rows = []
        cands = sorted({1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32} | {default.num_splits})
        for s in cands:
            if batch * s > 4 * 264 or (s > 32):
                continue
            for bn in (32, 64):
                plan = replace(default, num_splits=s, block_n=bn,
                               num_stages=3 if bn == 32 else 2)
                us = time_plan(p, plan)
                rows.append((us, s, bn, plan == default))
        best = min(rows)
        d = [r for r in rows if r[3]]
        print(f"## B={batch} capacity={cols * 64}: default s={default.num_splits} "
              f"{plan_label(default)} {d[0][0] if d else float('nan'):.1f} us; best s={best[1]} "
              f"n{best[2]} {best[0]:.1f} us", flush=True)
        print("   " + "  ".join(f"s{s}n{bn}:{us:.1f}" for us, s, bn, _ in sorted(rows,
              key=lambda r: (r[1], r[2]))), flush=True)
