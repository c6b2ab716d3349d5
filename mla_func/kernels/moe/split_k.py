"""The grouped GEMMs split along K (`MoEConfig.gate_up_split`, `down_split`): at a few tokens
a program's chain of K steps, not the bytes, sets a GEMM's time.

At one token the block-FP8 gate_up has 8 experts (6 routed, 2 shared) x 11 column tiles: 88
programs, each streaming its 128 gate and 128 up weight rows through all 16 K steps of V2-Lite's
hidden 2048, one scaled e4m3 product after the other (each step's product is scaled before the
next is added, `fp8_gemm.mma`). Split into S slices of K, S times as many programs run chains
S times shorter. Each stores its float32 partials ([rows, columns] of its tile: gate's and
up's, or down's one) to a workspace and arrives at its tile's counter
(`launch.counters.last_to_arrive`); the last to arrive sums the S partials in slice order (the
same bits whatever the arrival order, so a graph replay equals eager), leaves the counter zero
and goes on to the epilogue. The counters are the state's: one a (M-tile, N-tile), each GEMM
its own slice (`split_counters`).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.launch.counters import last_to_arrive, slices_summed
from mla_func.kernels.launch.runtime import op_counters

COUNTERS = {"gate_up": "moe_gate_up_split", "down": "moe_down_split"}  # the runtime's slices


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def k_range(n_k, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    """The columns [lo, hi) of K slice `program_id(2)` of SPLIT (whole BLOCK_K steps, the same
    count in every slice but the last)."""
    if SPLIT == 1:
        lo, hi = 0, n_k
    else:
        per = tl.cdiv(tl.cdiv(n_k, BLOCK_K), SPLIT) * BLOCK_K
        lo = tl.program_id(2) * per
        hi = tl.minimum(n_k, lo + per)
    return lo, hi


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _partial_ptrs(part_ptr, s, g, NG: tl.constexpr, rows, offs_n, n_rows, n_cols):
    """Pointers to slice s's partial of product g (of NG) at rows x offs_n."""
    return (part_ptr + ((s * NG + g) * n_rows).to(tl.int64) * n_cols
            + rows.to(tl.int64)[:, None] * n_cols + offs_n[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def store_partial(acc, g, NG: tl.constexpr, part_ptr, rows, offs_n, mask, n_rows, n_cols):
    """This slice's partial of product g (of NG) stored to the workspace ([SPLIT, NG, n_rows,
    n_cols] float32)."""
    tl.store(_partial_ptrs(part_ptr, tl.program_id(2), g, NG, rows, offs_n, n_rows, n_cols),
             acc, mask=mask)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def arrive(cnt_ptr, SPLIT: tl.constexpr):
    """(counter, last): this program's tile counter, and whether it is the last of the tile's
    SPLIT slices to arrive (every partial stored before is then visible to it). The last
    must store 0 to the counter once it has read them."""
    counter = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    return counter, last_to_arrive(counter, SPLIT)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def summed(g, NG: tl.constexpr, part_ptr, rows, offs_n, mask, n_rows, n_cols,
           SPLIT: tl.constexpr):
    """Product g's partials summed over the slices in order (`counters.slices_summed`)."""
    return slices_summed(_partial_ptrs(part_ptr, 0, g, NG, rows, offs_n, n_rows, n_cols),
                         (NG * n_rows).to(tl.int64) * n_cols, mask, SPLIT)


def split_args(split: int, gemm: str, products: int, n_tiles: int, bm: int, n_n: int,
               cols: int, like: Tensor, counters: Tensor) -> dict:
    """A `gemm` launch's K-split keyword arguments (none unsplit): the float32 workspace of
    its `products` partials ([n_tiles * bm, cols] each, a slice) and its counters."""
    if split == 1:
        return {}
    return dict(part_ptr=split_workspace(split, products, n_tiles * bm, cols, like),
                cnt_ptr=split_counters(counters, gemm, n_tiles * n_n), SPLIT=split)


def split_counters(counters: Tensor, gemm: str, tiles: int) -> Tensor:
    """The arrival counters of a split `gemm` ("gate_up" or "down"), one an output tile: its
    slice of the state's counters (a ValueError for more tiles than it holds)."""
    mine = op_counters(counters, COUNTERS[gemm])
    if tiles > mine.numel():
        raise ValueError(f"MoEConfig.{gemm}_split: {tiles} output tiles of the {gemm} GEMM; "
                         f"the op's counters hold {mine.numel()}")
    return mine


def split_workspace(split: int, products: int, rows: int, cols: int, like: Tensor) -> Tensor:
    """The float32 partials of a split GEMM: [split, products, rows, cols]."""
    return like.new_empty(split, products, rows, cols, dtype=torch.float32)


__all__ = ["COUNTERS", "arrive", "k_range", "split_args", "split_counters", "split_workspace",
           "store_partial", "summed"]
