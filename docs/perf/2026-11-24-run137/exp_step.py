"""The router in the weights' dtype (bf16: the tree) against float32 routers (the params
before), 2026-11-24, twenty-fourth session: V2-Lite whole-step graphs (plain
`torch.cuda.graph` around `forward`), one process, alternating rounds, ms synced / back to
back, and how far the two steps' logits are apart (the routing is the same up to float32
summation order):

    PYTHONPATH=. python3 exp_step.py [--batch 1 32 128] [--ctx 512] [--max-pages 9]
"""

import argparse
import dataclasses
import math
import statistics

import torch

import mla_func as mf
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def fp32_routers(params):
    layers = [dataclasses.replace(layer, mlp=dataclasses.replace(
        layer.mlp, router=layer.mlp.router.float())) if hasattr(layer.mlp, "router") else layer
        for layer in params.layers]
    return dataclasses.replace(params, layers=type(params.layers)(layers))


def capture(params, state, batch):
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-pages", type=int, default=9)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = {"bf16": mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)}
    params["fp32"] = fp32_routers(params["bf16"])
    assert params["bf16"].layers[1].mlp.router.dtype == torch.bfloat16
    assert params["fp32"].layers[1].mlp.router.dtype == torch.float32
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}, ctx {args.ctx}, page table {args.max_pages} pages")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=args.max_pages)
        graphs = {v: capture(params[v], state, batch) for v in params}
        for v in graphs:
            graphs[v][0].replay()
        torch.cuda.synchronize()
        diff = (graphs["bf16"][1] - graphs["fp32"][1]).abs().max().item()
        same = torch.equal(graphs["bf16"][1].argmax(-1), graphs["fp32"][1].argmax(-1))
        times: dict[str, list[float]] = {v: [] for v in graphs}
        back: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (("bf16", "fp32") if r % 2 == 0 else ("fp32", "bf16")):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                back[v].append(pipelined_ms(graphs[v][0].replay))
        for v in graphs:
            print(f"B={bsz} router {v:4s} {statistics.median(times[v]):.3f} / "
                  f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-{max(back[v]):.3f})",
                  flush=True)
        print(f"B={bsz} logits max |bf16 - fp32 routers| {diff:.3g}, argmax equal {same}")
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
