"""Warps of the few-row kernels in the whole step (twenty-sixth session, 2026-11-24): the MoE's
one-row tiles ran faster at 2 warps than at 4 (exp_tiles.py), so the same question for the
other kernels of a 1-4-row layer: `proj_norm` (8 warps), `router_rows` (4) and `mla_merge_uv`
(4). Each variant sets one module's warps while the step is captured. V2-Lite whole-step
graphs, one process, alternating rounds, ms synced / back to back, logits against the tree's:

    PYTHONPATH=. python3 exp_warps.py [--batch 1 2 4] [--ctx 1024] [--rounds 6] [--only ...]
"""

import argparse
import math

import torch
from exp_tiles import compare, graph_of  # this folder (the script's own directory)

import mla_func as mf
import mla_func.kernels.mla_merge_uv as merge_uv
import mla_func.kernels.proj_norm as proj_norm
import mla_func.kernels.router_rows as router_rows
from scripts.bench_step import decode_batch

# name: (module, its warps constant, value); "tree" patches nothing.
VARIANTS = {
    "tree": None,
    "pn4": (proj_norm, "NUM_WARPS", 4),
    "pn16": (proj_norm, "NUM_WARPS", 16),
    "rr2": (router_rows, "NUM_WARPS", 2),
    "rr8": (router_rows, "NUM_WARPS", 8),
    "uv2": (merge_uv, "NUM_WARPS", 2),
    "uv8": (merge_uv, "NUM_WARPS", 8),
}


def capture(params, state, batch, variant: str):
    patch = VARIANTS[variant]
    if patch is None:
        return graph_of(params, state, batch)
    module, name, value = patch
    real = getattr(module, name)
    setattr(module, name, value)
    try:
        return graph_of(params, state, batch)
    finally:
        setattr(module, name, real)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--only", nargs="+", default=list(VARIANTS))
    args = p.parse_args()
    names = ["tree"] + [v for v in args.only if v != "tree"]
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
            compare(lambda v, b=batch: capture(params, state, b, v), names, args.rounds,
                    f"ctx {ctx} B={bsz}", 5)


if __name__ == "__main__":
    main()
