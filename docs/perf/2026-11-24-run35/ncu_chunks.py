"""The MoE experts of one V2-Lite layer at a few tokens, for Nsight Compute (run 37 on): the
table's three launches (`tab`) or the chunks path (`ch`, `ch-t`: exp_chunks.py's variants),
called 6 times eagerly on fixed routing.

    ncu ... python3 ncu_chunks.py --tokens 1 --variant ch
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exp_chunks import config_of, transposed_layer  # noqa: E402

from mla_func.config import MLAConfig  # noqa: E402
from scripts.bench_moe import fused_layer, make_layers  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, default=1)
p.add_argument("--variant", default="ch")
args = p.parse_args()
cfg = MLAConfig.preset("v2-lite")
layer = make_layers(cfg, 1)[0]
x = torch.randn(args.tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
conf = config_of(args.variant, args.tokens)
run = transposed_layer(layer) if args.variant.endswith("-t") else (
    lambda x, layer, c, conf: fused_layer(x, layer, c, conf))
for _ in range(6):
    run(x, layer, cfg, conf)
torch.cuda.synchronize()
