"""An expert's tail taken by the tile before it (`MoEConfig.merge_tail`) against the table's
tiles, at the large token counts (twenty-seventh session, 2026-11-25).

The table pads each expert's run to 128-row tiles from 1024 tokens, and from 4096 tokens to
64-row units two a program (`halves`: the end of one expert's run and the start of the next
as two half tiles, each reading a whole weight tile for 64 rows). With `merge_tail` the runs
are 128-row tiles and an expert's last tile of at most 64 rows is computed by the program of
the tile before it, as a second product on the weight tiles that program loads anyway.

The MoE layer as `bench moe` times it (router + routed experts + shared experts, V2-Lite,
bf16, 4 weight sets a graph, random routing of random x), the table's config against the
same with `merge_tail` (halves off), alternating rounds of CUDA-graph replays, µs a layer;
then the routed experts' kernels alone under the profiler.

    PYTHONPATH=. python3 exp_tail.py [--tokens 1024 2048 4096 8192] [--rounds 6]

`--sweep` (after merge_tail went into the table): at each token count the table's config
against other tiles with merge_tail, alternating rounds, µs a layer (gate_up / down given as
(N, K, warps, stages)).
"""

import argparse
import statistics
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_align import align_torch
from mla_func.kernels.moe_config import pick_config
from mla_func.ops.moe import route
from scripts.bench_common import graph_time_ms, measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers


def tails(ids: torch.Tensor, experts: int) -> tuple[int, int]:
    """(128-row tiles, tails of at most 64 rows after a tile of their expert's)."""
    _, expert, rows = align_torch(ids, experts, 0, 128)
    used = int((expert >= 0).sum())
    tail = int(((expert[1:] == expert[:-1]) & (rows[1:] > 0) & (rows[1:] <= 64)).sum())
    return used, tail


GATE_UP = [(128, 64, 8, 3), (64, 64, 8, 4), (64, 64, 4, 4), (128, 128, 8, 2)]
DOWN = [(256, 64, 8, 3), (128, 64, 8, 4), (256, 128, 8, 2), (128, 128, 8, 3)]


def sweep(tokens: list[int], rounds: int) -> None:
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}")
    torch.manual_seed(0)
    layers = make_layers(cfg, 4)
    for t in tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        table = pick_config(t)
        variants = {"table": table}
        variants |= {f"gate_up {g}": replace(table, gate_up=g) for g in GATE_UP}
        variants |= {f"down {d}": replace(table, down=d) for d in DOWN}
        want = fused_layer(x, layers[0], cfg, table)
        names = []
        for name, c in variants.items():
            try:
                got = fused_layer(x, layers[0], cfg, c)
            except Exception as err:  # noqa: BLE001  (a tile that does not fit is reported)
                print(f"  {name}: {type(err).__name__}: {err}"[:200])
                continue
            d = (got.float() - want.float()).abs().max().item()
            print(f"  {name}: max |d| against the table {d:.3g}")
            names.append(name)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                fn = lambda c=variants[name], x=x: [  # noqa: E731
                    fused_layer(x, layer, cfg, c) for layer in layers]
                times[name].append(graph_time_ms(fn, reps=20) * 1e3 / len(layers))
        print(f"\n{t} tokens, table {table}")
        base = statistics.median(times["table"])
        for name in sorted(names, key=lambda n: statistics.median(times[n])):
            us = statistics.median(times[name])
            print(f"  {name:28s} {us:8.1f} µs {100 * (us / base - 1):+5.1f}%  rounds "
                  + " ".join(f"{v:.1f}" for v in times[name]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args()
    if args.sweep:
        sweep(args.tokens, args.rounds)
        return
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}")
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    torch.manual_seed(0)
    layers = make_layers(cfg, 4)
    results = []
    for t in args.tokens:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        table = pick_config(t)
        variants = {"table": table, "merge_tail": replace(table, halves=False, merge_tail=True)}
        outs = {name: fused_layer(x, layers[0], cfg, c) for name, c in variants.items()}
        equal = torch.equal(outs["table"], outs["merge_tail"])
        diff = (outs["table"].float() - outs["merge_tail"].float()).abs().max().item()
        counts = [tails(route(x, layer.router, None, cfg)[1], cfg.n_routed_experts)
                  for layer in layers]
        floor, _ = floor_us(x, layers, cfg, ceil)
        print(f"\n{t} tokens: table {table}\n  128-row tiles / tails per layer: {counts}; "
              f"outputs equal: {equal} (max |d| {diff:.3g}); floor {floor:.1f} µs")
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                fn = lambda c=variants[name], x=x: [  # noqa: E731
                    fused_layer(x, layer, cfg, c) for layer in layers]
                times[name].append(graph_time_ms(fn, reps=20) * 1e3 / len(layers))
        for name in names:
            us = statistics.median(times[name])
            rounds = " ".join(f"{v:.1f}" for v in times[name])
            print(f"  {name:10s} {us:8.1f} µs  x floor {us / floor:.3f}  rounds {rounds}")
        results.append((t, statistics.median(times["table"]),
                        statistics.median(times["merge_tail"]), floor))
    print("\n| tokens | table µs | merge_tail µs | change | table × floor | merge_tail × floor |")
    print("|---|---|---|---|---|---|")
    for t, a, b, floor in results:
        print(f"| {t} | {a:.1f} | {b:.1f} | {100 * (b / a - 1):+.1f}% | {a / floor:.3f} | "
              f"{b / floor:.3f} |")

    # Last (the profiler stays out of the timings above): the routed kernels at 4096 tokens.
    if 4096 in args.tokens:
        t = 4096
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        layer = layers[0]
        w, ids = route(x, layer.router, None, cfg)
        for name, c in (("table", pick_config(t)),
                        ("merge_tail", replace(pick_config(t), halves=False,
                                               merge_tail=True))):
            run = lambda c=c: fused_experts(x, w, ids, layer.gate_up, layer.down,  # noqa: E731
                                            config=c)
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    run()
                torch.cuda.synchronize()
            per: dict[str, float] = {}
            for ev in prof.key_averages():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    per[ev.key[:40]] = ev.device_time_total / 10
            top = sorted(per.items(), key=lambda kv: -kv[1])
            print(f"\n{name} (routed experts alone, µs a call): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in top))


if __name__ == "__main__":
    main()
