"""The block-FP8 GEMM's launch choices: tiles, warps, stages and where the activations are
quantised, as a pure function of the product's shape (`fp8_linear.py` runs them,
`kernels.plan` records them).

The activations are quantised per token in groups of GROUP = 128 columns (DeepSeek-V3's
`act_quant`, arXiv:2412.19437 3.3), and the GEMM's K loop steps one group at a time.

- Few rows (decode, up to INLINE_QUANT_MAX_ROWS): the product streams the FP8 weight once,
  and what matters is reading it at full bandwidth. BLOCK_M = 16 (the smallest tensor-core
  tile), each program a narrow band of BLOCK_N output rows so that the grid holds about
  DECODE_PROGRAMS programs (two waves of an H100's 132 SMs: every SM keeps loads in flight);
  the activations are quantised inside the K loop (each program re-quantises the few rows of
  x, a few hundred bytes a step against its weight tile): one launch, no buffer between two.
- Many rows: 64 x 64 or 128 x 128 tiles, and the activations quantised once by a small
  kernel before the GEMM (quantising inside the loop would redo it in every one of the
  n_out / BLOCK_N column programs, on the CUDA cores, longer than the tile's FP8 MMA).

Not tuned on a GPU yet (no split-K: V3's widest K, 18432, still has 448 programs at one row).
"""

from dataclasses import dataclass

GROUP = 128  # activation columns one scale covers (DeepSeek's act_quant block)
INLINE_QUANT_MAX_ROWS = 16  # up to here the GEMM quantises x itself (one BLOCK_M = 16 tile)
DECODE_PROGRAMS = 256  # the few-row grid's target: BLOCK_N narrows until it has this many
DECODE_BLOCK_N = (64, 32, 16)  # widest first
MID_ROWS = 64  # up to here 64 x 64 tiles, past it 128 x 128


@dataclass(frozen=True)
class Fp8Tiles:
    """One launch of the block-FP8 GEMM: `block_m` x `block_n` outputs a program, K in steps
    of GROUP; `quant` "inline" (the GEMM quantises x in its K loop) or "apart" (a kernel
    before it does, once)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    quant: str  # "inline" | "apart"


def fp8_tiles(rows: int, n_out: int) -> Fp8Tiles:
    """The launch of x w^T for `rows` rows of x and `n_out` output columns."""
    if rows <= INLINE_QUANT_MAX_ROWS:
        block_n = next((b for b in DECODE_BLOCK_N if -(-n_out // b) >= DECODE_PROGRAMS),
                       DECODE_BLOCK_N[-1])
        return Fp8Tiles(16, block_n, num_warps=4, num_stages=4, quant="inline")
    if rows <= MID_ROWS:
        return Fp8Tiles(64, 64, num_warps=4, num_stages=4, quant="apart")
    return Fp8Tiles(128, 128, num_warps=8, num_stages=3, quant="apart")


__all__ = ["GROUP", "Fp8Tiles", "fp8_tiles"]
