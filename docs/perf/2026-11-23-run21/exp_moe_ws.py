"""The MoE layer (router + routed + shared experts, CUDA graph of 4 layers) with the config
table's Triton GEMMs against the warp-specialised Gluon GEMMs (MoEConfig.ws), same process,
alternating rounds; outputs compared bit for bit.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_moe_ws.py
"""

import sys
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us

tokens = [int(t) for t in sys.argv[1:]] or [1024, 2048, 4096, 6144]
torch.manual_seed(0)
cfg = MLAConfig.preset("v2-lite")
ceil = measure_ceilings()
print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s, "
      f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
layers = make_layers(cfg, 4)
for t in tokens:
    x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    floor, _ = floor_us(x, layers, cfg, ceil)
    base = replace(pick_config(t), ws=False)
    ws = replace(base, ws=True)
    same = all(torch.equal(fused_layer(x, layer, cfg, base), fused_layer(x, layer, cfg, ws))
               for layer in layers)
    times = {"triton": [], "ws": []}
    for _ in range(3):
        for name, c in (("triton", base), ("ws", ws)):
            times[name].append(time_layer_us(
                lambda x, layer, cfg, c=c: fused_layer(x, layer, cfg, c), x, layers, cfg))
    med = {k: sorted(v)[1] for k, v in times.items()}
    print(f"## {t} tokens: floor {floor:.0f} us; triton {med['triton']:.0f} us "
          f"({med['triton'] / floor:.2f}x) {times['triton']}; ws {med['ws']:.0f} us "
          f"({med['ws'] / floor:.2f}x) {[round(v, 1) for v in times['ws']]}; "
          f"bit-identical: {same}", flush=True)
