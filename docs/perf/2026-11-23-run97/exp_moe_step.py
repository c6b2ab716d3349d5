"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`, ctx 1024) with MoE configs
other than the table's at the step's token count, all graphs in one process, alternating
rounds (GPU). Question: why do the B=128 expert GEMMs run 6-7% slower than B=32's, against the
same weight bytes (eighth session's timeline)? Hypothesis: the shared experts, folded in as
experts, span tokens / block_m M-tiles, each of which reads their weights again.

Variants: `cur` (the table's config), or '-'-joined tokens over it: `bm<M>` block_m,
`g<N>.<K>.<W>.<S>` / `d<N>.<K>.<W>.<S>` the gate_up / down tiles, `apart` (shared experts
through `kernels.swiglu`, not folded), `tma` (weights through TMA; needs `apart`), `ss` (the
shared experts on a side stream; needs `apart`), `ed` (`early_down`: the down GEMM launched
while gate_up runs, prefetching its weight rows; needs early_down.patch applied). `--profile` prints each variant's median gate_up, down
and shared-MLP kernel durations per layer (profiler).

    PYTHONPATH=. python3 exp_moe_step.py [--batch 32 128] [--rounds 4]
        [--variants cur bm64 apart g32.128.4.4] [--profile]
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
from mla_func.kernels import fused_moe
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

PICK = fused_moe.pick_config


def config_of(variant: str, tokens: int):
    cfg = PICK(tokens)
    if variant == "cur":
        return cfg
    for tok in variant.split("-"):
        if tok == "apart":
            cfg = replace(cfg, fuse_shared=False)
        elif tok == "tma":
            cfg = replace(cfg, tma=True)
        elif tok == "ss":
            cfg = replace(cfg, shared_stream=True)
        elif tok == "ed":
            cfg = replace(cfg, early_down=True)
        elif tok.startswith("bm"):
            cfg = replace(cfg, block_m=int(tok[2:]))
        elif tok[0] in "gd":
            tile = tuple(int(v) for v in tok[1:].split("."))
            cfg = replace(cfg, **{"gate_up" if tok[0] == "g" else "down": tile})
        else:
            raise ValueError(f"unknown variant token {tok!r}")
    return cfg


def capture(params, state, batch, variant: str, tokens: int):
    cfg = config_of(variant, tokens)
    fused_moe.pick_config = lambda t: cfg if t == tokens else PICK(t)
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
        fused_moe.pick_config = PICK
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone(), cfg


def profile_kernels(graph, layers: int) -> str:
    """Median duration per layer of the MoE kernels, by name, and the step's kernel sum."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = [(e["name"], float(e["dur"])) for e in json.load(open(path))["traceEvents"]
          if e.get("cat") == "kernel" and "dur" in e]
    out = []
    for key in ("gate_up_kernel", "down_kernel", "sum_kernel", "align", "router",
                "swiglu", "gemm"):
        durs = [d for n, d in ks if key in n]
        if durs:
            out.append(f"{key} {statistics.median(durs):.1f} x{len(durs) / layers:.0f}")
    out.append(f"kernel sum {sum(d for _, d in ks):.0f}")
    return ", ".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["cur", "apart"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    variants = tuple(args.variants)
    print(f"# {torch.cuda.get_device_name()}")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=129)
        graphs = {}
        for v in variants:
            try:
                graphs[v] = capture(params, state, batch, v, bsz)
            except Exception as err:  # noqa: BLE001  (a config that cannot run is reported)
                print(f"B={bsz} {v}: {type(err).__name__}: {err}"[:300], flush=True)
        ref = graphs[variants[0]][1].float()
        for v, (_, out, c) in graphs.items():
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            print(f"- B={bsz} {v}: {c} rel err vs {variants[0]} {err:.3g}", flush=True)
        times: dict[str, list[float]] = {v: [] for v in graphs}
        back: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                back[v].append(pipelined_ms(graphs[v][0].replay))
        print(f"ctx {args.ctx} B={bsz}: " + ", ".join(
            f"{v} {statistics.median(times[v]):.3f} ms (back to back "
            f"{statistics.median(back[v]):.3f})" for v in graphs), flush=True)
        if args.profile:
            for v in graphs:
                moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
                print(f"- profile {v}: {profile_kernels(graphs[v][0], moe_layers)}", flush=True)
        del graphs


if __name__ == "__main__":
    main()
