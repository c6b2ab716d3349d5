"""Tiles and paths of the fused MoE (`mla_func.kernels.fused_moe`) per static token count.

Picked per step's static token count, never autotuned at run time (graph capture). The table
and the thresholds are measured with `scripts/bench_moe.py --sweep` on an H200 (V2-Lite: 64
experts, top-6, 2 shared, hidden 2048, moe_inter 1408, bf16).
"""

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """How to run one static size: one M-tile for both GEMMs; (N, K, warps, stages) per GEMM.
    `direct`: the direct layout (no alignment launch; block_m unused, DIRECT_BLOCK_M rows).
    `fused_sum` (direct only): the down kernel also sums each token's pairs, one program per
    N-tile of hidden (so narrow N tiles). `fuse_shared`: shared experts folded in as experts
    (None: up to FUSE_SHARED_MAX_TOKENS tokens)."""

    block_m: int
    gate_up: tuple[int, int, int, int]
    down: tuple[int, int, int, int]
    direct: bool = False
    fused_sum: bool = False
    fuse_shared: bool | None = None


# (max tokens, config): the first row whose bound is >= the step's static token count.
# Up to ~1k tokens V2-Lite is weight-read bound: block_m is sized so that an expert's rows
# (about tokens * topk / experts, plus spread) fit one M-tile and its weights are read once.
# Rows for 1-32, 512 and 4096 tokens are the best of `scripts/bench_moe.py --sweep` on an H200
# (docs/perf/2026-11-21-h200-run1/bench_moe.log); the others are interpolated guesses.
CONFIGS: tuple[tuple[int, MoEConfig], ...] = (
    (4, MoEConfig(16, (32, 128, 4, 4), (64, 128, 4, 4))),
    (16, MoEConfig(16, (32, 256, 4, 3), (64, 128, 4, 3))),
    (64, MoEConfig(16, (32, 128, 4, 4), (64, 128, 4, 3))),
    (256, MoEConfig(32, (64, 64, 4, 4), (64, 64, 4, 4))),
    (1024, MoEConfig(64, (64, 64, 4, 4), (128, 64, 8, 4))),
    (1 << 62, MoEConfig(128, (128, 64, 8, 4), (128, 64, 8, 4))),
)

# Up to this many tokens the direct layout (`moe_align.direct_tile`) replaces the alignment
# launch (~4.6 us of a 1-token layer on an H200). It re-reads an expert once per token that
# picks it, so it pays only while such repeats are rare; `bench_moe.py --sweep` compares 1/2/4.
DIRECT_MAX_TOKENS = 1
DIRECT_BLOCK_M = 16  # tl.dot's smallest M; also the most tokens the direct layout holds
# At 1 token the direct path runs the GEMMs of the aligned one (the same tiles, 1 row per
# expert), minus the alignment launch; fused_sum stays off until measured.
DIRECT_CONFIG = dataclasses.replace(CONFIGS[0][1], direct=True)

# Shared experts ride in the routed launches only up to this many tokens: past it their
# `tokens` rows span several M-tiles, each re-reading the shared weights, and a separate
# swiglu (one dense GEMM) is faster (H200: 365 vs 427 us at 128 tokens).
FUSE_SHARED_MAX_TOKENS = 64


def pick_config(tokens: int) -> MoEConfig:
    if tokens <= DIRECT_MAX_TOKENS:
        return DIRECT_CONFIG
    return next(cfg for bound, cfg in CONFIGS if tokens <= bound)
