"""Fused RMSNorm kernels (Zhang & Sennrich 2019) with HF DeepseekV2RMSNorm's numerics.

`rmsnorm`: y = w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype), one program per row.
`add_rmsnorm`: h' = h + r, then y = rmsnorm(h'); returns (h', y) from one pass: the residual
add and the norm of every decoder layer in one kernel instead of eight.
Both are `torch.library` custom ops, so tracers see one node each.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.custom_op import custom_op


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def rms_scaled(xf, sum_sq, width, eps, w_ptr, cols, mask, dtype):
    """w * rmsnorm(x) with HF's rounding, from x in float32 and the row's sum of squares:
    x * rsqrt(mean(x^2) + eps) rounded to `dtype` (x's), then scaled in float32. Every Triton
    RMSNorm (here, the MLA prologue, the MoE sum's add+norm) goes through it."""
    rstd = 1.0 / tl.sqrt(sum_sq / width + eps)
    normed = (xf * rstd).to(dtype).to(tl.float32)
    return tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * normed


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _rmsnorm_kernel(x_ptr, r_ptr, h_out_ptr, y_ptr, w_ptr, width, x_stride, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the input dtype, as torch's `h + r` does.
        x = (xf + r).to(x.dtype)
        xf = x.to(tl.float32)
        tl.store(h_out_ptr + row * width + cols, x, mask=mask)
    y = rms_scaled(xf, tl.sum(xf * xf, axis=0), width, eps, w_ptr, cols, mask, x.dtype)
    tl.store(y_ptr + row * width + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x: Tensor, r: Tensor | None, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    # A row-strided 2-D x (a column slice, e.g. the query part of the fused input projection)
    # is read in place; outputs are contiguous.
    strided = x.dim() == 2 and x.stride(1) == 1
    x2 = x if strided else x.reshape(-1, x.shape[-1]).contiguous()
    rows, width = x2.shape
    y = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if r is not None else y
    if rows:
        r2 = r.reshape(-1, width).contiguous() if r is not None else x2
        _rmsnorm_kernel[(rows,)](x2, r2, h, y, w, width, x2.stride(0), eps,
                                 HAS_RESIDUAL=r is not None,
                                 BLOCK=triton.next_power_of_2(width), num_warps=4)
    return h.view(x.shape), y.view(x.shape)


@custom_op("mla_func::rmsnorm", mutates_args=())
def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _launch(x, None, weight, eps)[1]


@rmsnorm.register_fake
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                       device=x.device)


@custom_op("mla_func::add_rmsnorm", mutates_args=())
def add_rmsnorm(h: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _launch(h, r, weight, eps)


@add_rmsnorm.register_fake
def _(h, r, weight, eps):
    return torch.empty_like(h), torch.empty(
        h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
