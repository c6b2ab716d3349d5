"""The MoE of 1-4 decode tokens in two launches (`MoEConfig.chunks`, kernels/moe_chunks.py)
against the table's three (gate_up, down, sum), in one process, alternating rounds
(2026-11-24, thirteenth session).

`layer`: the MoE layer alone (router + experts, 4 layers a graph, `bench_moe`'s timing and
floor). `step`: whole-step graphs of `forward` (V2-Lite, random weights, 129-page table), ms
synced / back to back. Variants: `tab` (the table's config), `ch` (the table's tiles with
chunks: gate_up's BLOCK_N columns a chunk, down[0] hidden columns a down step), then tokens
`-n<N>` BLOCK_N, `-k<N>` BLOCK_K, `-h<N>` hidden columns a down step, `-w<N>` warps, `-s<N>`
stages, `-sb<N>` SUM_BLOCK; a last `-t` (layer only, run 36 on): the down weights transposed
([moe_inter, hidden] copies), so that a chunk's down rows are contiguous. `--profile`: per layer, the MoE kernels' median durations.

    PYTHONPATH=. python3 exp_chunks.py layer|step [--batch 1 2 4] [--ctx 1024] [--rounds 4]
        [--variants tab ch ch-n16]
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

try:  # runs 35-38 only: the tree with chunks.patch applied
    from mla_func.kernels import moe_chunks
except ImportError:
    moe_chunks = None
from mla_func.kernels.moe_config import pick_config
from mla_func.kernels.router import route_fused
from scripts.bench_common import cuda_time_ms, measure_ceilings, pipelined_ms
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us
from scripts.bench_step import decode_batch

PICK = fused_moe.pick_config
SUM_BLOCK = moe_chunks and moe_chunks.SUM_BLOCK


GATE_UP = [(32, 128, 4, 4), (32, 128, 4, 6), (32, 256, 4, 3), (32, 256, 4, 4),
           (16, 256, 4, 4), (16, 128, 4, 6), (64, 128, 4, 4), (64, 64, 4, 6), (32, 64, 4, 8),
           (32, 128, 8, 4)]
DOWN = [(64, 128, 4, 4), (32, 128, 4, 4), (32, 128, 4, 6), (64, 128, 4, 6), (32, 256, 4, 4),
        (128, 128, 8, 3), (64, 64, 4, 8), (16, 256, 4, 4), (64, 256, 4, 3)]


def config_of(variant: str, tokens: int):
    cfg = pick_config(tokens)
    if variant == "tab":
        return cfg
    if variant.startswith("tab:"):  # tab:<gate_up N,K,warps,stages>:<down ...> (run 39 on)
        gu, dn = (tuple(int(v) for v in part.split(",")) for part in variant.split(":")[1:])
        return replace(cfg, gate_up=gu, down=dn)
    parts = variant.split("-")
    assert parts[0] == "ch", variant
    cfg = replace(cfg, chunks=True)
    gu, dn = list(cfg.gate_up), list(cfg.down)
    for tok in parts[1:]:
        if tok.startswith("sb") or tok == "t":
            continue
        key, val = tok[0], int(tok[1:])
        if key == "n":
            gu[0] = val
        elif key == "k":
            gu[1] = val
        elif key == "h":
            dn[0] = val
        elif key == "w":
            gu[2] = val
        elif key == "s":
            gu[3] = val
        else:
            raise ValueError(tok)
    return replace(cfg, gate_up=tuple(gu), down=tuple(dn))


def apply(variant: str | None) -> None:
    fused_moe.pick_config = PICK if variant is None else (lambda t: config_of(variant, t))
    if moe_chunks is None:
        return
    moe_chunks.SUM_BLOCK = SUM_BLOCK
    for tok in (variant or "").split("-"):
        if tok.startswith("sb"):
            moe_chunks.SUM_BLOCK = int(tok[2:])


def transposed_layer(layer):
    """`fused_layer` through the chunks path with the down weights stored [moe_inter, hidden]
    (copies made here; the views handed over keep the [hidden, moe_inter] shape)."""
    down_t = layer.down.transpose(1, 2).contiguous().transpose(1, 2)
    sd_t = layer.shared_down.t().contiguous().t()
    s_gu, s_dn = fused_moe.shared_as_experts(layer.shared_gate_up, sd_t, layer.down.shape[2])

    def run(x, _, cfg, conf):
        w, ids = route_fused(x, layer.router, None, cfg)
        return moe_chunks.chunked_experts(
            x, w, ids, (layer.gate_up, down_t, s_gu, s_dn), s_gu.shape[0], None,
            fused_moe._fit(conf.gate_up, layer.down.shape[2], x.shape[1]), conf.down[0],
            True, None)
    return run


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
        trans = {id(layer): transposed_layer(layer) for layer in layers}
        for v in args.variants:
            if v.endswith("-t"):
                fns[v] = (lambda x, layer, c, conf=config_of(v, t):
                          trans[id(layer)](x, layer, c, conf))
        ref = fns[args.variants[0]](x, layers[0], cfg).float()
        errs = {v: ((f(x, layers[0], cfg).float() - ref).abs().max() / ref.abs().max()).item()
                for v, f in fns.items()}
        times = {v: [] for v in args.variants}
        for r in range(args.rounds):
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                apply(v)
                times[v].append(time_layer_us(fns[v], x, layers, cfg))
                apply(None)
        print(f"tokens {t} (floor {floor:.1f} us): " + ", ".join(
            f"{v} {statistics.median(times[v]):.1f} us ({statistics.median(times[v]) / floor:.3f}x,"
            f" rounds {min(times[v]):.1f}-{max(times[v]):.1f}, rel diff {errs[v]:.2g})"
            for v in args.variants), flush=True)


def tiles_part(args) -> None:
    """The direct path's tiles (run 39): coordinate descent over GATE_UP, then DOWN, on the
    layer alone; then the best against the table's in alternating rounds."""
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s")
    layers = make_layers(cfg, 4)
    for t in args.batch:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        base = pick_config(t)
        ref = fused_layer(x, layers[0], cfg, base).float()

        def timed(gu, dn):
            conf = replace(base, gate_up=gu, down=dn)
            err = ((fused_layer(x, layers[0], cfg, conf).float() - ref).abs().max()
                   / ref.abs().max()).item()
            assert err < 0.02, (gu, dn, err)
            return time_layer_us(lambda x, layer, c: fused_layer(x, layer, c, conf), x,
                                 layers, cfg)

        gu_us = {gu: timed(gu, base.down) for gu in GATE_UP}
        best_gu = min(gu_us, key=gu_us.get)
        dn_us = {dn: timed(best_gu, dn) for dn in DOWN}
        best_dn = min(dn_us, key=dn_us.get)
        print(f"tokens {t} (floor {floor:.1f} us), gate_up with the table's down: " + ", ".join(
            f"{k} {v:.1f}" for k, v in gu_us.items()))
        print(f"tokens {t}, down with gate_up {best_gu}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in dn_us.items()))
        best = replace(base, gate_up=best_gu, down=best_dn)
        times = {"tab": [], "best": []}
        for r in range(args.rounds):
            for name, conf in ((("tab", base), ("best", best)) if r % 2 == 0 else
                               (("best", best), ("tab", base))):
                times[name].append(time_layer_us(
                    lambda x, layer, c, conf=conf: fused_layer(x, layer, c, conf), x, layers,
                    cfg))
        print(f"tokens {t}: tab {statistics.median(times['tab']):.1f} us, best "
              f"tab:{','.join(map(str, best_gu))}:{','.join(map(str, best_dn))} "
              f"{statistics.median(times['best']):.1f} us", flush=True)


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
    p.add_argument("part", choices=["layer", "step", "tiles"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["tab", "ch"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    {"layer": layer_part, "step": step_part, "tiles": tiles_part}[args.part](args)


if __name__ == "__main__":
    main()
