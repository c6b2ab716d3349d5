"""`norm_linear`'s tiles at one row: output columns a program (`small_linear.BLOCK_N`, which
it shares) and warps (`small_linear.NUM_WARPS`), 2026-11-24, twenty-fifth session: V2-Lite
whole-step graphs at B=1 (plain `torch.cuda.graph` around `forward`), one process,
alternating rounds, ms synced / back to back. The tree's (4 columns, 4 warps) first:

    PYTHONPATH=. python3 exp_nl.py [--ctx 512 1024] [--rounds 8]
"""

import argparse
import math
import statistics

import torch
from exp_defer import graph_of  # this folder (the script's own directory)

import mla_func as mf
import mla_func.kernels.small_linear as sl
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

VARIANTS = {"n4 w4": (4, 4), "n8 w4": (8, 4), "n2 w4": (2, 4), "n4 w2": (4, 2),
            "n8 w8": (8, 8)}


def capture(params, state, batch, block_n: int, warps: int):
    real = sl.BLOCK_N, sl.NUM_WARPS
    sl.BLOCK_N, sl.NUM_WARPS = block_n, warps
    try:
        return graph_of(params, state, batch)
    finally:
        sl.BLOCK_N, sl.NUM_WARPS = real


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ctx", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, math.ceil((max(args.ctx) + 1) / 64) + 2, 64, device="cuda",
                          dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        batch = decode_batch(state, 1, ctx, "triton", seed=1,
                             max_pages=math.ceil((ctx + 1) / 64))
        graphs = {v: capture(params, state, batch, *VARIANTS[v]) for v in VARIANTS}
        for v in graphs:
            graphs[v][0].replay()
        torch.cuda.synchronize()
        ref = graphs["n4 w4"][1]
        times: dict[str, list[float]] = {v: [] for v in graphs}
        back: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                back[v].append(pipelined_ms(graphs[v][0].replay))
        for v in graphs:
            diff = (graphs[v][1] - ref).abs().max().item()
            print(f"ctx {ctx} B=1 {v} {statistics.median(times[v]):.3f} / "
                  f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-{max(back[v]):.3f})"
                  f"  logits max |- tree's| {diff:.3g}", flush=True)
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
