"""x w^T for a few rows, with the weight loaded before the kernel waits for x (sm90 PDL).

At one to a few decode rows a linear layer is a matrix-vector product that streams its weight once,
and what costs is the launch and the first bytes: a cuBLAS GEMM starts only once the kernel before
it has ended. Here each program owns BLOCK_N output columns, and on sm90 the launch is a
programmatic dependent of the kernel before it (`kernels/launch/pdl.py`): a program loads its
BLOCK_N x BLOCK_K weight rows into registers while that kernel still runs, then waits, reads the
rows of x and multiplies on the CUDA cores in fp32, rounding to the model dtype as a GEMM's output
is. The kernel before gains from triggering its dependants early. Inputs wider than BLOCK_K load the
rest of the weight after the wait.

`small_linear(x, w)` runs it where the plan says (`kernels.plan.small_linear_rows`: one
row); elsewhere `x @ w.T`. `project_rows` is the
product itself, also used by `proj_norm.py` (the same, plus the residual add and the norm).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.kernels.plan import SMALL_LINEAR_MAX_ROWS, small_linear_rows

# One row only: in the V2-Lite decode step on an H100 the fused q + kv_a projection through
# this kernel beat cuBLAS at B=1 and lost at B=2 and 4 (each row is another pass over the
# registers' weights; the grid does not fit the SMs at once; docs/DECISIONS.md,
# `plan.SMALL_LINEAR_MAX_ROWS`).
MAX_ROWS = SMALL_LINEAR_MAX_ROWS  # rows the kernel holds (the plan's bound)
BLOCK_N = 4  # output columns a program (V2-Lite's fused q + kv_a: 912 programs)
BLOCK_K = 2048  # input columns a program holds at once (V2-Lite: the whole hidden size)
# 4 warps, not 8 (docs/DECISIONS.md, `small_linear.NUM_WARPS`; 2 warps were the same as 4).
NUM_WARPS = 4


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def rows_times(w, x_ptr, sx, k, k_ok, n_rows, acc, ROWS_P2: tl.constexpr):
    """acc[m, :] += w . x[m, k] for the rows m < n_rows (w: [BLOCK_N, BLOCK_K] at columns k)."""
    r = tl.arange(0, ROWS_P2)
    for m in tl.static_range(ROWS_P2):
        if m < n_rows:
            xm = tl.load(x_ptr + m * sx + k, mask=k_ok, other=0.0).to(tl.float32)
            part = tl.sum(w.to(tl.float32) * xm[None, :], 1)
            acc = tl.where(r[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def project_rows(x_ptr, w_ptr, n_rows, n_in, n_out, sx, sw, ROWS_P2: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """(x w^T for this program's BLOCK_N output columns, fp32 [ROWS_P2, BLOCK_N]; the columns):
    the first BLOCK_K of the weight rows are loaded before the PDL wait. With PDL the launch
    after may start at once (it waits for this one's end before it reads what it writes)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    k = tl.arange(0, BLOCK_K)
    # The weight does not depend on the kernel before: loaded while it runs.
    w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + k[None, :],
                mask=n_ok[:, None] & (k < n_in)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = rows_times(w, x_ptr, sx, k, k < n_in, n_rows, tl.zeros([ROWS_P2, BLOCK_N],
                     tl.float32), ROWS_P2)
    for k0 in range(BLOCK_K, n_in, BLOCK_K):  # wider inputs (V3's 7168): the rest, after
        kk = k0 + k
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * sw + kk[None, :],
                    mask=n_ok[:, None] & (kk < n_in)[None, :], other=0.0)
        acc = rows_times(w, x_ptr, sx, kk, kk < n_in, n_rows, acc, ROWS_P2)
    return acc, n


@triton.jit(do_not_specialize=["n_rows"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _linear_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_in, n_out, sx, sw,
                   ROWS_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PDL: tl.constexpr):
    acc, n = project_rows(x_ptr, w_ptr, n_rows, n_in, n_out, sx, sw, ROWS_P2, BLOCK_N,
                          BLOCK_K, PDL)
    r = tl.arange(0, ROWS_P2)
    tl.store(y_ptr + r[:, None] * n_out + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(r < n_rows)[:, None] & (n < n_out)[None, :])


def fits(x: Tensor, w: Tensor) -> bool:
    """Whether `small_linear` runs the kernel for these operands."""
    return (small_linear_rows(x.shape[0]) and x.stride(-1) == 1 and w.stride(-1) == 1
            and x.dtype == w.dtype)


def launch(x: Float[Tensor, "tokens width_in"], w: Float[Tensor, "width_out width_in"],
           max_rows: int = MAX_ROWS, block_k: int = BLOCK_K
           ) -> tuple[tuple, tuple, dict, Tensor]:
    """(grid, arguments, keyword arguments, output) of the kernel (the sm90 compile test
    reads the same). The kernel takes any number of rows up to `max_rows` (the model's: the
    plan's one) and `block_k` input columns a step."""
    rows, n_in = x.shape
    if not 0 < rows <= max_rows:
        raise ValueError(f"small_linear's kernel takes 1 to {max_rows} rows; got {rows}")
    n_out = w.shape[0]
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    pdl = pdl_supported(x.device)
    kwargs = dict(ROWS_P2=triton.next_power_of_2(max_rows), BLOCK_N=BLOCK_N,
                  BLOCK_K=min(block_k, triton.next_power_of_2(n_in)), PDL=pdl,
                  num_warps=NUM_WARPS, **({"launch_pdl": True} if pdl else {}))
    args = (x, w, y, rows, n_in, n_out, x.stride(0), w.stride(0))
    return (triton.cdiv(n_out, BLOCK_N),), args, kwargs, y


@custom_op("mla_func::small_linear", mutates_args=())
def small_linear(x: Tensor, w: Tensor) -> Tensor:
    """x w^T: the kernel where the plan says (`fits`), else a GEMM."""
    if not fits(x, w):
        return x @ w.T
    return run(x, w)


def run(x: Tensor, w: Tensor, max_rows: int = MAX_ROWS, block_k: int = BLOCK_K) -> Tensor:
    """The kernel itself (`launch`'s arguments)."""
    grid, args, kwargs, y = launch(x, w, max_rows, block_k)
    _linear_kernel[grid](*args, **kwargs)
    return y


@small_linear.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[0])
