"""The MoE's routed tiles found by the gate_up programs (`MoEConfig.inline_align`, no
alignment launch) against the table's alignment launch, in one process, alternating rounds
(2026-11-24, fourteenth session).

`layer`: the MoE layer alone (router + experts, 4 layers a graph, `bench_moe`'s timing and
floor). `step`: whole-step graphs of `forward` (V2-Lite, random weights, 129-page table), ms
synced / back to back; `--profile`: per layer, the MoE kernels' median durations. Variants:
`al` (the table's rows with inline_align off), `in` (on, on every aligned whole-tile row);
from run 68 also `tab` (the table's rows) and `nopdl` (those without PDL); from run 72
`dn:N,K,warps,stages` / `gu:...` (the table's row with another down / gate_up tile).

    PYTHONPATH=. python3 exp_inline.py layer|step [--batch 8 32 128] [--ctx 1024]
        [--rounds 4] [--variants al in]
"""

import argparse
import json
import math
import os
import statistics
import tempfile
from dataclasses import replace

import torch

import mla_func as mf
from mla_func.config import MLAConfig
from mla_func.kernels import fused_moe
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import cuda_time_ms, measure_ceilings, pipelined_ms
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us
from scripts.bench_step import decode_batch

PICK = fused_moe.pick_config


def config_of(variant: str, tokens: int):
    cfg = pick_config(tokens)
    if variant in ("tab", "nopdl"):  # the table's row as it is, or without PDL (run 68)
        return replace(cfg, pdl=variant == "tab" and cfg.pdl)
    if variant.startswith(("dn:", "gu:")):  # another down / gate_up tile: N,K,warps,stages
        field = "down" if variant.startswith("dn:") else "gate_up"  # (run 72)
        return replace(cfg, **{field: tuple(int(v) for v in variant[3:].split(","))})
    on = variant == "in" and not cfg.direct and not cfg.halves
    assert variant in ("al", "in"), variant
    return replace(cfg, inline_align=on)


def apply(variant: str | None) -> None:
    fused_moe.pick_config = PICK if variant is None else (lambda t: config_of(variant, t))


def layer_part(args) -> None:
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s")
    layers = make_layers(cfg, 4)
    for t in args.batch:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        fns = {v: (lambda x, layer, c, conf=config_of(v, t): fused_layer(x, layer, c, conf))
               for v in args.variants}
        ref = fns[args.variants[0]](x, layers[0], cfg).float()
        errs = {v: ((f(x, layers[0], cfg).float() - ref).abs().max() / ref.abs().max()).item()
                for v, f in fns.items()}
        times = {v: [] for v in args.variants}
        for r in range(args.rounds):
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                times[v].append(time_layer_us(fns[v], x, layers, cfg))
        print(f"tokens {t} (floor {floor:.1f} us): " + ", ".join(
            f"{v} {statistics.median(times[v]):.1f} us ({statistics.median(times[v]) / floor:.3f}x,"
            f" rounds {min(times[v]):.1f}-{max(times[v]):.1f}, rel diff {errs[v]:.2g})"
            for v in args.variants), flush=True)


def capture(params, state, batch, variant: str):
    apply(variant)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mf.forward(params, state, batch)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, _ = mf.forward(params, state, batch)
    finally:
        apply(None)
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_moe(graph) -> str:
    """Per layer, median µs: router start to the MoE sum's end, and each MoE kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    span, durs = [], {}
    for i, (name, ts, _) in enumerate(ks):
        if "router" not in name:
            continue
        j = next((j for j in range(i + 1, min(i + 8, len(ks))) if "sum" in ks[j][0]), None)
        if j is None:
            continue
        span.append(ks[j][1] + ks[j][2] - ts)
        for n, _, d in ks[i:j + 1]:
            durs.setdefault(n.split("(")[0][:24], []).append(d)
    out = f"router..sum {statistics.median(span):.2f}" if span else "router..sum -"
    return out + "".join(f", {n} {statistics.median(d):.2f}" for n, d in durs.items())


def step_part(args) -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    variants = tuple(args.variants)
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(params, state, batch, v) for v in variants}
            ref = graphs[variants[0]][1].float()
            errs = {v: ((o.float() - ref).abs().max() / ref.abs().max()).item()
                    for v, (_, o) in graphs.items()}
            times: dict[str, list[float]] = {v: [] for v in variants}
            back: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}: " + ", ".join(
                f"{v} {statistics.median(times[v]):.3f} / {statistics.median(back[v]):.3f} ms"
                f" (logits rel diff {errs[v]:.2g})" for v in variants), flush=True)
            if args.profile:
                for v in variants:
                    print(f"- profile {v}: {profile_moe(graphs[v][0])} us", flush=True)
            del graphs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=["layer", "step"])
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["al", "in"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    {"layer": layer_part, "step": step_part}[args.part](args)


if __name__ == "__main__":
    main()
