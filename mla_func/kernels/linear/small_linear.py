"""x w^T for a few rows, with the weight loaded before the kernel waits for x (sm90 PDL).

At one to a few decode rows a linear layer is a matrix-vector product that streams its weight
once, and what costs is the launch and the first bytes: a cuBLAS GEMM starts only once the
kernel before it has ended. Here each program owns BLOCK_N output columns, and on sm90 the
launch is a programmatic dependent of the kernel before it (`kernels/launch/pdl.py`): a
program loads its BLOCK_N x BLOCK_K weight rows into registers while that kernel still runs, then waits,
reads the rows of x and multiplies on the CUDA cores in fp32, rounding to the model dtype as
a GEMM's output is. The kernel before gains from triggering its dependants early. Inputs
wider than BLOCK_K load the rest of the weight after the wait.

`small_linear(x, w)` runs it up to MAX_ROWS rows; beyond, `x @ w.T`. `project_rows` is the
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

# One row only: in the V2-Lite decode step on an H100 the fused q + kv_a projection through
# this kernel beat cuBLAS at B=1 and lost at B=2 and 4 (each row is another pass over the
# registers' weights; the grid does not fit the SMs at once; docs/DECISIONS.md,
# `small_linear.MAX_ROWS`).
MAX_ROWS = 1
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
    return (0 < x.shape[0] <= MAX_ROWS and x.stride(-1) == 1 and w.stride(-1) == 1
            and x.dtype == w.dtype)


def launch(x: Float[Tensor, "tokens width_in"], w: Float[Tensor, "width_out width_in"]
           ) -> tuple[tuple, tuple, dict, Tensor]:
    """(grid, arguments, keyword arguments, output) of the kernel (the sm90 compile test
    reads the same)."""
    rows, n_in = x.shape
    n_out = w.shape[0]
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    pdl = pdl_supported(x.device)
    kwargs = dict(ROWS_P2=triton.next_power_of_2(MAX_ROWS), BLOCK_N=BLOCK_N,
                  BLOCK_K=min(BLOCK_K, triton.next_power_of_2(n_in)), PDL=pdl,
                  num_warps=NUM_WARPS, **({"launch_pdl": True} if pdl else {}))
    args = (x, w, y, rows, n_in, n_out, x.stride(0), w.stride(0))
    return (triton.cdiv(n_out, BLOCK_N),), args, kwargs, y


@custom_op("mla_func::small_linear", mutates_args=())
def small_linear(x: Tensor, w: Tensor) -> Tensor:
    """x w^T: the kernel up to MAX_ROWS rows (`fits`), else a GEMM."""
    if not fits(x, w):
        return x @ w.T
    grid, args, kwargs, y = launch(x, w)
    _linear_kernel[grid](*args, **kwargs)
    return y


@small_linear.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[0])
