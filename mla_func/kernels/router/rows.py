"""The MoE router at a few decode rows: one program an expert (`router.py` dispatches here).

At one to MAX_ROWS rows the split router (`router.py`) spreads the hidden axis over many
programs (64 at V2-Lite's one token), each computing a partial logit of every expert with
tensor-core products, and its last program sums all those partials before it selects. Here
program e computes expert e's whole logit for every row: its router row (x's half dtype or
float32, as `router._launch` passes it) loads before the PDL wait, the rows of x after it;
products and sums in float32 on the CUDA cores (float32 products, like the reference's float32
GEMM, not TF32 ones), one value an expert a row is
stored, and the last program to arrive (an acq_rel counter it resets) selects with
`router_select.sum_and_select` over a single split.

Graph capture: as `router.py` (its counters, run once eagerly before capture); one launch of
either router at a time per device.
"""

from typing import no_type_check

import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.plan import ROUTER_ROWS_MAX
from mla_func.kernels.router.select import sum_and_select

MAX_ROWS = ROUTER_ROWS_MAX  # rows the kernel takes (the plan's bound)
BLOCK_HID = 2048  # hidden a step (V2-Lite: all of it, loaded before the wait; V3: 4 steps)
NUM_WARPS = 4
# Above 4 rows: the [rows, BLOCK_HID] tile of x takes 212 registers a thread at 4 warps and 8
# rows (AOT sm90), 128 at 8 warps (210 at 16 rows).
WIDE_NUM_WARPS = 8


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _rows_dot(x_ptr, x_stride, r, live, k, k_ok, w):
    """sum_k x[r, k] * w[k] in float32 for the rows r (those live): [ROWS]."""
    x = tl.load(x_ptr + r[:, None] * x_stride + k[None, :], mask=live[:, None] & k_ok[None, :],
                other=0.0).to(tl.float32)
    return tl.sum(x * w[None, :], axis=1)


@triton.jit(do_not_specialize=["T"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _router_rows_kernel(
    x_ptr, r_ptr, bias_ptr, part_ptr, cnt_ptr, w_out, id_out, T, hidden, x_stride, scale,
    E: tl.constexpr, BLOCK_E: tl.constexpr, ROWS: tl.constexpr, BLOCK_HID: tl.constexpr,
    K: tl.constexpr, BLOCK_K: tl.constexpr, METHOD: tl.constexpr, N_GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,
    BLOCK_GS: tl.constexpr, NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    e = tl.program_id(0)
    row = r_ptr + e.to(tl.int64) * hidden
    k = tl.arange(0, BLOCK_HID)
    w = tl.load(row + k, mask=k < hidden, other=0.0).to(tl.float32)  # before the wait
    if PDL:  # x is read once the kernel before (its writer) ended; then the experts' gate_up
        tl.extra.cuda.gdc_wait()  # and the alignment may launch (their shared tiles read x)
        tl.extra.cuda.gdc_launch_dependents()
    r = tl.arange(0, ROWS)
    live = r < T
    acc = _rows_dot(x_ptr, x_stride, r, live, k, k < hidden, w)
    for k0 in range(BLOCK_HID, hidden, BLOCK_HID):  # wider rows (V3's 7168): the rest
        kk = k0 + k
        w = tl.load(row + kk, mask=kk < hidden, other=0.0).to(tl.float32)
        acc += _rows_dot(x_ptr, x_stride, r, live, kk, kk < hidden, w)
    tl.store(part_ptr + r * BLOCK_E + e, acc, mask=live)
    if last_to_arrive(cnt_ptr, tl.num_programs(0)):
        block = tl.full([], 0, tl.int32)  # one block of rows (a tensor: the callee casts it)
        sum_and_select(part_ptr, block, T, 1, bias_ptr, w_out, id_out, scale, E, BLOCK_E, ROWS,
                       ROWS, 1, K, BLOCK_K, METHOD, N_GROUP, BLOCK_G, TOPK_GROUP, GROUP_SIZE,
                       BLOCK_GS, NORMALIZE, HAS_BIAS)
        tl.store(cnt_ptr, 0)


def launch(x: Tensor, router: Tensor, bias: Tensor, part: Tensor, counter: Tensor,
           weights: Tensor, ids: Tensor, scale: float, const: dict[str, object], pdl: bool
           ) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the kernel for x's rows (at most MAX_ROWS):
    `const` holds the selection's constexprs (`router.kernel_constants`); `part` has
    MAX_ROWS x BLOCK_E float32 elements. The sm90 compile test reads the same."""
    tokens, hidden = x.shape
    if not 0 < tokens <= MAX_ROWS:
        raise ValueError(f"router_rows takes 1 to {MAX_ROWS} rows; got {tokens}")
    names = ("E", "BLOCK_E", "K", "BLOCK_K", "METHOD", "N_GROUP", "BLOCK_G", "TOPK_GROUP",
             "GROUP_SIZE", "BLOCK_GS", "NORMALIZE", "HAS_BIAS")
    kwargs = {n: const[n] for n in names}
    rows = triton.next_power_of_2(tokens)
    kwargs.update(ROWS=rows, BLOCK_HID=min(BLOCK_HID, triton.next_power_of_2(hidden)), PDL=pdl,
                  num_warps=NUM_WARPS if rows <= 4 else WIDE_NUM_WARPS,
                  **({"launch_pdl": True} if pdl else {}))
    args = (x, router, bias, part, counter, weights, ids, tokens, hidden, x.stride(0), scale)
    return (router.shape[0],), args, kwargs


def route_rows(x: Tensor, router: Tensor, bias: Tensor, part: Tensor, counter: Tensor,
               weights: Tensor, ids: Tensor, scale: float, const: dict[str, object],
               pdl: bool) -> None:
    """Fill `weights` and `ids` [rows, top_k] for x's rows (`launch`'s arguments)."""
    grid, args, kwargs = launch(x, router, bias, part, counter, weights, ids, scale, const,
                                pdl)
    _router_rows_kernel[grid](*args, **kwargs)


__all__ = ["MAX_ROWS", "launch", "route_rows"]
