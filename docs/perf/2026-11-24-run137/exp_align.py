"""The expert alignment of a large MoE step (`kernels/moe_align.py`'s two sliced launches:
counts per slice, then each slice's rows and a share of the tile table), 2026-11-24,
twenty-fourth session: the tree's launch parameters against other slice sizes, history rows
a load and warp counts; each launch apart (counts only, rows only). The 4096- and 8192-token
V2-Lite layers' layouts (shared experts apart, 64-row units: `MoEConfig.halves`). One
process, CUDA graphs of 20 alignments, alternating rounds, us an alignment; every variant's
layout is checked against the tree's:

    PYTHONPATH=. python3 exp_align.py [--tokens 4096 8192] [--rounds 6]
"""

import argparse
import os
import statistics
import sys

import torch
import triton

from mla_func.kernels import moe_align as ma
from scripts.bench_common import cuda_time_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import align_before  # noqa: E402  (the kernels before run 139)

# name: (slice, history rows a load, warps of the counts, warps of the rows)
# (run 137: the first seven; run 138: the rest with the tree and "s256 h64" again)
VARIANTS = {"tree": (128, 32, 4, 4), "h64": (128, 64, 4, 8), "h256": (128, 256, 4, 8),
            "w8": (128, 32, 4, 8), "s64": (64, 32, 4, 4), "s256": (256, 32, 4, 8),
            "s256 h64": (256, 64, 8, 8)}
if os.environ.get("ALIGN_SET") == "3":  # run 139: the rows' histories summed elementwise
    VARIANTS = {"old tree": (128, 32, 4, 4, "old"), "old s256 h128": (256, 128, 8, 8, "old"),
                "new tree": (128, 32, 4, 4), "new h64": (128, 64, 4, 4),
                "new s256 h64": (256, 64, 8, 8), "new s256 h128": (256, 128, 8, 8),
                "new s512 h64": (512, 64, 8, 8), "new s512 h128": (512, 128, 8, 8),
                "new s256 h64 w4": (256, 64, 4, 4)}
if os.environ.get("ALIGN_SET") == "2":
    VARIANTS = {"tree": (128, 32, 4, 4), "s256 h64": (256, 64, 8, 8),
                "h64 w4": (128, 64, 4, 4), "s256 h128": (256, 128, 8, 8),
                "s256 h64 c4": (256, 64, 4, 8), "s512 h64": (512, 64, 8, 8),
                "s512 h64 w16": (512, 64, 8, 16), "s256 h64 w16": (256, 64, 8, 16)}


def align(ids, experts, block_m, slice_, hist_rows, w_count, w_rows, kernels="tree",
          parts=("count", "rows"), hist=None):
    mod = align_before if kernels == "old" else ma
    tokens, topk = ids.shape
    n = tokens * topk
    sorted_pairs, block_expert, block_rows = ma.empty_layout(ids, experts, 0, block_m)
    nb = block_expert.shape[0]
    e_p2 = triton.next_power_of_2(experts + 1)
    n_slices = triton.cdiv(n, slice_)
    common = dict(PAIRS_PER_TOKEN=topk, E_P2=e_p2, PDL=False)
    if hist is None:
        hist = torch.empty(n_slices, e_p2, dtype=torch.int32, device=ids.device)
    if "count" in parts:
        mod._slice_counts_kernel[(n_slices,)](ids, hist, n, topk, **common, SLICE=slice_,
                                             num_warps=w_count)
    if "rows" in parts:
        mod._align_sliced_kernel[(n_slices,)](
            ids, hist, sorted_pairs, block_expert, block_rows, n, nb, topk, experts, **common,
            BLOCK_M=block_m, SLICE=slice_, HIST_ROWS=hist_rows,
            BLOCK_CHUNK=max(16, 2048 // e_p2), num_warps=w_rows)
    return sorted_pairs, block_expert, block_rows, hist


def same_layout(a, b) -> bool:
    if not (torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])):
        return False
    block_m = a[0].numel() // a[1].numel()
    live = (torch.arange(block_m, device=a[0].device) < a[2][:, None].clamp(min=0)).flatten()
    return torch.equal(a[0][live], b[0][live])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for tokens in args.tokens:
        logits = torch.randn(tokens, 64, device="cuda", generator=g)
        ids = logits.topk(6, dim=1).indices
        want = ma.align_torch(ids, 64, 0, 64)
        graphs, times = {}, {}
        runs = {name: dict(v=v, parts=("count", "rows")) for name, v in VARIANTS.items()}
        base = VARIANTS.get("tree") or VARIANTS["new tree"]
        runs["tree counts only"] = dict(v=base, parts=("count",))
        runs["tree rows only"] = dict(v=base, parts=("rows",))
        for name, run in runs.items():
            out = align(ids, 64, 64, *run["v"])
            if run["parts"] == ("count", "rows"):
                print(f"  {tokens} tokens {name}: layout equal to align_torch's "
                      f"{same_layout(out, want)}", flush=True)
            hist = out[3]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(20):
                    align(ids, 64, 64, *run["v"], parts=run["parts"], hist=hist)
            graphs[name], times[name] = graph, []
        for i in range(args.rounds):
            for name in (list(graphs) if i % 2 == 0 else list(graphs)[::-1]):
                times[name].append(cuda_time_ms(graphs[name].replay, reps=20) * 1000 / 20)
        print(f"alignment, {tokens} tokens ({tokens * 6} pairs), us, median (rounds)")
        for name in graphs:
            print(f"  {name:18s} {statistics.median(times[name]):7.2f} "
                  f"({min(times[name]):.2f}-{max(times[name]):.2f})", flush=True)


if __name__ == "__main__":
    main()
