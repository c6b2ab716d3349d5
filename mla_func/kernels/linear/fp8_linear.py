"""x w^T in block FP8: the projections' GEMM where a weight is `fp8.Fp8Weight`.

DeepSeek-V3's inference numerics (arXiv:2412.19437 3.3; its inference/kernel.py `act_quant`
and `fp8_gemm`): the weight is e4m3 with one float32 scale per block of `block` (rows,
columns); the activations x (bf16/fp16/fp32) are quantised per token in groups of 128
columns (scale = amax / 448, e4m3 rounded to nearest even); each K step multiplies e4m3 by
e4m3 on the tensor cores into a fresh float32 tile, scales it by the product of the two
scales and adds it to a float32 accumulator (the promotion that keeps the MMA's limited
accumulator precision to one step); the output is in x's dtype. `fp8.linear_reference` is
the same in torch.

The weight's block columns must divide 128 (down to MIN_BLOCK_COLS: the FP8 MMA's K) or be
a multiple of it: a K step is then one activation group, read as 128 // columns sub-steps
each with its own weight scale. Block rows are arbitrary (each output row loads its own
scale), and a weight's `stack` of matrices is stacked into its output rows (their scale rows
apart). Widths need not divide anything: the last group and tiles are masked.

`fp8_norm_linear` is a layer's first projection (`kernel_ops.norm_linear`): where the plan's
deferred norm applies (`plan.norm_linear_normalises`: x may be unwritten) the norm kernel
normalises the residual h first, then the GEMM runs (two launches; the bf16 path's one-row
kernel does both in one).

The launch is `fp8_tiles`' choice. At a few rows `fp8_gemv` runs: one launch split along K,
each program quantising its own slice of x, the last to arrive at a column tile summing the
slices (counters: the state's, as every counting op's). At many rows `_act_quant_kernel`
quantises x once, then the tiled GEMM below runs. Either way the scales and values are the
same. Shapes are static and nothing is read back: the op captures in CUDA graphs.

The cast to e4m3 goes through `kernels.e4m3.to_e4m3`, which rounds in float32 first so that
the cast is exact in Triton's interpreter too (a few ALU operations an element).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Float8e4m3fn, Float32, Int
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.fp8 import FP8, Fp8Weight
from mla_func.kernels.e4m3 import divide, group_scale, to_e4m3
from mla_func.kernels.launch.runtime import call_counters, op_counters
from mla_func.kernels.linear.fp8_gemv import gemv
from mla_func.kernels.linear.fp8_tiles import GROUP, Fp8Tiles, fp8_tiles
from mla_func.kernels.linear.norm import rmsnorm
from mla_func.kernels.plan import norm_linear_normalises as normalises

MIN_BLOCK_COLS = 32  # the e4m3 MMA's K


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, n_in, sx, n_groups, GROUP: tl.constexpr):
    """One program a (row, group): the group's scale and its e4m3 values."""
    row, g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    k = g * GROUP + tl.arange(0, GROUP)
    ok = k < n_in
    x = tl.load(x_ptr + row * sx + k, mask=ok, other=0.0).to(tl.float32)
    s = group_scale(tl.max(tl.abs(x), axis=0))
    tl.store(q_ptr + row * n_in + k, to_e4m3(divide(x, s)), mask=ok)
    tl.store(s_ptr + row * n_groups + g, s)


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _fp8_linear_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, n_rows, n_in, n_out, sx, sxs, rows_per_stack,
    blocks_out, blocks_in, block_rows, block_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr, SUB: tl.constexpr,
):
    """y[m, n] for BLOCK_M x BLOCK_N outputs. K steps of one activation group (SUB sub-steps
    of BK columns, each with its weight scale); x is the activations' e4m3 values and xs
    their scales (`_act_quant_kernel`)."""
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < n_rows, n < n_out
    m64, n64 = m.to(tl.int64), n.to(tl.int64)
    # Each output row's scale row: its matrix's first, then its row block.
    s_row = (n // rows_per_stack) * blocks_out + (n % rows_per_stack) // block_rows
    kk = tl.arange(0, BK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, n_in, SUB * BK):
        xs = tl.load(xs_ptr + m64 * sxs + k0 // (SUB * BK), mask=m_ok, other=1.0)
        for j in tl.static_range(SUB):
            k = k0 + j * BK + kk
            xq = tl.load(x_ptr + m64[:, None] * sx + k[None, :],
                         mask=m_ok[:, None] & (k < n_in)[None, :], other=0.0)
            wq = tl.load(w_ptr + n64[:, None] * n_in + k[None, :],
                         mask=n_ok[:, None] & (k < n_in)[None, :], other=0.0)
            ws = tl.load(ws_ptr + s_row * blocks_in + (k0 + j * BK) // block_cols, mask=n_ok,
                         other=0.0)
            acc += tl.dot(xq, tl.trans(wq)) * xs[:, None] * ws[None, :]
    tl.store(y_ptr + m64[:, None] * n_out + n64[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def step_columns(block_cols: int) -> int:
    """Columns of one MMA sub-step for a weight whose scales cover `block_cols` columns (the
    activation group, or the weight's block where that is finer); a ValueError where the
    kernel cannot take the grid."""
    if block_cols % GROUP == 0:
        return GROUP
    if GROUP % block_cols == 0 and block_cols >= MIN_BLOCK_COLS:
        return block_cols
    raise ValueError(f"the block-FP8 GEMM takes weights whose scale blocks span a multiple of "
                     f"{GROUP} columns or a divisor of it of at least {MIN_BLOCK_COLS}; this "
                     f"weight's span {block_cols} (quantize with a block of 128)")


def quantize_rows(x: Float[Tensor, "tokens width_in"]
                  ) -> tuple[Float8e4m3fn[Tensor, "tokens width_in"],
                             Float32[Tensor, "tokens act_groups"]]:
    """(e4m3 values, scales) of x per token and GROUP columns (`fp8.quantize_activations`)."""
    rows, n_in = x.shape
    groups = triton.cdiv(n_in, GROUP)
    q = torch.empty(rows, n_in, dtype=FP8, device=x.device)
    s = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    if rows:
        _act_quant_kernel[(rows, groups)](x, q, s, n_in, x.stride(0), groups, GROUP=GROUP,
                                          num_warps=1)
    return q, s


def run(x: Float[Tensor, "tokens width_in"], data: Tensor, scales: Tensor,
        block: tuple[int, int], counters: Tensor | None = None,
        tiles: Fp8Tiles | None = None) -> Tensor:
    """x w^T for w's e4m3 `data` [stack, width_out, width_in] (or its matrices stacked:
    [stack x width_out, width_in] with `scales` [stack, blocks_out, blocks_in]) on the grid
    `block`; `counters` a runtime's (`KVState.counters`; default a runtime of the call's own),
    which the split few-row launch counts on; `tiles` default `fp8_tiles`' (tests pass
    others)."""
    bk = step_columns(block[1])
    n_in = data.shape[-1]
    n_out = data.numel() // n_in
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    tiles = tiles or fp8_tiles(rows, n_out, n_in)
    if rows == 0:
        return x.new_empty(0, n_out)
    data, scales = data.contiguous(), scales.contiguous()
    if tiles.quant == "inline":
        counters = op_counters(call_counters(counters, x.device), "fp8_linear")
        return gemv(x, data, scales, block, bk, tiles, counters)
    stack, blocks_out, blocks_in = scales.shape
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    xq, xs = quantize_rows(x)
    grid = (triton.cdiv(n_out, tiles.block_n), triton.cdiv(rows, tiles.block_m))
    _fp8_linear_kernel[grid](
        xq, xs, data, scales, y, rows, n_in, n_out, xq.stride(0), xs.stride(0), n_out // stack,
        blocks_out, blocks_in, block[0], block[1], BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BK=bk, SUB=GROUP // bk, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages)
    return y


@custom_op("mla_func::fp8_linear", mutates_args=("counters",))
def fp8_linear_op(x: Tensor, data: Tensor, scales: Tensor, block_rows: int, block_cols: int,
                  counters: Tensor) -> Tensor:
    """x w^T for the block-FP8 weight (data, scales, (block_rows, block_cols)); `counters`:
    the state's (`KVState.counters`), left zero."""
    return run(x, data, scales, (block_rows, block_cols), counters)


@fp8_linear_op.register_fake
def _(x, data, scales, block_rows, block_cols, counters):
    step_columns(block_cols)  # the same error as a run, while tracing
    return x.new_empty(x.shape[0], data.numel() // data.shape[-1])


@custom_op("mla_func::fp8_norm_linear", mutates_args=("counters",))
def fp8_norm_linear_op(x: Tensor, h: Tensor, weight: Tensor, eps: float, data: Tensor,
                       scales: Tensor, block_rows: int, block_cols: int,
                       counters: Tensor) -> Tensor:
    """x w^T with x = rmsnorm(h) * weight, recomputed from h where the norm may be deferred
    (`normalises(rows, width)`: x is not read)."""
    if normalises(*h.shape):
        x = rmsnorm(h, weight, eps)
    return run(x, data, scales, (block_rows, block_cols), counters)


@fp8_norm_linear_op.register_fake
def _(x, h, weight, eps, data, scales, block_rows, block_cols, counters):
    step_columns(block_cols)
    return x.new_empty(x.shape[0], data.numel() // data.shape[-1])


def fp8_linear(x: Float[Tensor, "tokens width_in"], w: Fp8Weight,
               counters: Int[Tensor, " counters"] | None = None, direct: bool = True
               ) -> Float[Tensor, "tokens width_out"]:
    """x w^T, w's matrices stacked into its output rows; `counters`: the state's (default a
    runtime of the call's own); `direct`: an eager call runs the op's function itself
    (`custom_op.EagerOp`), else through torch's dispatcher."""
    op = fp8_linear_op if direct else fp8_linear_op.dispatch
    counters = call_counters(counters, x.device)
    return op(x, w.data, w.scales, w.block[0], w.block[1], counters)


def fp8_norm_linear(x: Float[Tensor, "tokens width_in"], h: Float[Tensor, "tokens width_in"],
                    weight: Float[Tensor, " width_in"], eps: float, w: Fp8Weight,
                    counters: Int[Tensor, " counters"] | None = None, direct: bool = True
                    ) -> Float[Tensor, "tokens width_out"]:
    """x w^T, x being rmsnorm(h) * weight (`kernel_ops.norm_linear`'s deferred norm)."""
    op = fp8_norm_linear_op if direct else fp8_norm_linear_op.dispatch
    counters = call_counters(counters, x.device)
    return op(x, h, weight, eps, w.data, w.scales, w.block[0], w.block[1], counters)


__all__ = ["MIN_BLOCK_COLS", "fp8_linear", "fp8_linear_op", "fp8_norm_linear",
           "fp8_norm_linear_op", "quantize_rows", "run", "step_columns"]
