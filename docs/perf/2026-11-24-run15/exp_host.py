"""Host time of one eager decode call (split kernel + merge launches, no sync inside), the
warp-specialised kernel (its two TMA descriptors built per call) against the Triton plan, at
128 heads, page 64: what eager and piecewise modes pay per layer on the CPU.

    PYTHONPATH=. python3 docs/perf/2026-11-24-run15/exp_host.py
"""

import time

import torch

from mla_func.kernels.decode_plan import DecodeWorkspace, plan_decode
from mla_func.kernels.mla_decode import mla_decode
from scripts.bench_kernels import KV_LORA, decode_inputs

sms = torch.cuda.get_device_properties(0).multi_processor_count
for batch, ctx in ((1, 4096), (32, 4096), (128, 1024)):
    p = decode_inputs(128, batch, ctx, 64)
    cap = p["page_table"].shape[1] * 64
    for name, ws in (("triton", False), ("ws", True)):
        plan = plan_decode(batch, cap, sms, 128, page_size=64, ws=ws)
        work = DecodeWorkspace()
        dev = torch.device("cuda")
        q_lat, o_lat, part_o, part_lse = work.get(dev, torch.bfloat16, batch, 128, KV_LORA,
                                                  plan.num_splits)
        q_lat.normal_()
        counters = work.counters(dev, batch * 128)
        scratch = work.shared_p(dev, torch.bfloat16, batch, 128, plan) if plan.shared_p else None

        def call():
            mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"],
                       p["positions"], p["scale"], plan, o_lat, part_o, part_lse, counters,
                       scratch)

        for _ in range(20):
            call()
        torch.cuda.synchronize()
        host = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(50):
                call()
            host.append((time.perf_counter() - t0) / 50 * 1e6)
            torch.cuda.synchronize()
        host.sort()
        print(f"B={batch:4d} ctx={ctx:5d} {name:6s} splits {plan.num_splits:3d}: host "
              f"{host[2]:6.1f} us a call (rounds {host[0]:.1f}-{host[-1]:.1f})", flush=True)
    del p
    torch.cuda.empty_cache()
