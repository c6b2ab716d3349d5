"""Tiles and paths of the fused MoE (`mla_func.kernels.moe.fused`) per static token count.

Picked per step's static token count, never autotuned at run time (graph capture). The table
and the thresholds are measured on V2-Lite (64 experts, top-6, 2 shared, hidden 2048,
moe_inter 1408, bf16): with `scripts/bench_moe.py --sweep` on an H200 and an H100, and the
1-8-token rows in whole-step graphs on an H100 (the comment above `CONFIGS` says which).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """How to run one static size: one M-tile for both GEMMs; (N, K, warps, stages) per GEMM.
    `direct`: the direct layout (no alignment launch; block_m unused, DIRECT_BLOCK_M rows).
    The shared experts are folded in as experts up to FUSE_SHARED_MAX_TOKENS tokens, apart
    beyond. `pdl` (sm90+): the alignment and the gate_up kernel launch while the router runs;
    the shared experts' gate_up tiles start at once.
    `tma` (aligned layout, shared experts apart): the expert weights, and `act` in the down
    GEMM, are read through TMA tensor descriptors instead of pointer loads.
    `shared_stream` (shared experts apart): they run on a side CUDA stream, beside the
    alignment and the routed GEMMs, joined before the sum (the same kernels, the same bits);
    off CUDA (the Triton interpreter) they run in order on the one stream there is.
    `merge_tail` (aligned layout from the alignment launch, shared experts apart): an
    expert's last tile of at most block_m / 2 real rows after a tile of its own (its tail) is
    no program of its own: the program of the tile before it also takes the tail's first
    block_m / 2 rows, a second product on the weight tiles it loads anyway (block_m +
    block_m / 2 rows, two accumulators), so the tail's rows read no weights of their own.
    `inline_align` (aligned layout): no alignment launch; each gate_up program
    finds its routed M-tile from the routing itself (`moe_inline_align`, O(block_m x pairs)
    a program) and the first N-tile's programs write the tile table the down GEMM reads.
    `last_sum` (direct layout): no sum launch; the down GEMM's programs sum
    the pairs (and add + norm) as their tail (`moe_sum.last_sum`): the same bits."""

    block_m: int
    gate_up: tuple[int, int, int, int]
    down: tuple[int, int, int, int]
    direct: bool = False
    pdl: bool = False
    tma: bool = False
    shared_stream: bool = False
    inline_align: bool = False
    last_sum: bool = False
    merge_tail: bool = False


# (max tokens, config): the first row whose bound is >= the step's static token count.
# Up to ~1k tokens V2-Lite is weight-read bound: block_m is sized so that an expert's rows
# (about tokens * topk / experts, plus spread) fit one M-tile and its weights are read once.
# The rows up to 64 tokens and at 512 are the best of `scripts/bench_moe.py --sweep` at their
# bound (and at 8 / 32 tokens) on an H200, 2026-11-22 (docs/perf/2026-11-22-h200-run3); the 128
# and 256 rows the best of that sweep on an H100 (docs/perf/2026-11-22-h100-run26: 411 against
# 421 us at 128 tokens, 429 against 452 at 256; 65-127 and 129-255 tokens not measured). The
# 1024 and the last row are the best of the large-tile candidates of
# docs/perf/2026-11-22-run12/exp_moe.py on an H100 (docs/perf/2026-11-22-h100-run13), timed at
# 1024 and 4096 tokens: 128-row tiles, TMA loads, shared experts apart (558 against 592 us at
# 1024, 1304 against 1438 at 4096; between 513 and 1023 tokens this choice is not measured);
# the last row's down GEMM then got a fourth stage (4096 tokens: 289 against 319 us, run 27).
# 1-4 tokens: the direct layout (`moe_tile.direct_tile`) instead of the alignment launch (~9 us):
# 47 vs 52 us at 1 token, 71 vs 80 at 2, 108 vs 111 at 4. It re-reads an expert once per token
# that picks it, so past a few tokens the aligned layout wins. `pdl` is on in every row: the layer
# took 3-13 us less with it from 1 to 512 tokens on an H100 (docs/perf/2026-11-22-h100-run11,
# `fused_no_pdl`), 1 us less at 1024 (run 14); at 4096 19 us less in run 14 and 8 us more in run
# 22: no difference beyond run-to-run noise there. `shared_stream` from 513 to 2560 tokens and
# from 3585 (the shared experts run apart from 513): H100, 2026-11-23, the layer alone (run 2,
# `exp_shared_stream.py`, medians of 3 alternating rounds): 517 against 532 us at 1024 tokens,
# 691 against 722 at 2048, 1205 against 1226 at 4096. Past 2048 it had stayed off: in the
# piecewise prefill step at 4096 tokens it was slower (runs 5-6: 52.2-53.2 against 50.2-51.1
# ms; graphs covered 4096 tokens then). Re-measured on the merge_tail kernels (H100,
# 2026-11-25, docs/perf/2026-11-25-h100-run6, run7, run13, docs/perf/2026-11-25-run6/exp_mid.py,
# docs/perf/2026-11-25-run12/exp_fork.py, medians of 6 alternating rounds, on against off): the
# layer alone in CUDA graphs 733.1 against 774.1 us at 2560 tokens, 854.1 / 873.4 against
# 906.4 / 885.4 at 3072 (runs 6 / 13), 1109.3 / 1118.3 against 1141.2 / 1142.6 at 4096, 2193.3 /
# 2141.2 against 2196.1 / 2168.5 at 8192. Steps past 2560 tokens run eagerly in every mode (the
# compiler's largest bucket), where the stream's fork and join add host work. The whole eager
# prefill step, one prompt (docs/perf/2026-11-25-h100-run14, docs/perf/2026-11-25-run12/
# exp_eager.py, medians of 8 alternating rounds, ms synced, on against off): 67.43 against
# 63.19 at 3072 tokens, 68.09 against 63.98 at 3584 (where the host took about as long to queue
# a step, 58-66 ms, as the step took), 49.11 against 49.85 at 4096, 72.49 against 73.25 at 6144,
# 100.78 against 101.60 at 8192; run 19 (another machine): 44.67 against 45.36 at 3840, and at
# 4096 57.98 against 48.93, where the host slowed the first five rounds of both (56-64 and
# 48-57 ms) and the last three were even (48.2-49.8 against 48.7-49.0). So the rows up to 2560
# tokens and past 3584 have it, the row between does not. Called eagerly (no graphs), steps of
# 513-2560 tokens pay the host work too: the layers queued eagerly were 7-10% slower with the
# stream at 2048 and 2560 tokens (run 13); the table favours the graphs there.
# `merge_tail` from 1025 tokens: H100,
# 2026-11-25 (docs/perf/2026-11-25-h100-run1, `exp_tail.py`, the layer alone, medians of 6
# alternating rounds, on against the table before it): 632.0 against 664.4 us at 2048 tokens
# (whole tiles before), 1156.5 against 1183.7 at 4096 and 2124.6 against 2202.1 at 8192 (half
# tiles before: `halves`, runs padded to 64-row units two a program, since removed; it had
# beaten whole tiles from 4096 tokens, docs/perf/2026-11-23-h100-run53). At 1024 tokens no
# expert of random routing had a tail and it was slower, 529.3 against 516.9: there the down
# GEMM's 128-column tiles leave room for two programs a SM, and the second accumulator's
# registers and shared memory leave one (ptxas, sm90: 146 against 106 registers, 123 against
# 98 KB); so that row keeps whole tiles. Between the measured sizes it was then timed at 1536,
# 2560 and 3072 tokens (2026-11-25, docs/perf/2026-11-25-h100-run6, run7, exp_mid.py, on
# against off): 570.3 against 599.2 us, 774.1 against 802.8, 906.4 against 963.5.
# `inline_align` from 5 to 128 tokens (the aligned rows of decode sizes): H100, 2026-11-24
# (docs/perf/2026-11-24-h100-run59, `exp_inline.py`, medians of 4 alternating rounds, on against
# off): the layer alone 315.1 / 366.5 / 397.5 / 405.3 against 319.8 / 371.9 / 400.3 / 410.2 us at 16
# / 32 / 64 / 128 tokens; V2-Lite whole-step graphs, ctx 1024, ms synced / back to back: B=32 11.390
# / 11.367 against 11.499 / 11.470, B=64 12.573 / 12.316 against 12.607 / 12.351, B=128 13.497 /
# 13.335 against 13.594 / 13.435. Its per-program work grows with the pairs (a [block_m, pairs]
# selection), so larger steps keep the alignment launch (a first form that went over the pairs in
# 128-pair steps was 2% slower at 128 tokens, run 58). `last_sum` at 1 token: H100, 2026-11-24
# (docs/perf/2026-11-24-h100-run75, run76, exp_last.py, on against off): the layer alone 57.1
# against 58.5 us (6 alternating rounds: 57.0-57.2 against 57.3-58.7); V2-Lite whole-step graphs at
# B=1, ms synced / back to back, 8 rounds: 2.409 / 2.395 against 2.420 / 2.406 at ctx 1024, 2.486 /
# 2.471 against 2.492 / 2.478 at 4096 (6 rounds in run 75: 2.420 / 2.397 against 2.428 / 2.409). Its
# last programs go over the tokens one at a time: the step at B=2 / 4 was slower with it (3.522 /
# 3.494 against 3.502 / 3.483, 5.199 / 5.166 against 5.113 / 5.076, run 75), though the layer alone
# at 2 tokens was faster (94.4 against 95.0). The 1-8-token rows' tiles were then re-measured in
# V2-Lite whole-step graphs on an H100, 2026-11-24 (docs/perf/2026-11-24-h100-run149, run150,
# run151; docs/perf/2026-11-24-run148/exp_tiles.py; one process, alternating rounds, ms back to
# back against the H200 sweep's tiles, the same logits): B=1 gate_up at 2 warps and 3 stages, down
# 32 columns at 3 stages: 2.336 against 2.357 at ctx 1024 (run 150); B=2 down 128 x 128 at 3 stages:
# 3.285 against 3.310; B=4 gate_up at 2 warps, down 128 x 128: 4.937 against 5.000; B=8 (a row of
# its own now) gate_up at 2 warps: 6.927 against 6.982. Run 151 repeats them at ctx 512 and 4096
# (docs/PERF.md). Run 154 (ctx 1024): B=3 was slower on the new 4-token tiles (4.228 against 4.187),
# so 3 tokens keep the old ones in a row of their own; B=6 took the 8-token row's (6.238 against
# 6.245); at B=16 the 2-warp gate_up was slower (9.456 against 9.400), so 9-16 tokens keep theirs.
CONFIGS: tuple[tuple[int, MoEConfig], ...] = (
    (1, MoEConfig(16, (32, 128, 2, 3), (32, 128, 4, 3), direct=True, pdl=True,
                  last_sum=True)),
    (2, MoEConfig(16, (32, 128, 4, 4), (128, 128, 4, 3), direct=True, pdl=True)),
    (3, MoEConfig(16, (32, 128, 4, 4), (64, 64, 4, 4), direct=True, pdl=True)),
    (4, MoEConfig(16, (32, 128, 2, 4), (128, 128, 4, 4), direct=True, pdl=True)),
    (8, MoEConfig(16, (32, 256, 2, 3), (64, 128, 4, 3), pdl=True, inline_align=True)),
    (16, MoEConfig(16, (32, 256, 4, 3), (64, 128, 4, 3), pdl=True, inline_align=True)),
    (64, MoEConfig(16, (32, 128, 4, 4), (64, 128, 4, 3), pdl=True, inline_align=True)),
    (128, MoEConfig(32, (128, 128, 8, 3), (64, 128, 4, 3), pdl=True, inline_align=True)),
    (256, MoEConfig(64, (64, 128, 4, 3), (64, 64, 4, 4), pdl=True)),
    (512, MoEConfig(64, (64, 64, 4, 4), (128, 64, 8, 4), pdl=True)),
    (1024, MoEConfig(128, (128, 64, 8, 3), (128, 64, 8, 3), pdl=True, tma=True,
                     shared_stream=True)),
    (2560, MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), pdl=True, tma=True,
                     shared_stream=True, merge_tail=True)),
    (3584, MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), pdl=True, tma=True,
                     merge_tail=True)),
    (1 << 62, MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), pdl=True, tma=True,
                        shared_stream=True, merge_tail=True)),
)

DIRECT_MAX_TOKENS = max(bound for bound, cfg in CONFIGS if cfg.direct)
DIRECT_BLOCK_M = 16  # tl.dot's smallest M; also the most tokens the direct layout holds

# Shared experts ride in the routed launches up to this many tokens (as extra experts every
# token routes to); past it their `tokens` rows span many M-tiles, each re-reading the shared
# weights, and `kernels.swiglu` (cuBLAS GEMMs) runs them apart. H200, 2026-11-22: folded 305 /
# 323 / 342 us against apart 307 / 331 / 363 us at 128 / 256 / 512 tokens. H100 (run 13), with
# 128-row tiles: apart 561 us (558 with TMA) against folded 564 at 1024 tokens.
FUSE_SHARED_MAX_TOKENS = 512


def pick_config(tokens: int) -> MoEConfig:
    return next(cfg for bound, cfg in CONFIGS if tokens <= bound)
