"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`): the split kernel launched
early (`DecodePlan.early`, this tree's default: a programmatic dependent of the absorb kernel
that warms L2 with its first cache rows, then waits) against launched plainly (early=False),
all graphs in one process, alternating rounds (GPU). The logits must be equal to the bit.
Variants `early<K>` prefetch K rows a program (this tree: one a thread, 128 at 16 heads),
'-'-joined `km` (keys along M, `DecodePlan.keys_m`: needs keys_m.patch applied), `s<N>` and `n<N>` launch early with
the products transposed, N splits or N-key tiles; `nowarm`: the merge does not warm L2 with
W_UV (`DecodePlan.warm`); `plain`: neither;
`--profile` prints each variant's mean absorb / split / merge times per layer (profiler).

    PYTHONPATH=. python3 exp_early_step.py [--batch 1 8 32 128] [--ctx 1024] [--rounds 4]
        [--variants early plain early32 early0] [--profile]
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
from mla_func.kernels import mla_decode
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

PLAN = mla_decode.plan_decode
EARLY = mla_decode.early_launch


def fields_of(variant: str) -> dict:
    """Plan fields of a variant: `plain` (early and warm off), `nowarm` (warm off), `early` or
    `early<K>` (the tree's plan), or '-'-joined tokens over the tree's plan: `km` (keys_m),
    `s<N>` splits, `n<N>`-key tiles (2 stages at 64, else 3)."""
    if variant == "plain":
        return {"early": False, "warm": False}
    if variant == "nowarm":
        return {"early": True, "warm": False}
    if variant.startswith("early"):
        return {"early": True}
    fields: dict = {"early": True}
    for tok in variant.split("-"):
        if tok == "km":
            fields["keys_m"] = True
        elif tok[0] == "s":
            fields["num_splits"] = int(tok[1:])
        elif tok[0] == "n":
            fields["block_n"] = int(tok[1:])
            fields["num_stages"] = 2 if int(tok[1:]) >= 64 else 3
        else:
            raise ValueError(f"unknown variant token {tok!r}")
    return fields


def capture(params, state, batch, variant: str):
    fields = fields_of(variant)
    keys = variant[len("early"):] if variant.startswith("early") else ""
    mla_decode.plan_decode = lambda *a, **k: replace(PLAN(*a, **k), **fields)
    if keys:
        mla_decode.early_launch = lambda *a: dict(EARLY(*a), L2_KEYS=int(keys))
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
        mla_decode.plan_decode = PLAN
        mla_decode.early_launch = EARLY
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_layers(graph) -> str:
    """Mean per layer: absorb, split and merge durations, and absorb start to merge end."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    rows = {"absorb": [], "split": [], "merge": [], "span": []}
    for i, (name, ts, dur) in enumerate(ks):
        if "absorb" not in name or i + 2 >= len(ks):
            continue
        split, merge = ks[i + 1], ks[i + 2]
        if "split" not in split[0]:
            continue
        rows["absorb"].append(dur)
        rows["split"].append(split[2])
        done = split[1] + split[2]
        if "merge" in merge[0]:
            rows["merge"].append(merge[2])
            done = max(done, merge[1] + merge[2])
        rows["span"].append(done - ts)
    return ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in rows.items() if v)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["early", "plain"])
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
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(params, state, batch, v) for v in variants}
            diff = max((graphs[v][1] - graphs["plain"][1]).abs().max().item()
                       for v in variants)
            times: dict[str, list[float]] = {v: [] for v in variants}
            back: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            med = {v: statistics.median(t) for v, t in times.items()}
            bmed = {v: statistics.median(t) for v, t in back.items()}
            print(f"ctx {ctx} B={bsz}: " + ", ".join(
                f"{v} {med[v]:.3f} ms (back to back {bmed[v]:.3f})" for v in variants)
                + f"; early/plain {med[variants[0]] / med['plain']:.4f}"
                + f"; logits max |diff| {diff:.3g}", flush=True)
            if args.profile:
                for v in variants:
                    print(f"- profile {v}: {profile_layers(graphs[v][0])} us", flush=True)
            del graphs


if __name__ == "__main__":
    main()
