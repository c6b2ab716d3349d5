"""How many of the rows the routed expert GEMMs compute at 4096 tokens are padding (CPU, no
GPU): the routing of `bench moe`'s inputs (router and x as scripts/bench_moe.py makes them,
bf16, seeds 0..), the aligned layout with 128-row tiles and `MoEConfig.merge_tail` (an
expert's tail of at most 64 rows computed as a 64-row product, a longer last tile as 128).

    PYTHONPATH=. python3 docs/perf/2026-11-25-run21/count_padding.py
"""

import torch

from mla_func.config import MLAConfig
from mla_func.ops.moe import route


def rows_computed(counts: list[int], block_m: int = 128) -> int:
    total = 0
    for n in counts:
        full, rem = divmod(n, block_m)
        if rem == 0:
            total += full * block_m
        elif rem <= block_m // 2 and full > 0:  # merge_tail: the tail as a half tile
            total += full * block_m + block_m // 2
        else:
            total += (full + 1) * block_m
    return total


def main() -> None:
    cfg = MLAConfig.preset("v2-lite")
    e, h = cfg.n_routed_experts, cfg.hidden_size
    torch.manual_seed(0)
    for tokens in (2048, 4096, 8192):
        for _ in range(2):
            router = (torch.randn(e, h) * h**-0.5).bfloat16().float()
            x = torch.randn(tokens, h).bfloat16().float()
            _, ids = route(x, router, None, cfg)
            counts = torch.bincount(ids.flatten(), minlength=e).tolist()
            pairs = sum(counts)
            print(f"{tokens} tokens: rows per expert {min(counts)}-{max(counts)}, computed "
                  f"{rows_computed(counts) / pairs:.3f}x the routed pairs")


if __name__ == "__main__":
    main()
