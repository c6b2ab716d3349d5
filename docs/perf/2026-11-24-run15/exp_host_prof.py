"""cProfile of 200 eager calls of the warp-specialised decode (B=1, ctx 4096, 128 heads): where
the host time of a launch goes.

    PYTHONPATH=. python3 docs/perf/2026-11-24-run15/exp_host_prof.py
"""

import cProfile
import pstats

import torch

from mla_func.kernels.decode_plan import DecodeWorkspace, plan_decode
from mla_func.kernels.mla_decode import mla_decode
from scripts.bench_kernels import KV_LORA, decode_inputs

p = decode_inputs(128, 1, 4096, 64)
sms = torch.cuda.get_device_properties(0).multi_processor_count
plan = plan_decode(1, p["page_table"].shape[1] * 64, sms, 128, page_size=64, ws=True)
work = DecodeWorkspace()
q_lat, o_lat, part_o, part_lse = work.get(torch.device("cuda"), torch.bfloat16, 1, 128, KV_LORA,
                                          plan.num_splits)


def call():
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, o_lat, part_o, part_lse)


for _ in range(20):
    call()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(200):
    call()
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
