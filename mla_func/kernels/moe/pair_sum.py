"""The last step of the fused MoE (`fused_moe.fused_experts`): each token's pair rows, as the
down GEMM (`moe_down.down_kernel`) wrote them, summed in fp32 (+ the shared experts' output
when they ran apart), optionally with the residual add and the next layer's RMSNorm
(`norm.add_rmsnorm`'s numerics).

Two forms, the same arithmetic in the same order: `sum_kernel`, a launch of its own, and
`last_sum`, the tail of the down GEMM's programs at a few tokens (`MoEConfig.last_sum`): the
last program to finish an N-tile sums that tile's columns of every token (an arrival counter
per N-tile, `counters.last_to_arrive`), and with the add+norm the last N-tile to be summed
normalises the rows, so the chain of launches between the experts and the next layer's first
projection is one shorter. Without its norm (NORM off: the next projection normalises the rows
itself, `norm_linear`) the tail adds the residual and stops: one dependent level less again.

Under expert parallelism (LOCAL) a routed pair whose expert another rank holds has a row that
no program wrote (it may hold anything, NaN included): the sum never loads it (its load is
masked off by the pair's expert id, read from `ids`), so the pair adds exactly zero.
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.linear.norm import rms_scaled


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _pair_sum(buf_ptr, extra_ptr, ids_ptr, t, offs, ok, n_hidden, topk, n_routed,
              first_expert, PAIRS_PER_TOKEN: tl.constexpr, HAS_EXTRA: tl.constexpr,
              FROM_L2: tl.constexpr, LOCAL: tl.constexpr):
    """Token t's pair rows (+ its extra row) summed in fp32 over the columns `offs`. FROM_L2:
    the pair rows are read past L1 (.cg: other programs of the launch wrote them). LOCAL: only
    the rows of pairs routed to experts first_expert .. first_expert + n_routed - 1 (and the
    shared experts') are read."""
    acc = tl.zeros(offs.shape, dtype=tl.float32)
    if HAS_EXTRA:  # the shared experts' output, when computed apart
        acc += tl.load(extra_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(PAIRS_PER_TOKEN):
        at = buf_ptr + (t * PAIRS_PER_TOKEN + j) * n_hidden + offs
        row_ok = ok
        if LOCAL:  # another rank's pair: its row was never written
            e = tl.load(ids_ptr + t * topk + j, mask=j < topk, other=first_expert)
            mine = (e >= first_expert) & (e < first_expert + n_routed) | (j >= topk)
            row_ok = tl.where(mine, ok, False)  # not `ok & mine`: the interpreter's is int32
        if FROM_L2:
            acc += tl.load(at, mask=row_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        else:
            acc += tl.load(at, mask=row_ok, other=0.0).to(tl.float32)
    return acc


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _add_residual(acc, res_ptr, out_ptr, t, offs, ok, n_hidden):
    """out[t] = res[t] + acc, rounded as torch's h + a (the sum first, in out's dtype)."""
    dt = out_ptr.dtype.element_ty
    r = tl.load(res_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    h = (r + acc.to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + t * n_hidden + offs, h, mask=ok)
    return h


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _norm_row(h, y_ptr, w_ptr, t, offs, ok, n_hidden, eps):
    """y[t] = rmsnorm(h) * w, h being row t whole (offs: every column)."""
    hf = h.to(tl.float32)
    y = rms_scaled(hf, tl.sum(hf * hf, axis=0), n_hidden, eps, w_ptr, offs, ok, h.dtype)
    tl.store(y_ptr + t * n_hidden + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def sum_kernel(buf_ptr, extra_ptr, out_ptr, res_ptr, y_ptr, w_ptr, ids_ptr, n_hidden, eps,
               topk, n_routed, first_expert, PAIRS_PER_TOKEN: tl.constexpr,
               HAS_EXTRA: tl.constexpr, ADD_NORM: tl.constexpr, BLOCK: tl.constexpr,
               PDL: tl.constexpr = False, LOCAL: tl.constexpr = False):
    """out[t] = the sum of token t's pair rows (+ extra[t]), rounded to out's dtype, BLOCK
    columns a program. ADD_NORM (one program a row, BLOCK >= n_hidden: the row stays in
    registers): out[t] = res[t] + that sum and y[t] = rmsnorm(out[t]) * w, with
    `norm.add_rmsnorm`'s rounding (the sum, then the residual add, in out's dtype). PDL
    (sm90): let the launch after (the next layer's first projection, where it is a PDL
    kernel: `norm_linear`, `small_linear`) start now and load its weights. LOCAL: the pairs
    of experts outside first_expert.. are left out (`ids`, `_pair_sum`)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    if ADD_NORM:
        offs = tl.arange(0, BLOCK)
        ok = offs < n_hidden
        acc = _pair_sum(buf_ptr, extra_ptr, ids_ptr, t, offs, ok, n_hidden, topk, n_routed,
                        first_expert, PAIRS_PER_TOKEN, HAS_EXTRA, False, LOCAL)
        h = _add_residual(acc, res_ptr, out_ptr, t, offs, ok, n_hidden)
        _norm_row(h, y_ptr, w_ptr, t, offs, ok, n_hidden, eps)
    else:
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n_hidden
        acc = _pair_sum(buf_ptr, extra_ptr, ids_ptr, t, offs, ok, n_hidden, topk, n_routed,
                        first_expert, PAIRS_PER_TOKEN, HAS_EXTRA, False, LOCAL)
        tl.store(out_ptr + t * n_hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def last_sum(buf_ptr, extra_ptr, out_ptr, res_ptr, y_ptr, w_ptr, counter_ptr, ids_ptr, pid_n,
             arrivals, n_n, n_tokens, n_hidden, eps, topk, n_routed, first_expert,
             PAIRS_PER_TOKEN: tl.constexpr, HAS_EXTRA: tl.constexpr, ADD_NORM: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr = True,
             LOCAL: tl.constexpr = False):
    """`sum_kernel`'s work as the tail of a program of N-tile `pid_n` (columns pid_n * BLOCK_N
    ..) that has stored its pair rows to `buf`: the last of the tile's `arrivals` programs sums
    the tile's columns of every token (+ the residual, ADD_NORM); with ADD_NORM and NORM the
    last of the `n_n` tiles to be summed then normalises every row whole (BLOCK >= n_hidden),
    as `sum_kernel` does in one program a row (the same bits at the same num_warps); without
    NORM y is not written. LOCAL: as in `sum_kernel`. Counters: n_n + 1 int32 zeros, left
    zero."""
    if last_to_arrive(counter_ptr + pid_n, arrivals):
        offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = offs < n_hidden
        for t in range(n_tokens):
            acc = _pair_sum(buf_ptr, extra_ptr, ids_ptr, t, offs, ok, n_hidden, topk,
                            n_routed, first_expert, PAIRS_PER_TOKEN, HAS_EXTRA, True, LOCAL)
            if ADD_NORM:
                _add_residual(acc, res_ptr, out_ptr, t, offs, ok, n_hidden)
            else:
                tl.store(out_ptr + t * n_hidden + offs, acc.to(out_ptr.dtype.element_ty),
                         mask=ok)
        tl.store(counter_ptr + pid_n, 0)
        if ADD_NORM and NORM:
            if last_to_arrive(counter_ptr + n_n, n_n):
                cols = tl.arange(0, BLOCK)
                whole = cols < n_hidden
                for t in range(n_tokens):
                    h = tl.load(out_ptr + t * n_hidden + cols, mask=whole, other=0.0,
                                cache_modifier=".cg")
                    _norm_row(h, y_ptr, w_ptr, t, cols, whole, n_hidden, eps)
                tl.store(counter_ptr + n_n, 0)
