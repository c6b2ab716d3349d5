"""The routed down GEMM of the V2-Lite MoE layer at large steps: the tree's Triton kernel
(halves at 4096+ tokens, whole tiles below) against `moe_down_sm90` (persistent Gluon,
whole 128-row tiles), in one process (2026-11-24, sixteenth session).

layer: scripts.bench_moe's `fused_layer` with each config, 4 distinct layers a CUDA graph,
alternating rounds, µs a layer (medians, each round's spread), outputs against the tree's;
then one profiled replay of each graph: every kernel's summed duration, µs a layer.
dense: cuBLAS on the dense GEMM of the down shape (act rows x moe_inter -> hidden).

    PYTHONPATH=. python3 exp_down.py [--tokens 4096] [--rounds 6] [--variants tree g4 ...]

Runs on commit de30564 (run 81). Run 82 ran a later form of that commit's moe_down_sm90.py
(the tile's expert loaded once a tile, not once a K step), which was measured and then
removed uncommitted together with the kernel (`MoEConfig.sm90_down` and moe_down_sm90.py are
not in the package after the sixteenth session); the g* variants need de30564's tree.
"""

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import cuda_time_ms
from scripts.bench_moe import fused_layer, make_layers

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/2026-11-23-run68")
from exp_timeline import kernels_of, short  # noqa: E402


def variant_config(name: str, t: int):
    base = pick_config(t)
    g = replace(base, halves=False, tma=True, sm90_down=True)
    return {
        "tree": base,
        "whole": replace(base, halves=False),
        "g4": g,
        "g3": replace(g, down=(256, 64, 8, 3)),
        "g128": replace(g, down=(128, 64, 8, 4)),
        "g4k128": replace(g, down=(256, 128, 8, 2)),
    }[name]


def capture(x, layers, cfg, config):
    def run():
        return [fused_layer(x, layer, cfg, config) for layer in layers]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    g.replay()
    torch.cuda.synchronize()
    return g, torch.stack([o.float() for o in out])


def dense(t: int, cfg) -> None:
    """cuBLAS on dense GEMMs of the routed shapes, at about the padded layout's rows: down
    (moe_inter -> hidden) and gate_up (hidden -> 2 moe_inter)."""
    rows = -(-t * cfg.num_experts_per_tok // 128) * 128 + 64 * 128
    h, i = cfg.hidden_size, cfg.moe_intermediate_size
    for k, n in ((i, h), (h, 2 * i)):
        a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ms = cuda_time_ms(lambda: a @ w.T, reps=30)  # noqa: B023
        print(f"  cuBLAS dense {rows}x{k}->{n}: {ms * 1e3:.1f} us, "
              f"{2 * rows * k * n / ms / 1e9:.0f} TFLOP/s")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", nargs="+", default=["tree", "whole", "g4", "g3", "g128"])
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    layers = make_layers(cfg, 4)
    print(f"# {torch.cuda.get_device_name()}")
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        graphs = {}
        for v in args.variants:
            try:
                graphs[v] = capture(x, layers, cfg, variant_config(v, t))
            except Exception as err:  # noqa: BLE001  (a variant that fails is reported)
                print(f"  {v}: {type(err).__name__}: {err}"[:400], flush=True)
        names = list(graphs)
        ref = graphs[names[0]][1]
        times: dict[str, list[float]] = {v: [] for v in names}
        for r in range(args.rounds):
            for v in (names if r % 2 == 0 else names[::-1]):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30) * 1e3 / len(layers))
        print(f"{t} tokens:", flush=True)
        for v in names:
            o = graphs[v][1]
            err = ((o - ref).abs().max() / ref.abs().max()).item()
            ts = times[v]
            print(f"  {v}: {statistics.median(ts):.1f} us (rounds {min(ts):.1f}-{max(ts):.1f};"
                  f" out rel diff {err:.2g}, bit-equal {torch.equal(o, ref)})", flush=True)
        for v in names:
            sums: dict[str, float] = defaultdict(float)
            for name, _, dur in kernels_of(graphs[v][0].replay):
                sums[short(name)] += dur / len(layers)
            top = sorted(sums.items(), key=lambda kv: -kv[1])
            print(f"  {v} kernels (us a layer): "
                  + ", ".join(f"{n} {d:.1f}" for n, d in top[:9]), flush=True)
        dense(t, cfg)
        del graphs


if __name__ == "__main__":
    main()
