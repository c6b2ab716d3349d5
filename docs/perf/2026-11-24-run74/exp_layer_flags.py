"""The V2-Lite MoE layer alone (scripts.bench_moe's `fused_layer`: fused router, then the
Triton experts; 4 distinct layers a CUDA graph) with module constants set otherwise, against
the tree, in one process, alternating rounds (2026-11-24, fifteenth session). Variants as in
2026-11-24-run57/exp_flags.py. µs a layer, medians of the rounds, with each round's spread.

    PYTHONPATH=. python3 exp_layer_flags.py [--tokens 4096] [--rounds 6]
        --variants tree mla_func.kernels.router._NUM_WARPS=4
"""

import argparse
import statistics
import sys

import torch

from mla_func.config import MLAConfig
from scripts.bench_common import cuda_time_ms
from scripts.bench_moe import fused_layer, make_layers

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/2026-11-24-run57")
from exp_flags import clear_caches, settings  # noqa: E402


def capture(x, layers, cfg, variant: str):
    saved = [(m, n, getattr(m, n)) for m, n, _ in settings(variant)]
    for m, n, v in settings(variant):
        setattr(m, n, type(getattr(m, n))(v))
    clear_caches(variant)
    try:
        def run():
            return [fused_layer(x, layer, cfg) for layer in layers]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                run()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = run()
    finally:
        for m, n, v in saved:
            setattr(m, n, v)
        clear_caches(variant)
    g.replay()
    torch.cuda.synchronize()
    return g, torch.stack([o.float() for o in out])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", nargs="+", required=True)
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    layers = make_layers(cfg, 4)
    variants = tuple(args.variants)
    print(f"# {torch.cuda.get_device_name()}")
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        graphs = {v: capture(x, layers, cfg, v) for v in variants}
        ref = graphs[variants[0]][1]
        times: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30) * 1e3 / len(layers))
        print(f"{t} tokens:", flush=True)
        for v in variants:
            o = graphs[v][1]
            err = ((o - ref).abs().max() / ref.abs().max()).item()
            ts = times[v]
            print(f"  {v}: {statistics.median(ts):.1f} us (rounds {min(ts):.1f}-{max(ts):.1f};"
                  f" out rel diff {err:.2g}, bit-equal {torch.equal(o, ref)})", flush=True)
        del graphs


if __name__ == "__main__":
    main()
