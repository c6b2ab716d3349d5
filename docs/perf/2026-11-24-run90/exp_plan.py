"""The decode plan at B=128 when the page table's capacity (8256 keys in `bench step`) is far
above the real context (2026-11-24, eighteenth session). `plan_decode` sees only the capacity:
at 128 rows it picks 2 splits of 64-key tiles in 2 stages (tuned where a split covers 2048
keys or more); at ctx 1024 a split covers 512 real keys. Variants of the plan (fields
replaced in `plan_decode`'s pick for the given rows), V2-Lite whole-step graphs in one
process, alternating rounds, ms synced / back to back, logits against the tree's:

    PYTHONPATH=. python3 exp_plan.py [--batch 128] [--ctx 1024 4096] [--rounds 6]
"""

import argparse
import math
import statistics
from dataclasses import replace

import torch

import mla_func as mf
import mla_func.kernels.mla_absorbed as absorbed
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

TREE = absorbed.plan_decode
VARIANTS = {
    "tree": {},
    "n32": dict(block_n=32, num_stages=3),
    "n32s3": dict(block_n=32, num_stages=3, num_splits=3),
    "n32s4": dict(block_n=32, num_stages=3, num_splits=4),
    "n64s3": dict(num_splits=3),
    "n64st3": dict(num_stages=3),
}


def capture(params, state, batch, fields: dict):
    def plan(*args, **kwargs):
        return replace(TREE(*args, **kwargs), **fields)

    absorbed.plan_decode = plan
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
        absorbed.plan_decode = TREE
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}; tree plan at 128 rows: "
          f"{TREE(128, 129 * 64, torch.cuda.get_device_properties(0).multi_processor_count)}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            names = ["tree"] + [v for v in args.variants if v != "tree"]
            graphs = {}
            for v in names:
                try:
                    graphs[v] = capture(params, state, batch, VARIANTS[v])
                except Exception as err:  # a tiling that does not fit
                    print(f"  {v}: {type(err).__name__}: {str(err)[:100]}")
            names = list(graphs)
            times: dict[str, list[float]] = {v: [] for v in names}
            back: dict[str, list[float]] = {v: [] for v in names}
            for r in range(args.rounds):
                for v in (names if r % 2 == 0 else names[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}, ms synced / back to back (synced rounds), logits "
                  "against the tree's", flush=True)
            ref = graphs["tree"][1].float()
            for v in names:
                d = (graphs[v][1].float() - ref).abs().max().item()
                print(f"  {v:7s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ({min(times[v]):.3f}-"
                      f"{max(times[v]):.3f}) max diff {d:.3g}", flush=True)
            del graphs


if __name__ == "__main__":
    main()
