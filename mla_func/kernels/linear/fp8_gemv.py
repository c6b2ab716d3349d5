"""x w^T in block FP8 at a few rows (decode): the weight streamed once, split along K.

A few-row product reads its weight once and does almost no arithmetic, so its time is the
weight's bytes over the bandwidth the launch keeps in flight. The launch (`fp8_tiles`) gives
each program BLOCK_N output rows and a slice of K (`steps` groups of 128 columns), so that
the grid holds about two waves of programs whatever the shape, and each program's weight
tiles are wide (BLOCK_N x 128 e4m3, 8 KB at 64 rows) and few, all in flight at once.

Numerics are `fp8_linear`'s (DeepSeek-V3's): each program quantises its own slice of x per
token and 128 columns (scale amax / 448; the same values as `_act_quant_kernel`), multiplies
a K step of e4m3 by e4m3 into a fresh float32 tile, scales it by the two scales and adds it
to its float32 accumulator. One row (ROWS = 1) multiplies on the CUDA cores (float32
products of e4m3 values are exact); more rows take a 16-row e4m3 `tl.dot`.

With SPLIT > 1 every program stores its float32 partial to a [SPLIT, rows, n_out] workspace
and arrives at its column tile's counter (`launch.counters.last_to_arrive`); the last of the
tile's programs to arrive sums the partials in split order -- the same bits whatever the
arrival order, so a graph replay equals eager -- writes y and leaves the counter zero. The
counters are the runtime's (`op_counters(counters, "fp8_linear")`): two launches on one
runtime's counters must not overlap.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.e4m3 import divide, group_scale, to_e4m3
from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.linear.fp8_tiles import GROUP, Fp8Tiles


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _fp8_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, n_rows, n_in, n_out, sx, rows_per_stack,
    blocks_out, blocks_in, block_rows, block_cols, steps,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr, SUB: tl.constexpr,
    SPLIT: tl.constexpr, DOT: tl.constexpr,
):
    """y[m, n] for ROWS rows m (block `program_id(2)`) and BLOCK_N columns n over K slice
    `program_id(1)` (`steps` groups of SUB x BK columns), summed over the slices by the last
    to arrive."""
    tile, split, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = block * ROWS + tl.arange(0, ROWS)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < n_rows, n < n_out
    m64, n64 = m.to(tl.int64), n.to(tl.int64)
    s_row = (n // rows_per_stack) * blocks_out + (n % rows_per_stack) // block_rows
    kk = tl.arange(0, BK)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    k_lo = split * steps * (SUB * BK)
    k_hi = tl.minimum(n_in, k_lo + steps * (SUB * BK))
    for k0 in range(k_lo, k_hi, SUB * BK):
        amax = tl.zeros([ROWS], dtype=tl.float32)
        for j in tl.static_range(SUB):
            k = k0 + j * BK + kk
            x = tl.load(x_ptr + m64[:, None] * sx + k[None, :],
                        mask=m_ok[:, None] & (k < n_in)[None, :], other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        xs = group_scale(amax)
        for j in tl.static_range(SUB):
            k = k0 + j * BK + kk
            k_ok = k < n_in
            x = tl.load(x_ptr + m64[:, None] * sx + k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                        other=0.0)
            xq = to_e4m3(divide(x.to(tl.float32), xs[:, None]))
            wq = tl.load(w_ptr + n64[:, None] * n_in + k[None, :],
                         mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            ws = tl.load(ws_ptr + s_row * blocks_in + (k0 + j * BK) // block_cols, mask=n_ok,
                         other=0.0)
            if DOT:
                prod = tl.dot(xq, tl.trans(wq))
            else:  # one row: float32 products on the CUDA cores (exact), summed along K
                x1 = tl.reshape(xq.to(tl.float32), [BK])
                prod = tl.sum(wq.to(tl.float32) * x1[None, :], axis=1)[None, :]
            acc += prod * xs[:, None] * ws[None, :]
    y_ptrs = y_ptr + m64[:, None] * n_out + n64[None, :]
    mn_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mn_ok)
    else:
        part = part_ptr + m64[:, None] * n_out + n64[None, :]
        tl.store(part + split * n_rows * n_out, acc, mask=mn_ok)
        counter = cnt_ptr + block * tl.num_programs(0) + tile
        if last_to_arrive(counter, SPLIT):
            total = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                total += tl.load(part + s * n_rows * n_out, mask=mn_ok, other=0.0,
                                 cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mn_ok)
            tl.store(counter, 0)


def gemv(x: Tensor, data: Tensor, scales: Tensor, block: tuple[int, int], bk: int,
         tiles: Fp8Tiles, counters: Tensor) -> Tensor:
    """x w^T (`fp8_linear.run`'s arguments; `bk` its sub-step, `counters` the op's slice) by
    the split launch `tiles`."""
    rows, n_in = x.shape
    stack, blocks_out, blocks_in = scales.shape
    n_out = data.numel() // n_in
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n_out, tiles.block_n), tiles.split, triton.cdiv(rows, tiles.block_m))
    if tiles.split > 1 and grid[0] * grid[2] > counters.numel():
        raise ValueError(f"a split FP8 launch of {grid[0] * grid[2]} output tiles needs as "
                         f"many counters; the op owns {counters.numel()}")
    part = (torch.empty(tiles.split, rows, n_out, dtype=torch.float32, device=x.device)
            if tiles.split > 1 else y)
    steps = triton.cdiv(triton.cdiv(n_in, GROUP), tiles.split)
    _fp8_gemv_kernel[grid](
        x, data, scales, y, part, counters, rows, n_in, n_out, x.stride(0), n_out // stack,
        blocks_out, blocks_in, block[0], block[1], steps,
        ROWS=tiles.block_m, BLOCK_N=tiles.block_n, BK=bk, SUB=GROUP // bk, SPLIT=tiles.split,
        DOT=tiles.block_m > 1, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return y


__all__ = ["gemv"]
