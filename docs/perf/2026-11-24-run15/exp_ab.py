"""A/B in one process: the warp-specialised split kernel as committed before the q_lat TMA
load (ws_prev.py, a frozen copy of commit 58344cf's mla_decode_ws.py) against the tree's,
split + merge under the same plan, alternating rounds, medians (µs, CUDA-graph replays).

    PYTHONPATH=. python3 docs/perf/2026-11-24-run15/exp_ab.py
"""

import os
import statistics
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ws_prev  # noqa: E402

from mla_func.kernels import mla_decode as md  # noqa: E402
from mla_func.kernels import mla_decode_ws as ws_new  # noqa: E402
from mla_func.kernels.decode_plan import plan_decode  # noqa: E402
from scripts.bench_kernels import ceilings, decode_inputs, floors, time_plan  # noqa: E402

ceil = ceilings()
print(f"copy {ceil['copy_GBps']:.0f} GB/s, matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s")
sms = torch.cuda.get_device_properties(0).multi_processor_count
for batch, ctx in ((1, 4096), (8, 1024), (32, 1024), (32, 4096), (128, 1024), (128, 4096),
                   (128, 16384)):
    p = decode_inputs(128, batch, ctx, 64)
    plan = plan_decode(batch, p["page_table"].shape[1] * 64, sms, 128, page_size=64, ws=True)
    _, floor_us = floors(128, batch, ctx, ceil)
    times = {"prev": [], "new": []}
    for _ in range(3):
        for name, mod in (("prev", ws_prev), ("new", ws_new)):
            md.decode_ws = mod.decode_ws  # what mla_decode launches
            times[name].append(time_plan(p, plan))
    md.decode_ws = ws_new.decode_ws
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"B={batch:4d} ctx={ctx:6d} splits {plan.num_splits:3d}: prev {med['prev']:8.1f} "
          f"new {med['new']:8.1f} us (x{med['prev'] / floor_us:.2f} / x{med['new'] / floor_us:.2f})"
          f"  rounds prev {[round(t, 1) for t in times['prev']]} new "
          f"{[round(t, 1) for t in times['new']]}", flush=True)
    del p
    torch.cuda.empty_cache()
