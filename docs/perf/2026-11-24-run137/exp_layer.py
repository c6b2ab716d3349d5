"""The MoE layer (`scripts.bench_moe.fused_layer`: the fused router, then the Triton experts)
with this session's two changes against the code before, 2026-11-24, twenty-fourth session:
`new` (the tree: the router in the weights' dtype, bf16, and the alignment's rows kernel
summing the histories elementwise) against `old` (float32 routers and `align_before.py`'s rows
kernel). 4 distinct layers a CUDA graph, one process, alternating rounds, us a layer; the two
variants' outputs are compared (the same routing up to float32 summation order):

    PYTHONPATH=. python3 exp_layer.py [--tokens 512 4096 8192] [--rounds 8]
"""

import argparse
import dataclasses
import os
import statistics
import sys

import torch

from mla_func.config import MLAConfig
from mla_func.kernels import moe_align
from scripts.bench_common import cuda_time_ms
from scripts.bench_moe import fused_layer, make_layers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import align_before  # noqa: E402  (the alignment's kernels before run 139)

TREE_ROWS = moe_align._align_sliced_kernel


def capture(x, layers, cfg, variant):
    moe_align._align_sliced_kernel = (align_before._align_sliced_kernel if variant == "old"
                                      else TREE_ROWS)
    try:
        run = [dataclasses.replace(layer, router=layer.router.float()) if variant == "old"
               else layer for layer in layers]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                for layer in run:
                    fused_layer(x, layer, cfg)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = [fused_layer(x, layer, cfg) for layer in run]
    finally:
        moe_align._align_sliced_kernel = TREE_ROWS
    return g, outs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 4096, 8192])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    layers = make_layers(cfg, 4)
    assert layers[0].router.dtype == torch.bfloat16
    print(f"# {torch.cuda.get_device_name()}")
    for tokens in args.tokens:
        x = torch.randn(tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        graphs = {v: capture(x, layers, cfg, v) for v in ("new", "old")}
        for g, _ in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        diff = max((a - b).abs().max().item() for a, b in zip(graphs["new"][1],
                                                                graphs["old"][1]))
        times: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (("new", "old") if r % 2 == 0 else ("old", "new")):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=20) * 1000 / 4)
        for v in graphs:
            print(f"{tokens} tokens {v}: {statistics.median(times[v]):.1f} us a layer "
                  f"({min(times[v]):.1f}-{max(times[v]):.1f})", flush=True)
        print(f"{tokens} tokens: outputs max |new - old| {diff:.3g}")
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
