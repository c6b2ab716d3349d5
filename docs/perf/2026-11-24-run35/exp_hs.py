"""Decode at 16 heads with 8 heads a program (`DecodePlan.head_step`: two programs read each KV
tile, the second mostly from L2) and one split, so that no partials are written and no merge
launches, against the plan's splits: V2-Lite whole-step graphs, one process, alternating
rounds, ms synced / back to back (2026-11-24, thirteenth session, run 40 on).

Variants (the plan of every decode call in the step, from `plan_decode`'s): `tree`; `hs<H>`
head_step H with one split (head_step.patch, run 41); `hs<H>-s<S>` with S splits; `s<S>` S
splits, no head_step; from run 44 tokens `n<N>` key tile, `st<S>` stages, `w<W>` warps;
run 46: `ws16`, the warp-specialised kernel's plan (`_ws_plan`) at 16 heads too; run 52:
`nopre`, the tree without the router's rows loaded before its wait (`router.PRELOAD`).
`--profile`: per layer, the median time from the absorb kernel's start to the start of the
kernel after the attention (W_UV's bmm), and the split kernel's duration.

    PYTHONPATH=. python3 exp_hs.py [--batch 32 128] [--ctx 1024 4096] [--variants tree hs8]
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
from mla_func.kernels import mla_decode, router
from mla_func.kernels.decode_plan import _ws_plan
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

PLAN = mla_decode.plan_decode


WS_SUPPORTED = mla_decode.ws_supported


def planner(variant: str):
    def plan(*args, **kwargs):
        p = PLAN(*args, **kwargs)
        if variant == "ws16":  # run 46: the warp-specialised kernel at 16 heads too
            rows, capacity, sms, heads = args[:4]
            return _ws_plan(rows, capacity, sms, heads) if kwargs.get("ws") else p
        if variant == "tree" or p.ws:
            return p
        fields = {}
        for tok in variant.split("-"):
            if tok.startswith("hs"):
                fields["head_step"] = int(tok[2:])
                fields.setdefault("num_splits", 1)
            elif tok.startswith("st"):  # run 44 on: stages, key tile, warps
                fields["num_stages"] = int(tok[2:])
            elif tok.startswith("n"):
                fields["block_n"] = int(tok[1:])
            elif tok.startswith("w"):
                fields["num_warps"] = int(tok[1:])
            elif tok.startswith("s"):
                fields["num_splits"] = int(tok[1:])
        return replace(p, **fields)
    return plan


def capture(params, state, batch, variant: str):
    router.PRELOAD = variant != "nopre"  # run 52: the router's rows loaded before its wait
    mla_decode.plan_decode = planner(variant if variant != "nopre" else "tree")
    if variant == "ws16":
        mla_decode.ws_supported = lambda cache, heads, block_n: True
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
        mla_decode.ws_supported = WS_SUPPORTED
        router.PRELOAD = True
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_attention(graph) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    span, split = [], []
    for i, (name, ts, _) in enumerate(ks):
        if "absorb" not in name:
            continue
        j = next((j for j in range(i + 1, min(i + 6, len(ks)))
                  if "split" in ks[j][0] or "decode_ws" in ks[j][0]), None)
        if j is None:
            continue
        split.append(ks[j][2])
        k = next((k for k in range(j + 1, min(j + 4, len(ks)))
                  if "merge" not in ks[k][0]), None)
        if k is not None:
            span.append(ks[k][1] - ts)
    if not span:
        return "no split kernel found"
    return (f"absorb start to the next kernel after the attention {statistics.median(span):.1f},"
            f" split kernel {statistics.median(split):.1f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["tree", "hs8"])
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
                f"{v} {statistics.median(times[v]):.3f} / {statistics.median(back[v]):.3f}"
                f" ms (logits rel diff {errs[v]:.2g})" for v in variants), flush=True)
            if args.profile:
                for v in variants:
                    print(f"- profile {v}: {profile_attention(graphs[v][0])} us", flush=True)
            del graphs


if __name__ == "__main__":
    main()
