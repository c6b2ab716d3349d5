"""Tiles and paths of the fused MoE (`mla_func.kernels.moe.fused`) per static token count.

Picked per step's static token count, never autotuned at run time (graph capture). The table
and the thresholds are measured on V2-Lite (64 experts, top-6, 2 shared, hidden 2048,
moe_inter 1408, bf16): with `scripts/bench_moe.py --sweep` on an H200 and an H100, and the
1-8-token rows in whole-step graphs on an H100 (the comment above `CONFIGS` says which).

Under expert parallelism (a rank holds El = experts / tp of the routed experts) the rows keep
their keys: a rank's expert receives about tokens * topk / experts pairs at any tp, the rows
per expert the tiles are sized for. The local count sets what depends on it in
`fused.fused_experts` (the tile table's static bound `align.max_blocks`, the alignment's bins
and its one-program bound), and the shared experts' slice, whose width is the shared MLP's / tp,
folds in only where it is whole experts of moe_inter (`fold_shared`, `kernels.plan`).
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
    the pairs (and add + norm) as their tail (`moe_sum.last_sum`): the same bits.
    `quant_x` (block-FP8 experts): x is quantised once a token (`act_quant.quant_tokens`)
    before the gate_up GEMM, which then reads e4m3 rows instead of quantising each x tile
    in every one of its column programs: the same bits. `quant_act` likewise quantises
    `act` (gate_up's output) once before the down GEMM. `gate_up_split` and `down_split`
    (direct layout): that GEMM's K in this many slices, a program each, summed by the last to
    arrive (`split_k`: shorter chains of K steps where a few programs would each run all of
    K)."""

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
    quant_x: bool = False
    quant_act: bool = False
    gate_up_split: int = 1
    down_split: int = 1


# (max tokens, config): the first row whose bound is >= the step's static token count.
# Up to ~1k tokens V2-Lite is weight-read bound: block_m is sized so that an expert's rows
# (about tokens * topk / experts, plus spread) fit one M-tile and its weights are read once.
# Where each row and flag comes from (docs/DECISIONS.md, the `moe.config.CONFIGS` and
# `MoEConfig` rows): the rows up to 64 tokens and at 512 are the best of
# `scripts/bench_moe.py --sweep` on an H200, the 128 and 256 rows the best of it on an H100
# (65-127 and 129-255 tokens not measured), the 1024 and the last rows the best large-tile
# candidates on an H100 (128-row tiles, TMA loads, shared experts apart; 513-1023 tokens not
# measured), and the 1-8-token rows were re-swept in V2-Lite whole-step graphs on an H100 (3
# tokens keep the older tiles, and 9-16 tokens theirs: the new ones were slower there).
# 1-4 tokens: the direct layout (`moe_tile.direct_tile`) instead of the alignment launch (~9 us);
# it re-reads an expert once per token that picks it, so past a few tokens the aligned layout
# wins. `pdl` is on in every row. `shared_stream` from 513 to 2560 tokens and from 3585 (the
# shared experts run apart from 513): steps past 2560 tokens run eagerly in every mode (the
# compiler's largest bucket), where the stream's fork and join add host work: it lost where the
# host bounds the eager step (3072-3584 tokens) and won where the GPU does. Called eagerly (no
# graphs), steps of 513-2560 tokens pay that host work too; the table favours the graphs there.
# `merge_tail` from 1025 tokens: at 1024 no expert of random routing has a tail, and the second
# accumulator leaves one program an SM where whole tiles fit two, so that row keeps whole tiles.
# `inline_align` from 5 to 128 tokens: its per-program work grows with the pairs (a [block_m,
# pairs] selection), so larger steps keep the alignment launch. `last_sum` at 1 token only: its
# last programs go over the tokens one at a time, and the step at 2 and 4 tokens was slower.
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


# Block FP8 (`fp8_gemm.py`): a K step is one activation scale group and one weight block
# (DeepSeek's 128 columns), quantised in registers and its product scaled before it is added,
# so a program holds more than the bf16 form: the bf16 rows' tiles spill. These rows are the
# bf16 rows with BLOCK_K = 128, changed until ptxas reported no spill for sm90 (Triton 3.9,
# ahead-of-time: `tests/test_moe_fp8_cuda.py`), then swept (`bench moe --weights fp8 --sweep`, an
# H200, 2026-11-28): the last row (4096 tokens: 3433 -> 2406 -> 1887 us a layer) before the
# 16-row tiles multiplied swapped (`kernels.swap_ab`), the rows of 1-128 tokens after it,
# where 64-256-column tiles feed the e4m3 warp-group MMA (a layer at 1 / 2 / 4 / 8 / 64 / 128
# tokens: 38.5 -> 35.9, 52.3 -> 47.5, 90.6 -> 73.6, 113 -> 102, 187 -> 159, 186 -> 173 us;
# 3 tokens take 2 and 4's tiles untimed; 16 and 32 tokens within 2% of their rows, kept).
# The one-token row's gate_up (8 warps, K in 3 slices: `gate_up_split`) is the fastest of 12
# tile and split variants in V2-Lite's whole-step graph at B=1 (1.726 against 1.799 ms; the
# layer alone ranks them otherwise), and its down GEMM's K in 2 slices (`down_split`) 1.720
# against 1.736 in the next such run. The 1025-3584-token rows are the best of the sweep at
# 2048 tokens (860 against 1310 us a layer); the 1024 and the last row take its `quant_act`
# (463 against 540 us at 1024 tokens, 1521 against 1866 at 4096; docs/DECISIONS.md,
# `moe.config.FP8_CONFIGS`); 129-512 tokens are not timed. `quant_x` (x quantised once) is on
# where a sweep chose it and from 256 tokens, `quant_act` where a sweep chose it and from 513.
FP8_BLOCK_K = 128
_K = FP8_BLOCK_K
FP8_CONFIGS: tuple[tuple[int, MoEConfig], ...] = (
    (1, MoEConfig(16, (128, _K, 8, 3), (128, _K, 8, 3), direct=True, pdl=True, last_sum=True,
                  gate_up_split=3, down_split=2)),
    (2, MoEConfig(16, (64, _K, 4, 3), (256, _K, 8, 3), direct=True, pdl=True)),
    (3, MoEConfig(16, (64, _K, 4, 3), (256, _K, 8, 3), direct=True, pdl=True)),
    (4, MoEConfig(16, (64, _K, 4, 3), (256, _K, 8, 3), direct=True, pdl=True)),
    (8, MoEConfig(16, (64, _K, 4, 3), (128, _K, 8, 3), pdl=True, inline_align=True,
                  quant_x=True)),
    (16, MoEConfig(16, (64, _K, 4, 3), (128, _K, 8, 3), pdl=True, inline_align=True,
                   quant_x=True)),
    (64, MoEConfig(16, (128, _K, 8, 3), (128, _K, 4, 4), pdl=True, inline_align=True,
                   quant_act=True)),
    (128, MoEConfig(16, (128, _K, 8, 3), (64, _K, 4, 3), pdl=True, inline_align=True,
                    quant_x=True, quant_act=True)),
    (256, MoEConfig(64, (64, _K, 8, 3), (64, _K, 4, 2), pdl=True, quant_x=True)),
    (512, MoEConfig(64, (64, _K, 8, 4), (128, _K, 8, 4), pdl=True, quant_x=True)),
    (1024, MoEConfig(64, (128, _K, 8, 3), (256, _K, 8, 3), pdl=True, tma=True, quant_x=True,
                     quant_act=True, shared_stream=True)),
    (2560, MoEConfig(64, (128, _K, 8, 3), (256, _K, 8, 3), pdl=True, tma=True, quant_x=True,
                     quant_act=True, shared_stream=True, merge_tail=True)),
    (3584, MoEConfig(64, (128, _K, 8, 3), (256, _K, 8, 3), pdl=True, tma=True, quant_x=True,
                     quant_act=True, merge_tail=True)),
    (1 << 62, MoEConfig(64, (128, _K, 8, 3), (256, _K, 8, 3), pdl=True, tma=True, quant_x=True,
                        quant_act=True, shared_stream=True, merge_tail=True)),
)


# FP8 rows (their bounds) whose kernels spill registers on sm90 and were still measured the
# fastest: the merged tails' 128- and 256-column tiles (gate_up 384 and down 24 bytes of
# spill under Triton 3.6 with `quant_act`) took 2406 us a layer at 4096 tokens where the
# spill-free 64- and 128-column tiles took 3433, and 860 against 1310 at 2048 tokens (H200,
# `bench moe --weights fp8 --sweep`, 2026-11-28).
FP8_SPILLS = frozenset({2560, 3584, 1 << 62})


def check_config(cfg: MoEConfig, tokens: int, topk: int, n_shared: int,
                 inline_max_pairs: int) -> None:
    """A ValueError where `cfg` cannot run `tokens` tokens of top-`topk` with `n_shared`
    shared experts folded in (`inline_max_pairs`: the most routed pairs inline_align takes)."""
    if cfg.tma and (cfg.direct or n_shared):
        raise ValueError("MoEConfig.tma needs the aligned layout and the shared experts apart")
    if cfg.merge_tail and (cfg.direct or n_shared or cfg.block_m < 32 or cfg.inline_align):
        raise ValueError("MoEConfig.merge_tail needs the aligned layout found by the alignment "
                         "launch (not inline_align), the shared experts apart and "
                         "block_m >= 32")
    if cfg.inline_align and cfg.direct:
        raise ValueError("MoEConfig.inline_align needs the aligned layout")
    if cfg.inline_align and tokens * topk > inline_max_pairs:
        raise ValueError(f"MoEConfig.inline_align takes at most {inline_max_pairs} routed pairs;"
                         f" got {tokens} tokens x top-{topk}")
    if cfg.shared_stream and n_shared:
        raise ValueError("MoEConfig.shared_stream needs the shared experts apart")
    if cfg.direct and tokens > DIRECT_BLOCK_M:
        raise ValueError(f"the direct path takes at most {DIRECT_BLOCK_M} tokens")
    if cfg.last_sum and not cfg.direct:
        raise ValueError("last_sum needs the direct layout (MoEConfig.direct)")
    for name in ("gate_up_split", "down_split"):
        split = getattr(cfg, name)
        if split < 1 or (split > 1 and not cfg.direct):
            raise ValueError(f"MoEConfig.{name} {split}: 1, or more slices of K on the direct "
                             f"layout (MoEConfig.direct)")


def pick_config(tokens: int, fp8: bool = False) -> MoEConfig:
    """The row of `tokens` tokens: of the FP8 table for block-FP8 experts."""
    return next(cfg for bound, cfg in (FP8_CONFIGS if fp8 else CONFIGS) if tokens <= bound)


def fold_shared(tokens: int, width: int, moe_inter: int, fp8: bool = False) -> bool:
    """Whether a shared MLP `width` wide rides in the routed launches at `tokens` tokens (as
    width / moe_inter experts): up to FUSE_SHARED_MAX_TOKENS tokens, and only where the width is
    a multiple of moe_inter (a tensor-parallel slice may not be: V3's 2048 at tp = 2). In
    block FP8 also only where moe_inter is whole K steps (FP8_BLOCK_K): each expert's slice of
    the shared down weights then starts its own scale blocks."""
    return (tokens <= FUSE_SHARED_MAX_TOKENS and width % moe_inter == 0
            and (not fp8 or moe_inter % FP8_BLOCK_K == 0))
