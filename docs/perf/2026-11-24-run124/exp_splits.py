"""The decode plan's split count at short contexts (2026-11-24, twenty-second session).
`plan_decode` picks the fewest splits that fill two waves of programs from the rows and the
page table's capacity (`bench step --contexts 512`: 9 pages, 576 keys; `generate`'s 128 x
(512 + 256): 12 pages). At ctx 512 a B=32 step gets 8 splits of ~64 keys (two 32-key tiles a
program, 32 KiB of fp32 partials a program), a B=128 step 2. Variants replace only
`num_splits` in the tree's pick; V2-Lite whole-step graphs (plain `torch.cuda.graph` around
`forward`), one process, alternating rounds, ms synced / back to back, logits against the
tree's:

    PYTHONPATH=. python3 exp_splits.py [--batch 1 32 128] [--ctx 512] [--max-pages 9]
        [--splits 1 2 4 8 16] [--rounds 6]
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
SPLITS = (1, 2, 4, 8, 16)


def capture(params, state, batch, splits: int | None):
    def plan(*args, **kwargs):
        p = TREE(*args, **kwargs)
        return p if splits is None else replace(p, num_splits=splits)

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
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[512])
    p.add_argument("--max-pages", type=int, default=9)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--splits", type=int, nargs="+", default=list(SPLITS))
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, page table {args.max_pages} pages")
    for ctx in args.ctx:
        for bsz in args.batch:
            tree = TREE(bsz, args.max_pages * 64, sms, 16, page_size=64)
            print(f"ctx {ctx} B={bsz}: tree plan {tree}", flush=True)
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=args.max_pages)
            graphs = {"tree": capture(params, state, batch, None)}
            for s in args.splits:
                if s != tree.num_splits and s <= args.max_pages * 64 // tree.block_n:
                    graphs[f"s{s}"] = capture(params, state, batch, s)
            names = list(graphs)
            times: dict[str, list[float]] = {v: [] for v in names}
            back: dict[str, list[float]] = {v: [] for v in names}
            for r in range(args.rounds):
                for v in (names if r % 2 == 0 else names[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}, ms synced / back to back (back-to-back rounds), "
                  "logits against the tree's", flush=True)
            ref = graphs["tree"][1].float()
            for v in names:
                d = (graphs[v][1].float() - ref).abs().max().item()
                print(f"  {v:5s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-"
                      f"{max(back[v]):.3f}) max diff {d:.3g}", flush=True)
            del graphs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
