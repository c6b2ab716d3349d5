"""The block-FP8 GEMM's launch choices: tiles, warps, stages, the split along K and where the
activations are quantised, as a pure function of the product's shape (`fp8_linear.py` runs
them, `kernels.plan` records them).

The activations are quantised per token in groups of GROUP = 128 columns (DeepSeek-V3's
`act_quant`, arXiv:2412.19437 3.3), and the GEMM's K loop steps one group at a time.

- Few rows (decode, up to FEW_ROWS): the product streams the FP8 weight once, and what
  matters is keeping enough of it in flight: 128 output rows a program (a 128 x 128 e4m3
  tile a K step, 16 KB), K split (`k_split`) until the grid holds about FEW_ROW_PROGRAMS,
  each program quantising its own slice of x (a few hundred bytes against its weight
  tiles). One row multiplies on the CUDA cores with 4 warps (`block_m` 1), two to FEW_ROWS
  rows take a 16-row e4m3 MMA with 8.
- Many rows: 64 x 64 tiles, or past MID_ROWS rows 64 x 128 (4 warps, 3 stages) where those
  alone make FULL_GRID programs, the activations quantised once by a small kernel before the
  GEMM (inline, each of the n_out / block_n column tiles would redo it on the CUDA cores,
  longer than its MMA), and K split too where the tiles alone leave the grid short of
  PROGRAMS (a decode batch of 32-128 rows, a short prefill of a narrow product).

The few-row choices are `scripts/bench_fp8.py --sweep`'s best on an H200 (docs/PERF.md):
at V3's 7168 x 18432 one row read 2.55 TB/s with 128-row tiles and 4 warps against 1.17
with 64 rows and two slices, and 16 rows 2.0 TB/s with 8 warps; V2-Lite's 2048-3072 x
2048 products are within a microsecond of each other in every launch tried. At 32-128
rows about 256 programs beat 512 (V2-Lite's o_proj at 128 rows: 16.1 us split 4 ways
against 23.3 split 8 ways). Past 128 rows 64 x 128 tiles were the fastest of 8 launches
wherever they fill FULL_GRID programs, and 64 x 64 (split) where they do not (docs/DECISIONS.md,
`fp8_tiles.FULL_GRID`); the 128 x 128 tiles before them spilled on sm90 and ran 1.5-3x slower.
"""

from dataclasses import dataclass

GROUP = 128  # activation columns one scale covers (DeepSeek's act_quant block)
FEW_ROWS = 16  # up to here each program quantises its slice of x
FEW_ROW_PROGRAMS = 512  # the grid a few-row launch splits K towards (~4 programs an SM)
PROGRAMS = 256  # ... and a many-row one (~2 an SM: its x comes quantised, its tiles are MMAs)
DECODE_BLOCK_N = 128  # output rows of a few-row program
MAX_SPLIT = 16  # K slices at most (the last program sums this many partials)
MID_ROWS = 128  # up to here 64 x 64 tiles, past it 64 x 128 ...
FULL_GRID = 128  # ... where that many of them (unsplit) make the grid


@dataclass(frozen=True)
class Fp8Tiles:
    """One launch of the block-FP8 GEMM: `block_m` x `block_n` outputs a program, K in steps
    of GROUP split into `split` slices; `quant` "inline" (each program quantises its slice of
    x) or "apart" (a kernel before the GEMM does, once)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    quant: str  # "inline" | "apart"
    split: int = 1


def k_split(rows: int, n_out: int, n_in: int, block_m: int, block_n: int,
            programs: int = PROGRAMS) -> int:
    """K slices of a launch: enough for about `programs` programs, at most one a group and
    MAX_SPLIT, rounded so that every slice holds as many groups (but the last)."""
    tiles = -(-rows // block_m) * -(-n_out // block_n)
    groups = -(-n_in // GROUP)
    split = max(1, min(programs // tiles, groups, MAX_SPLIT))
    steps = -(-groups // split)
    return -(-groups // steps)


def fp8_tiles(rows: int, n_out: int, n_in: int) -> Fp8Tiles:
    """The launch of x w^T for `rows` rows of x, `n_out` output and `n_in` input columns."""
    programs = PROGRAMS
    if rows <= FEW_ROWS:
        block_m, warps, quant = (1, 4, "inline") if rows <= 1 else (16, 8, "inline")
        block_n, stages, programs = DECODE_BLOCK_N, 3, FEW_ROW_PROGRAMS
    elif rows <= MID_ROWS or -(-rows // 64) * -(-n_out // 128) < FULL_GRID:
        block_m, block_n, warps, stages, quant = 64, 64, 4, 4, "apart"
    else:
        block_m, block_n, warps, stages, quant = 64, 128, 4, 3, "apart"
    return Fp8Tiles(block_m, block_n, warps, stages, quant,
                    k_split(rows, n_out, n_in, block_m, block_n, programs))


__all__ = ["DECODE_BLOCK_N", "FEW_ROWS", "FEW_ROW_PROGRAMS", "FULL_GRID", "GROUP", "MAX_SPLIT",
           "MID_ROWS", "PROGRAMS", "Fp8Tiles", "fp8_tiles", "k_split"]
