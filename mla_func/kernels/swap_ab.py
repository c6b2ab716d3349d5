"""Few-row e4m3 products with the operands swapped: w x^T where the rows are fewer than a
Hopper warp-group MMA takes (WGMMA_M): the block-FP8 expert GEMMs' decode tiles (16 rows,
`moe/fp8_gemm.py`).

A tile of 16 token rows against BLOCK_N weight rows, multiplied as x w^T, puts the 16 rows on
the MMA's M: Triton (3.6, sm90) then takes the warp-level MMA, which has no e4m3 form there,
and converts every e4m3 weight and activation to float16 on its way in. Swapped, the weight
tile's BLOCK_N >= WGMMA_M rows are the M of an e4m3 warp-group MMA and the token rows its N
(wgmma's N may be 8-256): both operands are K-major as they lie in memory, which an e4m3
wgmma needs, so the bytes go from shared memory to the tensor cores unconverted. The
accumulator is held [BLOCK_N, rows] (`acc_zeros`) and transposed once after the K loop
(`acc_rows`); each K step's product is scaled as before, per token row and weight row. The
compiled IR is checked for it (`tests/test_fp8_swap_sm90.py`).

Within a K step the e4m3 wgmma adds its products at its own reduced precision (as DeepSeek-V3's
GEMMs do, 3.3.2; the float32 accumulator takes each step's sum): the experts' output moves by
ulps against the float16 MMA's. The projections' few-row GEMM (`linear/fp8_linear.py`) keeps
the unswapped order: swapped it ran no faster (docs/PERF.md, "Tried and not kept").

A kernel sets SWAP as FP8 and rows < WGMMA_M <= BLOCK_N (a compile-time constant: a Triton
function cannot return one).
"""

from typing import no_type_check

import triton
import triton.language as tl

WGMMA_M = tl.constexpr(64)  # the rows of one Hopper warp-group MMA


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def acc_zeros(ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A zero float32 accumulator of ROWS x BLOCK_N outputs: [BLOCK_N, ROWS] where SWAP."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def acc_rows(acc, SWAP: tl.constexpr):
    """An `acc_zeros` accumulator as [ROWS, BLOCK_N]."""
    if SWAP:
        acc = tl.trans(acc)
    return acc
