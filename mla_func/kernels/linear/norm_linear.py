"""rmsnorm(h) w^T for one row, the norm done by the projection's own programs.

At one decode row the last thing before a layer's first projection (the fused q + kv_a) was
the MoE's final reduction, whose last program normalised the row (`moe_sum.last_sum`): one
dependent level on the step's critical path (~1.5% of the B=1 step on an H100). Here every
program of `small_linear`'s matrix-vector kernel loads its weight rows before its PDL wait,
then reads the whole row h (4 KiB at V2-Lite's 2048) and the norm weight, takes the row's sum
of squares and normalises it with `norm.rms_scaled`'s rounding, rounded to the model dtype as
the norm's output is, and multiplies. So the op before may leave the normalised row unwritten
(`fused_moe.fused_experts`'s `defer_norm`). The B=1 step is ~1% faster, logits equal to the
bit (docs/DECISIONS.md, `plan.norm_linear_normalises`).

`norm_linear(x, h, weight, eps, w)`: x is rmsnorm(h) * weight as the op before returned it.
Where `normalises(rows, width)` x is never read (it may be unwritten); elsewhere the op is
x w^T. The sum of squares is reduced in this kernel's order, so x can differ from the norm
kernels' by a rounding step of the model dtype where the two orders round rstd apart.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.kernels.linear import small_linear as sl
from mla_func.kernels.plan import norm_linear_normalises as normalises
from mla_func.ops.norm import rmsnorm


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _normed(hf, nw_ptr, k, k_ok, rstd, dt):
    """The row's columns k (hf, fp32) normalised and scaled with `norm.rms_scaled`'s rounding,
    rounded to the model dtype `dt` as the norm's output is, widened to fp32."""
    nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    return (nw * (hf * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _norm_linear_kernel(h_ptr, nw_ptr, w_ptr, y_ptr, n_in, n_out, sw, eps,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """y = (rmsnorm(h) * nw) w^T for one row h of n_in <= BLOCK_K, BLOCK_N outputs a program.
    Registers decide how many programs an SM holds at once: one chunk of the row only (a K
    loop for wider rows cost 25 more a thread in the sm90 build) and the norm weight loaded
    after the wait (before, it cost 8 more) leave 63, so V2-Lite's 912 programs fit at once
    (8 an SM)."""
    if PDL:  # the launch after may load its weights now (it waits for this one's end)
        tl.extra.cuda.gdc_launch_dependents()
    dt = h_ptr.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    k = tl.arange(0, BLOCK_K)
    k_ok = k < n_in
    # The weight rows do not depend on the kernel before: loaded while it runs.
    w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    hf = tl.load(h_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_in + eps)
    acc = tl.sum(w.to(tl.float32) * _normed(hf, nw_ptr, k, k_ok, rstd, dt)[None, :], 1)
    tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def fits(h: Tensor, weight: Tensor, w: Tensor) -> bool:
    """Whether `norm_linear` runs the kernel for these operands (one contiguous row, one dtype)."""
    return (normalises(*h.shape) and h.shape[0] == 1 and h.stride(-1) == 1
            and w.stride(-1) == 1 and weight.is_contiguous()
            and h.dtype == weight.dtype == w.dtype)


def launch(h: Float[Tensor, "1 width_in"], weight: Float[Tensor, " width_in"], eps: float,
           w: Float[Tensor, "width_out width_in"]) -> tuple[tuple, tuple, dict, Tensor]:
    """(grid, arguments, keyword arguments, output) of the kernel (the sm90 compile test
    reads the same)."""
    n_in, n_out = h.shape[1], w.shape[0]
    y = torch.empty(1, n_out, dtype=h.dtype, device=h.device)
    pdl = pdl_supported(h.device)
    kwargs = dict(BLOCK_N=sl.BLOCK_N, BLOCK_K=triton.next_power_of_2(n_in),
                  PDL=pdl, num_warps=sl.NUM_WARPS, **({"launch_pdl": True} if pdl else {}))
    return (triton.cdiv(n_out, sl.BLOCK_N),), (h, weight, w, y, n_in, n_out, w.stride(0),
                                                eps), kwargs, y


@custom_op("mla_func::norm_linear", mutates_args=())
def norm_linear(x: Tensor, h: Tensor, weight: Tensor, eps: float, w: Tensor) -> Tensor:
    """x w^T with x = rmsnorm(h) * weight: where `normalises(rows, width)`, from h alone (the
    kernel, or the norm in torch for operands it does not take), else from x (a GEMM or
    `small_linear`)."""
    if not normalises(*h.shape):
        return sl.small_linear(x, w)
    if not fits(h, weight, w):
        return rmsnorm(h, weight, eps) @ w.T
    grid, args, kwargs, y = launch(h, weight, eps, w)
    _norm_linear_kernel[grid](*args, **kwargs)
    return y


@norm_linear.register_fake
def _(x, h, weight, eps, w):
    return x.new_empty(x.shape[0], w.shape[0])
