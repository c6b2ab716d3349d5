"""The MoE table's choices between its measured rows (twenty-eighth session, 2026-11-25).

`merge_tail` (an expert's last tile of at most 64 rows taken by the program of the tile before
it) went into the table from 1025 tokens on measurements at 1024, 2048, 4096 and 8192 tokens
only (docs/perf/2026-11-25-h100-run1). This times the sizes in between, and `shared_stream`
(the shared experts on a side stream) where the table leaves it off, against the table:

- the table's config at each token count;
- the same with `merge_tail` flipped;
- the same with `shared_stream` flipped.

The MoE layer as `bench moe` times it (router + routed experts + shared experts, V2-Lite,
bf16, 4 weight sets a graph, random routing of random x), alternating rounds of CUDA-graph
replays, µs a layer, with each variant's output against the table's.

    PYTHONPATH=. python3 exp_mid.py [--tokens 1536 3072 4096] [--rounds 6]
"""

import argparse
import statistics
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms, measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1536, 3072, 4096])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}")
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    torch.manual_seed(0)
    layers = make_layers(cfg, 4)
    rows = []
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        table = pick_config(t)
        variants = {
            "table": table,
            f"merge_tail {not table.merge_tail}": replace(table, merge_tail=not table.merge_tail),
            f"shared_stream {not table.shared_stream}": replace(
                table, shared_stream=not table.shared_stream),
        }
        want = fused_layer(x, layers[0], cfg, table)
        floor, _ = floor_us(x, layers, cfg, ceil)
        print(f"\n{t} tokens: table {table}; floor {floor:.1f} µs")
        for name, c in variants.items():
            got = fused_layer(x, layers[0], cfg, c)
            print(f"  {name}: equal to the table's output: {torch.equal(got, want)} "
                  f"(max |d| {(got.float() - want.float()).abs().max().item():.3g})")
        names = list(variants)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                fn = lambda c=variants[name], x=x: [  # noqa: E731
                    fused_layer(x, layer, cfg, c) for layer in layers]
                times[name].append(graph_time_ms(fn, reps=20) * 1e3 / len(layers))
        base = statistics.median(times["table"])
        for name in names:
            us = statistics.median(times[name])
            print(f"  {name:20s} {us:8.1f} µs {100 * (us / base - 1):+5.1f}%  x floor "
                  f"{us / floor:.3f}  rounds " + " ".join(f"{v:.1f}" for v in times[name]))
            rows.append((t, name, us, 100 * (us / base - 1), us / floor,
                         min(times[name]), max(times[name])))
    print("\n| tokens | variant | µs (rounds) | change | × floor |")
    print("|---|---|---|---|---|")
    for t, name, us, change, ratio, lo, hi in rows:
        print(f"| {t} | {name} | {us:.1f} ({lo:.1f}–{hi:.1f}) | {change:+.1f}% | {ratio:.3f} |")


if __name__ == "__main__":
    main()
