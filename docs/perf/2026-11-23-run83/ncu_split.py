"""The decode split kernel alone at V2-Lite shape (16 heads, page 64, capacity 8256 keys), for
Nsight Compute (`run.sh ncu`): B rows with `ctx` cached keys each, the default plan, 5 calls.

    PYTHONPATH=.:tests python3 ncu_split.py [--batch 32] [--ctx 1024]
"""

import argparse

import torch
from mla_helpers import make_problem, ref_args

from mla_func.kernels.mla_decode import DecodeWorkspace, attend_absorbed

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--ctx", type=int, default=1024)
args = p.parse_args()
dims = {"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
prob = make_problem([args.ctx] * args.batch, [1] * args.batch, 64, dims, "cuda",
                    torch.bfloat16, max_pages=129)
ws = DecodeWorkspace()
for _ in range(5):
    attend_absorbed(*ref_args(prob), ws)
torch.cuda.synchronize()
print("done")
