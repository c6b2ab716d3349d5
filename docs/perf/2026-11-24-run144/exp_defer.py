"""The MoE's norm left to the next layer's q + kv_a projection at one row (`norm_linear`: the
tree) against the MoE's last program normalising the row and `small_linear` projecting it
(`normalises` patched to False in both modules while capturing: the code before),
2026-11-24, twenty-fifth session: V2-Lite whole-step graphs (plain `torch.cuda.graph` around
`forward`), one process, alternating rounds, ms synced / back to back, and how far the two
steps' logits are apart:

    PYTHONPATH=. python3 exp_defer.py [--batch 1 2] [--ctx 512 1024 4096] [--rounds 8]
"""

import argparse
import math
import statistics

import torch

import mla_func as mf
import mla_func.kernels.fused_moe as fused_moe
import mla_func.kernels.norm_linear as norm_linear
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def graph_of(params, state, batch):
    """A whole-step graph of `forward` (warmed up on a side stream) and its logits."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            mf.forward(params, state, batch)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = mf.forward(params, state, batch)
    return g, out


def capture(params, state, batch, defer: bool):
    real = norm_linear.normalises
    if not defer:
        norm_linear.normalises = fused_moe.normalises = lambda rows, width: False
    try:
        return graph_of(params, state, batch)
    finally:
        norm_linear.normalises = fused_moe.normalises = real


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ctx", type=int, nargs="+", default=[512, 1024, 4096])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        max_pages = math.ceil((ctx + 1) / 64)
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=max_pages)
            graphs = {v: capture(params, state, batch, v == "defer") for v in ("defer", "plain")}
            for v in graphs:
                graphs[v][0].replay()
            torch.cuda.synchronize()
            a, b = graphs["defer"][1], graphs["plain"][1]
            diff = (a - b).abs().max().item()
            same = torch.equal(a.argmax(-1), b.argmax(-1))
            times: dict[str, list[float]] = {v: [] for v in graphs}
            back: dict[str, list[float]] = {v: [] for v in graphs}
            for r in range(args.rounds):
                for v in (("defer", "plain") if r % 2 == 0 else ("plain", "defer")):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            for v in graphs:
                print(f"ctx {ctx} B={bsz} {v:5s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} "
                      f"({min(back[v]):.3f}-{max(back[v]):.3f})", flush=True)
            print(f"ctx {ctx} B={bsz} logits max |defer - plain| {diff:.3g} "
                  f"(|logits| <= {b.abs().max().item():.3g}), argmax equal {same}, "
                  f"bits equal {torch.equal(a, b)}")
            del graphs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
