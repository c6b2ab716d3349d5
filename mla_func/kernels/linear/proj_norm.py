"""A few rows' output projection, the residual add and the RMSNorm in one launch.

`proj_add_rmsnorm(o, w, h, weight, eps)` returns (h + o w^T, rmsnorm(h + o w^T) * weight):
what a decoder layer does between its attention and its FFN (HF DeepseekV2's o_proj, the
residual add and post_attention_layernorm), with `norm.add_rmsnorm`'s numerics and the
projection rounded to the model dtype first, as a GEMM's output is.

Why a kernel of its own: at one to a few decode rows the projection is a matrix-vector product
that streams its weight once (V2-Lite: 8 MiB), and the cuBLAS GEMM plus the add+norm launch
after it cost two launches, each waiting for the one before. Here the projection is
`small_linear`'s (BLOCK_N output columns a program, its weight rows loaded while the kernel
before, the attention's last, still runs: sm90 PDL), stored to scratch; the last program to
arrive (an acq_rel counter it resets to zero) adds the residual and normalises the rows
whole, all rows at once. Used where the plan says (`kernels.plan.proj_norm_rows`: up to
PROJ_NORM_MAX_ROWS rows up to PROJ_NORM_MAX_WIDTH wide, the norm's row in one program's
registers, as in the MoE sum); elsewhere the op runs the GEMM and `norm.add_rmsnorm`.

Graph capture: the counter is the state's (`KVState.counters`, this op's slice, declared
mutated), at a fixed address; two launches must not run at once on one state's counters.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.kernels.launch.runtime import call_counters, op_counters
from mla_func.kernels.linear.norm import add_rmsnorm, rms_scaled
from mla_func.kernels.linear.small_linear import project_rows
from mla_func.kernels.plan import PROJ_NORM_MAX_ROWS, proj_norm_rows

# Rows and columns a program from the V2-Lite decode step on an H100: up to 4 rows it beats the
# GEMM + add_rmsnorm, at 8 it lost; the gain is the weight load before the PDL wait
# (docs/DECISIONS.md, `plan.PROJ_NORM_MAX_ROWS`).
MAX_ROWS = PROJ_NORM_MAX_ROWS  # rows the kernel holds (the plan's bound)
BLOCK_N = 8  # output columns a program: 256 programs at V2-Lite's 2048
BLOCK_K = 2048  # input columns a program holds at once (V2-Lite: all 16 x 128)
NUM_WARPS = 8


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _proj_add_norm_kernel(
    o_ptr, w_ptr, h_ptr, nw_ptr, a_ptr, h_out_ptr, y_ptr, counter, n_rows, n_in, n_out, so,
    sw, eps,
    ROWS_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_OUT: tl.constexpr, PDL: tl.constexpr,
):
    acc, n = project_rows(o_ptr, w_ptr, n_rows, n_in, n_out, so, sw, ROWS_P2, BLOCK_N,
                          BLOCK_K, PDL)
    n_ok = n < n_out
    r = tl.arange(0, ROWS_P2)
    dt = h_out_ptr.dtype.element_ty
    tl.store(a_ptr + r[:, None] * n_out + n[None, :], acc.to(dt),
             mask=(r < n_rows)[:, None] & n_ok[None, :])
    if last_to_arrive(counter, tl.num_programs(0)):  # whole rows, add and norm
        c = tl.arange(0, BLOCK_OUT)
        ok = (r < n_rows)[:, None] & (c < n_out)[None, :]
        at = r[:, None] * n_out + c[None, :]  # every row at once: one latency, not one a row
        a = tl.load(a_ptr + at, mask=ok, other=0.0, cache_modifier=".cg")
        res = tl.load(h_ptr + at, mask=ok, other=0.0).to(tl.float32)
        hm = (res + a.to(tl.float32)).to(dt)  # rounded as torch's h + a
        tl.store(h_out_ptr + at, hm, mask=ok)
        hf = hm.to(tl.float32)
        y = rms_scaled(hf, tl.sum(hf * hf, axis=1)[:, None], n_out, eps, nw_ptr, c,
                       c < n_out, dt)
        tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)
        tl.store(counter, 0)  # zero again for the next launch (and graph replay)


def fits(o: Tensor, w: Tensor, h: Tensor) -> bool:
    """Whether `proj_add_rmsnorm` runs the one-launch kernel: the plan's rows and width, in
    the layout and dtypes the kernel takes."""
    return (proj_norm_rows(o.shape[0], w.shape[0]) and o.stride(-1) == 1
            and w.stride(-1) == 1 and h.is_contiguous() and o.dtype == w.dtype == h.dtype)


def launch(
    o: Float[Tensor, "tokens width_in"], w: Float[Tensor, "hidden width_in"],
    h: Float[Tensor, "tokens hidden"], weight: Float[Tensor, " hidden"], eps: float,
    counters: Tensor | None = None, block_k: int = BLOCK_K,
) -> tuple[tuple, tuple, dict, tuple[Tensor, Tensor]]:
    """(grid, arguments, keyword arguments, (h + o w^T, its norm) outputs) of the kernel (the
    sm90 compile test reads the same); `counters`: the state's (default: a runtime's own);
    `block_k`: input columns a step."""
    counters = call_counters(counters, h.device)
    rows, n_in = o.shape
    n_out = w.shape[0]
    a = torch.empty(rows, n_out, dtype=h.dtype, device=h.device)
    h_out = torch.empty_like(h)
    y = torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
    pdl = pdl_supported(h.device)
    args = (o, w, h, weight, a, h_out, y, op_counters(counters, "proj_add_rmsnorm"), rows,
            n_in, n_out, o.stride(0), w.stride(0), eps)
    kwargs = dict(ROWS_P2=triton.next_power_of_2(MAX_ROWS), BLOCK_N=BLOCK_N,
                  BLOCK_K=min(block_k, triton.next_power_of_2(n_in)),
                  BLOCK_OUT=triton.next_power_of_2(n_out), PDL=pdl, num_warps=NUM_WARPS,
                  **({"launch_pdl": True} if pdl else {}))
    return (triton.cdiv(n_out, BLOCK_N),), args, kwargs, (h_out, y)


@custom_op("mla_func::proj_add_rmsnorm", mutates_args=("counters",))
def proj_add_rmsnorm(o: Tensor, w: Tensor, h: Tensor, weight: Tensor, eps: float,
                     counters: Tensor) -> tuple[Tensor, Tensor]:
    """(h + o w^T, rmsnorm(h + o w^T) * weight): one launch where the plan says (`fits`),
    else the GEMM and `norm.add_rmsnorm`. `counters`: the state's (`KVState.counters`)."""
    if not fits(o, w, h):
        return add_rmsnorm(h, o @ w.T, weight, eps)
    return run(o, w, h, weight, eps, counters)


def run(o: Tensor, w: Tensor, h: Tensor, weight: Tensor, eps: float, counters: Tensor,
        block_k: int = BLOCK_K) -> tuple[Tensor, Tensor]:
    """The kernel itself (`launch`'s arguments)."""
    grid, args, kwargs, outs = launch(o, w, h, weight, eps, counters, block_k)
    _proj_add_norm_kernel[grid](*args, **kwargs)
    return outs


@proj_add_rmsnorm.register_fake
def _(o, w, h, weight, eps, counters):
    return torch.empty_like(h), torch.empty(
        h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
