"""Run 27 only: a variant that was not kept (`DecodePlan.min_keys`, splits of at least 64
keys, with the tile merge reading only the splits a row uses), so this script no longer runs
on the tree. It timed that variant against min_keys 0, 16 heads, page 64, split kernel +
merge, µs (scripts/bench_kernels.time_plan), with the page table as wide as the decode-step
benchmark's (8256 keys) and as the context. Alternating, 3 rounds, medians.
"""

from dataclasses import replace

import torch

from mla_func.kernels.decode_plan import num_sms, plan_decode
from scripts.bench_kernels import decode_inputs, plan_label, time_plan

sms = num_sms(torch.device("cuda"))
for ctx in (1024, 4096):
    for batch in (1, 8, 32, 128):
        for capacity in sorted({ctx, 8256}):
            p = decode_inputs(16, batch, ctx, 64)
            cols = -(-capacity // 64)
            table = torch.zeros(batch, cols, dtype=torch.int32, device="cuda")
            table[:, : p["page_table"].shape[1]] = p["page_table"]
            p["page_table"] = table
            new = plan_decode(batch, cols * 64, sms, 16)
            old = replace(new, min_keys=0)
            t = {"new": [], "old": []}
            for _ in range(3):
                t["new"].append(time_plan(p, new))
                t["old"].append(time_plan(p, old))
            n, o = sorted(t["new"])[1], sorted(t["old"])[1]
            print(f"## ctx={ctx} B={batch} capacity={cols * 64} s={new.num_splits} "
                  f"{plan_label(new)}: min_keys 64 {n:.1f} us, min_keys 0 {o:.1f} us "
                  f"({(o - n) / o * 100:+.0f}%)", flush=True)
