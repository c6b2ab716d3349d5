"""A block-FP8 weight dequantised in one launch: (e4m3 value x its block's scale) in the
activations' dtype, `fp8.dequantize`'s bits (a float32 product, then one rounding).

The absorbed attention weights W_UK / W_UV are multiplied in the activations' dtype (the
chosen precision of the absorption, `kernel_ops.absorbed`). The decode kernels dequantise
their tiles themselves; the attention's other paths (a prefill, the cuBLAS products) take
the weight dequantised by this launch first. In torch that is four elementwise launches a
weight (the scales spread twice, the product, the cast); here it is one, reading the e4m3
bytes and the scales and writing the result.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.e4m3 import block_scales, dequantize

BLOCK_ROWS, BLOCK_COLS = 16, 128  # a program's tile of one matrix of the stack


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _dequant_kernel(q_ptr, s_ptr, out_ptr, rows, cols, blocks_out, blocks_in, block_rows,
                    block_cols, BR: tl.constexpr, BC: tl.constexpr):
    """out[m, r, c] = q[m, r, c] * scales[m, r // block_rows, c // block_cols] for one tile."""
    m = tl.program_id(2).to(tl.int64)
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r < rows)[:, None] & (c < cols)[None, :]
    at = m * rows * cols + r.to(tl.int64)[:, None] * cols + c[None, :]
    q = tl.load(q_ptr + at, mask=ok, other=0.0)
    s = block_scales(s_ptr + m * blocks_out * blocks_in, r, c, ok, blocks_in, block_rows,
                     block_cols)
    tl.store(out_ptr + at, dequantize(q, s, out_ptr.dtype.element_ty), mask=ok)


@custom_op("mla_func::fp8_dequantize", mutates_args=())
def fp8_dequantize_op(data: Tensor, scales: Tensor, block_rows: int, block_cols: int,
                      dtype: torch.dtype) -> Tensor:
    """The weight (e4m3 `data` [stack, rows, cols], `scales` [stack, blocks_out, blocks_in]
    on the grid (block_rows, block_cols)) as `dtype`, shaped as `data`."""
    stack, rows, cols = data.shape
    out = torch.empty(data.shape, dtype=dtype, device=data.device)
    if out.numel():
        grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS), stack)
        _dequant_kernel[grid](data.contiguous(), scales.contiguous(), out, rows, cols,
                              scales.shape[1], scales.shape[2], block_rows, block_cols,
                              BR=BLOCK_ROWS, BC=BLOCK_COLS, num_warps=4)
    return out


@fp8_dequantize_op.register_fake
def _(data, scales, block_rows, block_cols, dtype):
    return data.new_empty(data.shape, dtype=dtype)


__all__ = ["fp8_dequantize_op"]
