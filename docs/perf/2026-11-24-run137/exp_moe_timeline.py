"""Kernel timeline of the V2-Lite MoE layer (scripts.bench_moe's `fused_layer`: fused router,
then the Triton experts) at a large step, 4 distinct layers replayed as one CUDA graph (GPU):
each kernel of layer 2 with its start, duration and gap to the kernels before it.

    PYTHONPATH=. python3 exp_moe_timeline.py [--tokens 4096 8192]
"""

import argparse
import sys

import torch

from mla_func.config import MLAConfig
from scripts.bench_moe import fused_layer, make_layers

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from exp_timeline import kernels_of, short  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    layers = make_layers(cfg, 4)
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)

        def run():
            for layer in layers:
                fused_layer(x, layer, cfg)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                run()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        ks = kernels_of(g.replay)
        starts = [i for i, k in enumerate(ks) if "_router_kernel" in k[0]]
        t0, t1 = ks[0][1], max(k[1] + k[2] for k in ks)
        print(f"\n## MoE layer, {t} tokens: 4 layers {t1 - t0:.1f} us, "
              f"{(t1 - t0) / 4:.1f} us a layer")
        a, b = starts[2], starts[3]
        base, end = ks[a][1], ks[a - 1][1] + ks[a - 1][2]
        print("| kernel | start us | dur us | gap us |")
        print("|---|---|---|---|")
        for name, ts, dur in ks[a:b]:
            print(f"| {short(name)} | {ts - base:7.2f} | {dur:6.2f} | {ts - end:+6.2f} |")
            end = max(end, ts + dur)


if __name__ == "__main__":
    main()
