"""Host time of one fused MoE call (launches only, no sync), at 1 / 32 / 128 tokens: the
best of 30 timings of 20 calls."""
import time

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.router import route_fused
from mla_func.moe import experts
from scripts.bench_moe import make_layers

cfg = MLAConfig.preset("v2-lite")
layer = make_layers(cfg, 1)[0]
from mla_func.params import DenseMLP  # noqa: E402

shared = DenseMLP(layer.shared_gate_up, layer.shared_down)
for t in (1, 32, 128):
    x = torch.randn(t, 2048, device="cuda", dtype=torch.bfloat16)
    w, ids = route_fused(x, layer.router, None, cfg)
    for _ in range(5):
        experts(x, w, ids, layer.gate_up, layer.down, shared)
    torch.cuda.synchronize()
    best = []
    for _ in range(30):
        t0 = time.perf_counter()
        for _ in range(20):
            experts(x, w, ids, layer.gate_up, layer.down, shared)
        best.append((time.perf_counter() - t0) / 20 * 1e6)
        torch.cuda.synchronize()
    print(f"tokens {t}: host {min(best):.1f} us per experts() call", flush=True)
