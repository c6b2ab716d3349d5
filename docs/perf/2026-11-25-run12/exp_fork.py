"""Where the shared experts' side stream forks (twenty-ninth session, 2026-11-25).

`MoEConfig.shared_stream` forks the shared experts (cuBLAS GEMMs, tensor-bound) off right
after the router, so they run beside the alignment and the routed gate_up, itself
tensor-bound. The routed down GEMM is the layer's memory-heavy part (its weights, `act` and
the pair rows it writes: ~540 MB at 4096 tokens, against ~180 µs of products; `exp_units.py`
found it far from linear in its rows). `shared_late` forks them after the routed gate_up,
beside the down GEMM instead. This times, at each token count, the table's config against the
side stream forked early and late: the MoE layer as `bench moe` times it (router + routed +
shared experts, V2-Lite, bf16, 4 weight sets, random routing of random x), alternating
rounds, µs a layer, in CUDA graphs and eagerly (the 4 layers back to back, no sync between
calls: steps past 2560 tokens run eagerly in every mode); each output against the table's.

`shared_late` was an experimental `MoEConfig` field of a1f538d, the commit this ran on (run
13); it lost everywhere in graphs and was removed after it.

    PYTHONPATH=. python3 exp_fork.py [--tokens 1024 2048 2560 3072 4096 8192] [--rounds 6]
"""

import argparse
import statistics
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms, measure_ceilings, pipelined_ms
from scripts.bench_moe import floor_us, fused_layer, make_layers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 2560, 3072, 4096, 8192])
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
            "stream early": replace(table, shared_stream=True, shared_late=False),
            "stream late": replace(table, shared_stream=True, shared_late=True),
        }
        want = fused_layer(x, layers[0], cfg, table)
        floor, _ = floor_us(x, layers, cfg, ceil)
        print(f"\n{t} tokens: table {table}; floor {floor:.1f} µs")
        for name, c in variants.items():
            got = fused_layer(x, layers[0], cfg, c)
            print(f"  {name}: equal to the table's output: {torch.equal(got, want)}")
        names = list(variants)
        times = {(mode, name): [] for mode in ("graph", "eager") for name in names}
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                fn = lambda c=variants[name], x=x: [  # noqa: E731
                    fused_layer(x, layer, cfg, c) for layer in layers]
                times["graph", name].append(graph_time_ms(fn, reps=20) * 1e3 / len(layers))
                times["eager", name].append(pipelined_ms(fn, calls=5, reps=5) * 1e3
                                            / len(layers))
        for mode in ("graph", "eager"):
            base = statistics.median(times[mode, "table"])
            for name in names:
                v = times[mode, name]
                us = statistics.median(v)
                print(f"  {mode} {name:14s} {us:8.1f} µs {100 * (us / base - 1):+5.1f}%  "
                      f"x floor {us / floor:.3f}  rounds " + " ".join(f"{u:.1f}" for u in v))
                rows.append((t, mode, name, us, 100 * (us / base - 1), us / floor, min(v),
                             max(v)))
    print("\n| tokens | mode | variant | µs (rounds) | change | × floor |")
    print("|---|---|---|---|---|---|")
    for t, mode, name, us, change, ratio, lo, hi in rows:
        print(f"| {t} | {mode} | {name} | {us:.1f} ({lo:.1f}–{hi:.1f}) | {change:+.1f}% | "
              f"{ratio:.3f} |")


if __name__ == "__main__":
    main()
