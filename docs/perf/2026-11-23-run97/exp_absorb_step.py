"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`, ctx 1024): the absorb +
prologue kernel (kernels/absorb.py) with other tiles, all graphs in one process, alternating
rounds (GPU). Variants: `base` (the module's ROWS and BLOCK_C), or '-'-joined `r<N>` (N tokens
a program) and `c<N>` (N kv_lora columns a program). `--profile`: median absorb duration per
layer and absorb start to the split kernel's end.

    PYTHONPATH=. python3 exp_absorb_step.py [--batch 8 32 128] [--rounds 4]
        [--variants base r16 r32 r16-c64] [--profile] [--ctx 1024] [--max-pages 129]
"""

import argparse
import json
import math
import os
import statistics
import tempfile

import torch

import mla_func as mf
from mla_func.kernels import absorb
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

ROWS, DEFAULTS = absorb.ROWS, absorb.absorb_launch.__defaults__


def apply(variant: str) -> None:
    """Sets the absorb kernel's module tiles for a variant (`base`: the module's own)."""
    absorb.ROWS, absorb.absorb_launch.__defaults__ = ROWS, DEFAULTS
    if variant == "base":
        return
    for tok in variant.split("-"):
        if tok[0] == "r":
            absorb.ROWS = int(tok[1:])
        elif tok[0] == "c":
            absorb.absorb_launch.__defaults__ = (int(tok[1:]),)
        else:
            raise ValueError(f"unknown variant token {tok!r}")


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
        apply("base")
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_layers(graph) -> str:
    """Median per layer: absorb duration, and absorb start to the split kernel's end."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    rows = {"absorb": [], "to_split_end": []}
    for i, (name, ts, dur) in enumerate(ks):
        if "absorb" not in name or i + 1 >= len(ks) or "split" not in ks[i + 1][0]:
            continue
        rows["absorb"].append(dur)
        rows["to_split_end"].append(ks[i + 1][1] + ks[i + 1][2] - ts)
    return ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in rows.items() if v)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-pages", type=int, default=129, help="page-table width (capacity)")
    p.add_argument("--variants", nargs="+", default=["base", "r16", "r32"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    variants = tuple(args.variants)
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=args.max_pages)
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
                f"{v} {statistics.median(times[v]):.3f} ms (back to back "
                f"{statistics.median(back[v]):.3f}; logits rel diff {errs[v]:.2g})"
                for v in variants), flush=True)
            if args.profile:
                for v in variants:
                    print(f"- profile {v}: {profile_layers(graphs[v][0])} us", flush=True)
            del graphs


if __name__ == "__main__":
    main()
