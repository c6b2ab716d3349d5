"""Warps of the few-row kernels in the whole step (twenty-sixth session, 2026-11-24): the MoE's
one-row tiles ran faster at 2 warps than at 4 (exp_tiles.py), so the same question for the
other kernels of a 1-4-row layer: `proj_norm` (8 warps), `router_rows` (4) and `mla_merge_uv`
(4). Each variant sets one module's warps while the step is captured. V2-Lite whole-step
graphs, one process, alternating rounds, ms synced / back to back, logits against the tree's:

    PYTHONPATH=. python3 exp_warps.py [--batch 1 2 4] [--ctx 1024] [--rounds 6] [--only ...]
"""

from exp_tiles import graph_of, sweep  # this folder (the script's own directory)

import mla_func.kernels.mla_merge_uv as merge_uv
import mla_func.kernels.proj_norm as proj_norm
import mla_func.kernels.router_rows as router_rows

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
    sweep(VARIANTS, lambda params, state, batch, rows, v: capture(params, state, batch, v), 5,
          batch=[1, 2, 4], ctx=[1024])


if __name__ == "__main__":
    main()
