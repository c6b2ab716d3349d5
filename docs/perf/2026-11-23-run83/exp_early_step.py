"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`): the split kernel launched
early (`DecodePlan.early`, this tree's default: a programmatic dependent of the absorb kernel
that warms L2 with its first cache rows, then waits) against launched plainly (early=False),
both graphs in one process, alternating rounds (GPU). The logits must be equal to the bit.

    PYTHONPATH=. python3 exp_early_step.py [--batch 1 8 32 128] [--ctx 1024] [--rounds 4]
"""

import argparse
import math
import statistics
from dataclasses import replace

import torch

import mla_func as mf
from mla_func.kernels import mla_decode
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

PLAN = mla_decode.plan_decode


def capture(params, state, batch, early: bool):
    mla_decode.plan_decode = lambda *a, **k: replace(PLAN(*a, **k), early=early)
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
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    variants = ("early", "plain")
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(params, state, batch, v == "early") for v in variants}
            diff = (graphs["early"][1] - graphs["plain"][1]).abs().max().item()
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
                + f"; early/plain {med['early'] / med['plain']:.4f}"
                + f"; logits max |diff| {diff:.3g}", flush=True)
            del graphs


if __name__ == "__main__":
    main()
