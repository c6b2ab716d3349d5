"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`, ctx 1024): the split-KV merge
fused with the W_UV product (`DecodePlan.uv`, kernels/mla_merge_uv.py) against the tile merge
+ cuBLAS bmm, all graphs in one process, alternating rounds (GPU). Variants: `bmm` (uv off),
`uv` (the module's tiles), `uv-v<N>` (N value columns a program), `uv-w<N>` (N warps),
`uv-t<N>` (N fp32 partials a program loads at once), `-s<N>` (N splits; `bmm-s<N>` too);
from run 111 on `uv` is the column form (a program per row, head and block of kv_lora
columns; the last of a row's programs sums their shares of o), `uv-row` the row form,
`uv-c<N>` N columns a program; `uv-r<N>` N rows a program above 4 rows (run 113; needs merge_uv_rows.patch). `--profile`: median merge duration per layer and the time
from the split kernel's end to the start of the kernel after the merge (o_proj).

    PYTHONPATH=. python3 exp_uv_step.py [--batch 1 8 32 128] [--rounds 4]
        [--variants bmm uv uv-v64 uv-w8] [--profile] [--ctx 1024 4096] [--max-pages 129]
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
from mla_func.kernels import mla_decode, mla_merge_uv
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

PLAN = mla_decode.plan_decode
# The module's tiles as imported (the final tree has no BLOCK_V or FORM: the column form only).
NAMES = ("BLOCK_V", "NUM_WARPS", "SPLIT_TILE", "FORM", "COLS", "ROWS")
TILES = {n: getattr(mla_merge_uv, n) for n in NAMES if hasattr(mla_merge_uv, n)}


def apply(variant: str) -> dict:
    """Plan fields of a variant; sets the uv kernel's module tiles."""
    for name, value in TILES.items():
        setattr(mla_merge_uv, name, value)
    fields = {"uv": not variant.startswith("bmm")}
    for tok in variant.split("-")[1:]:
        if tok == "row":  # the row form (one program per row, head and value block)
            mla_merge_uv.FORM = "row"
        elif tok[0] == "s":
            fields["num_splits"] = int(tok[1:])
        elif tok[0] == "c":  # the column form's columns a program
            mla_merge_uv.COLS = int(tok[1:])
        elif tok[0] == "r":  # rows a program above ONE_ROW_MAX rows (run 113 on)
            mla_merge_uv.ROWS = int(tok[1:])
        elif tok[0] == "v":
            mla_merge_uv.BLOCK_V = int(tok[1:])
        elif tok[0] == "w":
            mla_merge_uv.NUM_WARPS = int(tok[1:])
        elif tok[0] == "t":
            mla_merge_uv.SPLIT_TILE = int(tok[1:])
        else:
            raise ValueError(f"unknown variant token {tok!r}")
    return fields


def capture(params, state, batch, variant: str):
    fields = apply(variant)
    mla_decode.plan_decode = lambda *a, **k: replace(PLAN(*a, **k), **fields)
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
        apply("bmm")
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_layers(graph) -> str:
    """Median per layer: split and merge durations, split end to the start of the kernel
    after the merge (and the bmm, when there is one)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    rows = {"split": [], "merge": [], "to_o_proj": []}
    for i, (name, ts, dur) in enumerate(ks):
        if "split_kernel" not in name or i + 3 >= len(ks) or "merge" not in ks[i + 1][0]:
            continue
        rows["split"].append(dur)
        rows["merge"].append(ks[i + 1][2])
        after = ks[i + 2] if "uv" in ks[i + 1][0] else ks[i + 3]  # o_proj; else the bmm first
        rows["to_o_proj"].append(after[1] - (ts + dur))
    return ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in rows.items() if v)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-pages", type=int, default=129, help="page-table width (capacity)")
    p.add_argument("--variants", nargs="+", default=["bmm", "uv"])
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
