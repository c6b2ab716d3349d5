"""The fused MoE layer alone at V2-Lite shape (router, alignment, gate_up, down, sum; shared
experts folded at these sizes) for Nsight Compute (`run.sh ncumoe`): `tokens` random rows,
the table's config or a variant of exp_moe_step.py, 5 calls.

    PYTHONPATH=. python3 ncu_moe.py [--tokens 128] [--variant cur]
"""

import argparse
import importlib.util
import os

import torch

from mla_func.config import MLAConfig
from scripts.bench_moe import fused_layer, make_layers

spec = importlib.util.spec_from_file_location(
    "exp_moe_step", os.path.join(os.path.dirname(__file__), "exp_moe_step.py"))
exp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(exp)

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, default=128)
p.add_argument("--variant", default="cur")
args = p.parse_args()
torch.manual_seed(0)
cfg = MLAConfig.preset("v2-lite")
layer = make_layers(cfg, 1)[0]
x = torch.randn(args.tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
moe = exp.config_of(args.variant, args.tokens)
print(moe)
for _ in range(5):
    fused_layer(x, layer, cfg, moe)
torch.cuda.synchronize()
print("done")
