"""The gate_up GEMM split along K (`MoEConfig.gate_up_split`): at a few tokens a program's
chain of K steps, not the bytes, sets the GEMM's time.

At one token the block-FP8 gate_up has 8 experts (6 routed, 2 shared) x 11 column tiles: 88
programs, each streaming its 128 gate and 128 up weight rows through all 16 K steps of V2-Lite's
hidden 2048, one scaled e4m3 product after the other (each step's product is scaled before the
next is added, `fp8_gemm.mma`). Split into S slices of K, S times as many programs run chains
S times shorter. Each stores its float32 gate and up partials ([rows, columns] of its tile) to
a workspace and arrives at its tile's counter (`launch.counters.last_to_arrive`); the last to
arrive sums the S partials in slice order (the same bits whatever the arrival order, so a graph
replay equals eager), leaves the counter zero and goes on to the SiLU·up epilogue. The counters
are the state's (`op_counters(counters, "moe_gate_up_split")`): one a (M-tile, N-tile).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.launch.runtime import op_counters


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
def _partial_ptrs(part_ptr, s, g, rows, offs_n, n_rows, n_inter):
    """Pointers to slice s's partial of product g (0 gate, 1 up) at rows x offs_n."""
    return (part_ptr + ((s * 2 + g) * n_rows).to(tl.int64) * n_inter
            + rows.to(tl.int64)[:, None] * n_inter + offs_n[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def sum_partials(acc_g, acc_u, part_ptr, cnt_ptr, row0, row_ok, offs_n, n_ok, n_rows, n_inter,
                 BM: tl.constexpr, SPLIT: tl.constexpr):
    """This slice's [BM, BLOCK_N] gate and up partials stored at rows row0.. of the
    workspace ([SPLIT, 2, n_rows, n_inter] float32); (gate, up, last): the last program of
    the tile's SPLIT to arrive gets both summed over the slices in order."""
    rows = row0 + tl.arange(0, BM)
    mask = row_ok[:, None] & n_ok[None, :]
    s = tl.program_id(2)
    tl.store(_partial_ptrs(part_ptr, s, 0, rows, offs_n, n_rows, n_inter), acc_g, mask=mask)
    tl.store(_partial_ptrs(part_ptr, s, 1, rows, offs_n, n_rows, n_inter), acc_u, mask=mask)
    counter = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    last = last_to_arrive(counter, SPLIT)
    if last:
        acc_g = tl.zeros_like(acc_g)
        acc_u = tl.zeros_like(acc_u)
        for j in tl.static_range(SPLIT):
            acc_g += tl.load(_partial_ptrs(part_ptr, j, 0, rows, offs_n, n_rows, n_inter),
                             mask=mask, other=0.0, cache_modifier=".cg")
            acc_u += tl.load(_partial_ptrs(part_ptr, j, 1, rows, offs_n, n_rows, n_inter),
                             mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(counter, 0)
    return acc_g, acc_u, last


def split_counters(counters: Tensor, tiles: int) -> Tensor:
    """The split gate_up's arrival counters, one an output tile: the op's slice of the
    state's counters (a ValueError for more tiles than it holds)."""
    mine = op_counters(counters, "moe_gate_up_split")
    if tiles > mine.numel():
        raise ValueError(f"MoEConfig.gate_up_split: {tiles} output tiles of the gate_up GEMM; "
                         f"the op's counters hold {mine.numel()}")
    return mine


def split_workspace(split: int, rows: int, n_inter: int, like: Tensor) -> Tensor:
    """The float32 partials of a split gate_up: [split, 2 (gate, up), rows, n_inter]."""
    return like.new_empty(split, 2, rows, n_inter, dtype=torch.float32)


__all__ = ["k_range", "split_counters", "split_workspace", "sum_partials"]
