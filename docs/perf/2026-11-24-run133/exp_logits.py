"""The logits projection with cuBLAS's fp32 output (`torch.mm(..., out_dtype=float32)`, the
tree) against the bf16 product widened after (`(rows @ lm_head.T).float()`, the code before),
2026-11-24, twenty-third session. V2-Lite whole-step graphs (plain `torch.cuda.graph` around
`forward`, no output copy), one process, alternating rounds, ms synced / back to back, and the
logits' largest difference from a float64 product of the same rows:

    PYTHONPATH=. python3 exp_logits.py [--batch 1 32 128] [--ctx 512] [--max-pages 9]
"""

import argparse
import math
import statistics

import torch

import mla_func as mf
import mla_func.model as model
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

TREE = model._logits_op


def widened(x, index, lm_head):
    return (x[index] @ lm_head.T).float()


def capture(params, state, batch, op):
    model._logits_op = op
    rows = {}
    final = params.lm_head

    def keep(x, index, lm_head):  # the rows the projection reads, for the float64 check
        rows["x"] = x[index]
        return op(x, index, lm_head)

    model._logits_op = keep
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mf.forward(params, state, batch)
        torch.cuda.current_stream().wait_stream(s)
        model._logits_op = op
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, _ = mf.forward(params, state, batch)
    finally:
        model._logits_op = TREE
    g.replay()
    torch.cuda.synchronize()
    exact = rows["x"].double() @ final.double().T
    return g, (out.double() - exact).abs().max().item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-pages", type=int, default=9)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}, ctx {args.ctx}, page table {args.max_pages} pages")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=args.max_pages)
        graphs = {"fp32out": capture(params, state, batch, TREE),
                  "widened": capture(params, state, batch, widened)}
        times: dict[str, list[float]] = {v: [] for v in graphs}
        back: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (("fp32out", "widened") if r % 2 == 0 else ("widened", "fp32out")):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                back[v].append(pipelined_ms(graphs[v][0].replay))
        for v in graphs:
            print(f"B={bsz} {v:8s} {statistics.median(times[v]):.3f} / "
                  f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-{max(back[v]):.3f}) "
                  f"max |logit - float64 product| {graphs[v][1]:.3g}", flush=True)
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
