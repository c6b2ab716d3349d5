"""(Copied from 2026-11-23-run83 for run 43.) The decode split kernel alone at V2-Lite shape (16 heads, page 64, capacity 8256 keys), for
Nsight Compute (`run.sh ncu`): B rows with `ctx` cached keys each, the default plan (or with
keys along M, other tiles or splits), 5 calls.

    PYTHONPATH=.:tests python3 ncu_split.py [--batch 32] [--ctx 1024] [--keys-m]
        [--block-n 64] [--splits 4]
"""

import argparse
from dataclasses import replace

import torch
from mla_helpers import make_problem, ref_args

from mla_func.kernels.mla_decode import DecodeWorkspace, attend_absorbed, num_sms, plan_decode

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--ctx", type=int, default=1024)
p.add_argument("--keys-m", action="store_true", help="DecodePlan.keys_m")
p.add_argument("--block-n", type=int, default=0)
p.add_argument("--splits", type=int, default=0)
args = p.parse_args()
dims = {"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
prob = make_problem([args.ctx] * args.batch, [1] * args.batch, 64, dims, "cuda",
                    torch.bfloat16, max_pages=129)
plan = plan_decode(args.batch, 129 * 64, num_sms(torch.device("cuda")), 16)
fields = {"keys_m": True} if args.keys_m else {}  # keys_m: needs keys_m.patch
if args.block_n:
    fields.update(block_n=args.block_n, num_stages=2 if args.block_n >= 64 else 3)
if args.splits:
    fields["num_splits"] = args.splits
plan = replace(plan, **fields)
print(plan)
ws = DecodeWorkspace()
for _ in range(5):
    attend_absorbed(*ref_args(prob), ws, plan)
torch.cuda.synchronize()
print("done")
