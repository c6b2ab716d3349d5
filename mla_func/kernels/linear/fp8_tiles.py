"""The block-FP8 GEMM's launch choices: tiles, warps, stages, the split along K and where the
activations are quantised, as a pure function of the product's shape (`fp8_linear.py` runs
them, `kernels.plan` records them).

The activations are quantised per token in groups of GROUP = 128 columns (DeepSeek-V3's
`act_quant`, arXiv:2412.19437 3.3), and the GEMM's K loop steps one group at a time.

- Few rows (decode, up to FEW_ROWS): the product streams the FP8 weight once, and what
  matters is keeping enough of it in flight. `fp8_gemv`'s launch: DECODE_BLOCK_N output rows
  a program (a 64 x 128 e4m3 tile a K step, 8 KB), K split into `split` slices so that the
  grid holds about DECODE_PROGRAMS programs (two waves of 132 SMs), each program quantising
  its own slice of x (a few hundred bytes against its weight tiles). One row multiplies on
  the CUDA cores (`block_m` 1); two to FEW_ROWS rows take a 16-row e4m3 MMA (`block_m` 16).
- Many rows: 64 x 64 or 128 x 128 tiles, and the activations quantised once by a small
  kernel before the GEMM (quantising inside the loop would redo it in every one of the
  n_out / BLOCK_N column programs, on the CUDA cores, longer than the tile's FP8 MMA).
"""

from dataclasses import dataclass

GROUP = 128  # activation columns one scale covers (DeepSeek's act_quant block)
FEW_ROWS = 16  # up to here the split few-row launch (`fp8_gemv`)
DECODE_PROGRAMS = 256  # the few-row grid's target: K splits until it has about this many
DECODE_BLOCK_N = 64  # output rows of a few-row program
MAX_SPLIT = 16  # K slices at most (the last program sums this many partials)
MID_ROWS = 64  # up to here 64 x 64 tiles, past it 128 x 128


@dataclass(frozen=True)
class Fp8Tiles:
    """One launch of the block-FP8 GEMM: `block_m` x `block_n` outputs a program, K in steps
    of GROUP split into `split` slices; `quant` "inline" (each program quantises its slice of
    x: the few-row launch) or "apart" (a kernel before the GEMM does, once)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    quant: str  # "inline" | "apart"
    split: int = 1


def k_split(n_out: int, n_in: int, block_n: int, programs: int = DECODE_PROGRAMS) -> int:
    """K slices of a few-row launch: enough for about `programs` programs, at most one a
    group and MAX_SPLIT, rounded so that every slice holds as many groups (but the last)."""
    tiles, groups = -(-n_out // block_n), -(-n_in // GROUP)
    split = max(1, min(programs // tiles, groups, MAX_SPLIT))
    steps = -(-groups // split)
    return -(-groups // steps)


def fp8_tiles(rows: int, n_out: int, n_in: int) -> Fp8Tiles:
    """The launch of x w^T for `rows` rows of x, `n_out` output and `n_in` input columns."""
    if rows <= FEW_ROWS:
        return Fp8Tiles(1 if rows <= 1 else 16, DECODE_BLOCK_N, num_warps=4, num_stages=3,
                        quant="inline", split=k_split(n_out, n_in, DECODE_BLOCK_N))
    if rows <= MID_ROWS:
        return Fp8Tiles(64, 64, num_warps=4, num_stages=4, quant="apart")
    return Fp8Tiles(128, 128, num_warps=8, num_stages=3, quant="apart")


__all__ = ["DECODE_BLOCK_N", "DECODE_PROGRAMS", "FEW_ROWS", "GROUP", "Fp8Tiles", "MAX_SPLIT",
           "fp8_tiles", "k_split"]
