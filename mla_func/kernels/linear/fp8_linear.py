"""x w^T in block FP8: the projections' GEMM where a weight is `fp8.Fp8Weight`.

DeepSeek-V3's inference numerics (arXiv:2412.19437 3.3; its inference/kernel.py `act_quant`
and `fp8_gemm`): the weight is e4m3 with one float32 scale per block of `block` (rows,
columns); the activations x (bf16/fp16/fp32) are quantised per token in groups of 128
columns (scale = amax / 448, the values x * (448 / amax) in e4m3 rounded to nearest even,
`kernels.e4m3.group_scales`, as the experts' kernels quantise); each K step multiplies e4m3 by
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
deferred norm applies (`plan.norm_linear_normalises`: one row, x may be unwritten) the GEMM
normalises the residual h itself (NORM): each program sums the squares of the whole row,
then normalises the columns it quantises (`norm.rms_scaled`, HF's rounding), rounded to x's
dtype, so no norm launch runs before it (the bf16 path's one-row kernel does the same).

One kernel runs every launch (`fp8_tiles` chooses it): a program computes ROWS x BLOCK_N
outputs over a slice of K (`split` slices), so that even a one-row product, which only
streams its weight, keeps every SM busy with several programs' wide weight tiles. One
row multiplies on the CUDA cores (float32 products of e4m3 values are exact); more rows take
an e4m3 `tl.dot`. Where the activations are quantised is the launch's `quant`: at a few rows
each program quantises its own slice of x ("inline", one launch), at many rows
`act_quant.quant_tokens` quantises x once first ("apart": inline, every column tile would
redo it). Either way the scales and values are the same.

With split > 1 every program stores its float32 partial to a [split, rows, n_out] workspace
and arrives at its output tile's counter (`launch.counters.last_to_arrive`); the last to
arrive sums the partials in split order -- the same bits whatever the arrival order, so a
graph replay equals eager -- writes y and leaves the counter zero. The counters are the
state's (`op_counters(counters, "fp8_linear")`), as every counting op's: two launches on one
state's counters must not overlap. Shapes are static and nothing is read back: the op
captures in CUDA graphs.

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
from mla_func.fp8 import Fp8Weight
from mla_func.kernels.act_quant import quant_tokens
from mla_func.kernels.e4m3 import group_scales, to_e4m3
from mla_func.kernels.launch.counters import last_to_arrive, slices_summed
from mla_func.kernels.launch.runtime import call_counters, op_counters
from mla_func.kernels.linear.fp8_tiles import GROUP, Fp8Tiles, fp8_tiles
from mla_func.kernels.linear.norm import rms_scaled
from mla_func.kernels.plan import norm_linear_normalises as normalises

MIN_BLOCK_COLS = 32  # the e4m3 MMA's K


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _activations(x_ptr, h_ptr, nw_ptr, m64, m_ok, k, n_in, sx, sum_sq, eps, NORM: tl.constexpr):
    """The activations of rows m64, columns k: x's, or (NORM) rmsnorm(h) * nw in x's dtype
    from h's rows and their sums of squares."""
    mask = m_ok[:, None] & (k < n_in)[None, :]
    if NORM:
        h = tl.load(h_ptr + m64[:, None] * sx + k[None, :], mask=mask, other=0.0)
        x = rms_scaled(h.to(tl.float32), sum_sq, n_in, eps, nw_ptr, k[None, :],
                       (k < n_in)[None, :], h.dtype).to(x_ptr.dtype.element_ty)
    else:
        x = tl.load(x_ptr + m64[:, None] * sx + k[None, :], mask=mask, other=0.0)
    return x


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _fp8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, n_rows, n_in, n_out, sx, sxs,
    rows_per_stack, blocks_out, blocks_in, block_rows, block_cols, steps,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr, SUB: tl.constexpr,
    SPLIT: tl.constexpr, DOT: tl.constexpr, QUANT: tl.constexpr, h_ptr=None, nw_ptr=None,
    eps=0.0, NORM: tl.constexpr = False, NORM_BLOCK: tl.constexpr = 1,
):
    """y[m, n] for ROWS rows m (block `program_id(2)`) and BLOCK_N columns n over K slice
    `program_id(1)` (`steps` groups of SUB x BK columns), summed over the slices by the last
    to arrive. QUANT: x is the activations, quantised here; else x is their e4m3 values and
    xs their scales (`quantize_rows`). NORM (with QUANT): the activations are rmsnorm(h) *
    nw in x's dtype, made here from h's rows (row stride sx, NORM_BLOCK >= n_in); x unread."""
    tile, split, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = block * ROWS + tl.arange(0, ROWS)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < n_rows, n < n_out
    m64, n64 = m.to(tl.int64), n.to(tl.int64)
    sum_sq = None
    if NORM:  # the rows' sums of squares, over all of each row
        c = tl.arange(0, NORM_BLOCK)
        hr = tl.load(h_ptr + m64[:, None] * sx + c[None, :],
                     mask=m_ok[:, None] & (c < n_in)[None, :], other=0.0).to(tl.float32)
        sum_sq = tl.sum(hr * hr, axis=1)[:, None]
    # Each output row's scale row: its matrix's first, then its row block.
    s_row = (n // rows_per_stack) * blocks_out + (n % rows_per_stack) // block_rows
    kk = tl.arange(0, BK)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    k_lo = split * steps * (SUB * BK)
    k_hi = tl.minimum(n_in, k_lo + steps * (SUB * BK))
    for k0 in range(k_lo, k_hi, SUB * BK):
        if QUANT:
            amax = tl.zeros([ROWS], dtype=tl.float32)
            for j in tl.static_range(SUB):
                k = k0 + j * BK + kk
                x = _activations(x_ptr, h_ptr, nw_ptr, m64, m_ok, k, n_in, sx, sum_sq, eps,
                                 NORM)
                amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
            xs, x_inv = group_scales(amax)
        else:
            xs = tl.load(xs_ptr + m64 * sxs + k0 // (SUB * BK), mask=m_ok, other=1.0)
            x_inv = xs  # unread: x comes quantised
        for j in tl.static_range(SUB):
            k = k0 + j * BK + kk
            k_ok = k < n_in
            x = _activations(x_ptr, h_ptr, nw_ptr, m64, m_ok, k, n_in, sx, sum_sq, eps, NORM)
            if QUANT:
                xq = to_e4m3(x.to(tl.float32) * x_inv[:, None])
            else:
                xq = x
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
            total = slices_summed(part, n_rows * n_out, mn_ok, SPLIT)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mn_ok)
            tl.store(counter, 0)


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
    """(e4m3 values, scales) of x per token and GROUP columns (`act_quant.quant_tokens`,
    `fp8.quantize_activations`' bits)."""
    return quant_tokens(x, GROUP)


def run(x: Float[Tensor, "tokens width_in"], data: Tensor, scales: Tensor,
        block: tuple[int, int], counters: Tensor | None = None,
        tiles: Fp8Tiles | None = None, norm: tuple[Tensor, Tensor, float] | None = None
        ) -> Tensor:
    """x w^T for w's e4m3 `data` [stack, width_out, width_in] (or its matrices stacked:
    [stack x width_out, width_in] with `scales` [stack, blocks_out, blocks_in]) on the grid
    `block`; `counters` a runtime's (`KVState.counters`; default a runtime of the call's own),
    which a launch split along K counts on; `tiles` default `fp8_tiles`' (tests pass
    others). `norm` (h, weight, eps), one-row launches only: x is rmsnorm(h) * weight in x's
    dtype, made by the GEMM's programs (x itself is not read)."""
    bk = step_columns(block[1])
    stack, blocks_out, blocks_in = scales.shape
    n_in = data.shape[-1]
    n_out = data.numel() // n_in
    rows = x.shape[0]
    tiles = tiles or fp8_tiles(rows, n_out, n_in)
    kw: dict = {}
    if norm is not None:
        h, weight, eps = norm
        if tiles.block_m != 1 or tiles.quant != "inline" or h.shape != x.shape:
            raise ValueError(f"the FP8 GEMM normalises its rows itself in one-row launches "
                             f"only: {tiles}, h {tuple(h.shape)}, x {tuple(x.shape)}")
        kw = dict(h_ptr=h.contiguous(), nw_ptr=weight, eps=eps, NORM=True,
                  NORM_BLOCK=triton.next_power_of_2(n_in))
    elif x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    inline = tiles.quant == "inline"
    xq, xs = (x, scales) if inline else quantize_rows(x)  # xs unread when inline
    grid = (triton.cdiv(n_out, tiles.block_n), tiles.split, triton.cdiv(rows, tiles.block_m))
    part = slots = y  # unread without a split
    if tiles.split > 1:
        slots = op_counters(call_counters(counters, x.device), "fp8_linear")
        if grid[0] * grid[2] > slots.numel():
            raise ValueError(f"a split FP8 launch of {grid[0] * grid[2]} output tiles needs "
                             f"as many counters; the op owns {slots.numel()}")
        part = torch.empty(tiles.split, rows, n_out, dtype=torch.float32, device=x.device)
    steps = triton.cdiv(triton.cdiv(n_in, GROUP), tiles.split)
    _fp8_gemm_kernel[grid](
        xq, xs, data.contiguous(), scales.contiguous(), y, part, slots, rows, n_in, n_out,
        kw["h_ptr"].stride(0) if kw else xq.stride(0), xs.stride(0), n_out // stack,
        blocks_out, blocks_in, block[0], block[1], steps, ROWS=tiles.block_m,
        BLOCK_N=tiles.block_n, BK=bk, SUB=GROUP // bk, SPLIT=tiles.split,
        DOT=tiles.block_m > 1, QUANT=inline, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, **kw)
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
    """x w^T with x = rmsnorm(h) * weight, made from h by the GEMM where the norm may be
    deferred (`normalises(rows, width)`: x is not read)."""
    norm = (h, weight, eps) if normalises(*h.shape) else None
    return run(x, data, scales, (block_rows, block_cols), counters, norm=norm)


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
