"""Fused MoE grouped GEMM in Triton (after vLLM's `fused_moe` Triton kernel and the DeepSeekMoE
layer of arXiv:2401.06066 / arXiv:2405.04434), static-shape and free of host syncs.

Pipeline (four launches, all sizes fixed by `tokens`, `topk`, the config table and the weights):
1. `moe_align.align`: pairs sorted by expert, each expert's run padded to `block_m` rows.
2. `_gate_up_kernel`: per M-tile (rows of one expert) and N-tile of `moe_inter`:
   act = silu(x W_gate^T) * (x W_up^T), the token rows gathered on the fly, fp32 accumulate.
3. `_down_kernel`: per M-tile and N-tile of `hidden`: (act W_down^T) * routing weight, written to
   the row of its pair in a `[tokens * (topk + shared), hidden]` buffer (no atomic reduction:
   results are deterministic and replay bit-identically).
4. `_sum_kernel`: the pairs of each token summed in fp32, one write in the model dtype.

Shared experts ride along at small token counts (`FUSE_SHARED_MAX_TOKENS`): a shared MLP of
width `shared * moe_inter` is `shared` more experts (strided views of the same weights, no copy)
that every token routes to with weight 1, so the whole MoE FFN is these four launches.

Every expert's weights are read once per M-tile of its rows; at small token counts an expert's
rows fit one tile (`block_m` from the config table), so weights are read once and the grid over
(M-tiles x N-tiles) gives enough programs to fill the GPU. Tiles and path are picked per static
token count (`moe_config.pick_config`), never autotuned at run time (graph capture).

Direct path (`MoEConfig.direct`, decode at a few tokens): the M-tiles are read off `ids` in the
kernels (`moe_align.direct_tile`: one routed pair per tile, one tile per shared expert), so step
1 is gone; at 2+ tokens an expert that two tokens pick is read twice. With `fused_sum`, step 4
goes too: `_down_sum_kernel` (one program per N-tile of `hidden`) runs every M-tile in a fixed
order and sums each token's pairs as `_sum_kernel` does: the same bits, two launches in all.

The shared experts' M-tiles need no routing: they sit at fixed places in both layouts (the last
tiles of the direct layout, the first of the aligned one, `moe_align.shared_tile`). With `pdl`
(sm90+) the alignment and the gate_up kernel are programmatic dependents of the kernel before
them: the gate_up kernel launches while the router (and the alignment) run; its shared tiles
load and multiply at once and wait for their predecessor's end only to store, the routed tiles
wait first. Only the router and the alignment trigger early, and neither writes `x` nor the
weights those tiles read.

Padding rows (tokens added to reach a capture bucket) are ordinary tokens here: their pairs are
computed and discarded by the caller, never mixed into real tokens' rows, so they cannot change
real results; they cost expert work: each padded token adds `topk` routed rows (and may pull in
an expert no real token uses, i.e. one more expert's weights read at small token counts).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from mla_func.kernels.moe_align import align, direct_tile, is_shared_tile, tile
from mla_func.kernels.moe_config import (
    DIRECT_BLOCK_M,
    FUSE_SHARED_MAX_TOKENS,
    MoEConfig,
    pick_config,
)
from mla_func.kernels.pdl import supported as pdl_supported
from mla_func.kernels.swiglu import swiglu


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _expert_base(w_ptr, ws_ptr, e, n_routed, stride_e, stride_se):
    """Base pointer of expert `e`: a routed expert or, past `n_routed`, a shared slice."""
    if e < n_routed:
        base = w_ptr + e.to(tl.int64) * stride_e
    else:
        base = ws_ptr + (e - n_routed).to(tl.int64) * stride_se
    return base


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _k_masks(row_ok, n_ok, k_ok, EVEN_K: tl.constexpr):
    """Load masks of one K step: A [rows, K] and B [K, N] (K needs none when tiles divide it)."""
    if EVEN_K:
        a_mask = row_ok[:, None]
        b_mask = n_ok[None, :]
    else:
        a_mask = row_ok[:, None] & k_ok[None, :]
        b_mask = k_ok[:, None] & n_ok[None, :]
    return a_mask, b_mask


# The token count only sizes the direct layout: not specialised, one compile serves every bucket.
@triton.jit(do_not_specialize=["n_tokens"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _gate_up_kernel(
    x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, ids_ptr, sorted_ptr, block_expert_ptr,
    block_rows_ptr, n_tokens, topk, n_inter, n_hidden, n_routed, stride_x,
    stride_we, stride_wg, stride_wn, stride_se, stride_sg, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr, TMA: tl.constexpr,
):
    if DIRECT:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:  # N-tiles fastest: the shared experts' M-tiles, the first, launch first
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    if PDL:  # launched while the router (and alignment) run: routed tiles need their output
        if not is_shared_tile(pid_m, n_tokens, topk, PAIRS_PER_TOKEN, BLOCK_M, DIRECT):
            tl.extra.cuda.gdc_wait()
    e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                            n_tokens, topk, n_routed, PAIRS_PER_TOKEN, BLOCK_M, DIRECT)
    if e < 0:
        return
    shared = e >= n_routed
    base = _expert_base(w_ptr, ws_ptr, e, n_routed, stride_we, stride_se)
    stride_g = tl.where(shared, stride_sg, stride_wg)
    stride_n = tl.where(shared, stride_sn, stride_wn)
    tok = (pair // PAIRS_PER_TOKEN).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_inter
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * stride_x + offs_k[None, :]
    g_ptrs = base + offs_n[None, :].to(tl.int64) * stride_n + offs_k[:, None]
    u_ptrs = g_ptrs + stride_g
    # TMA (routed experts only): rows of the [experts * 2 * moe_inter, hidden] view. A tile
    # past moe_inter reads the next matrix's rows into columns the store masks off.
    row_g = e * 2 * n_inter + pid_n * BLOCK_N
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, n_hidden, BLOCK_K):
        a_mask, b_mask = _k_masks(row_ok, n_ok, offs_k + k < n_hidden, EVEN_K)
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        if TMA:
            g = tl.trans(w_desc.load([row_g, k]))
            u = tl.trans(w_desc.load([row_g + n_inter, k]))
        else:
            g = tl.load(g_ptrs, mask=b_mask, other=0.0)
            u = tl.load(u_ptrs, mask=b_mask, other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    act_rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    act_ptrs = act_ptr + act_rows[:, None] * n_inter + offs_n[None, :]
    if PDL:  # shared tiles too: `act` may reuse memory the router still uses (its partials)
        tl.extra.cuda.gdc_wait()
    tl.store(act_ptrs, act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _down_tile(
    act_ptr, w_ptr, ws_ptr, act_desc, w_desc, weights_ptr, m_tile, e, pair, row_ok, n0, n_ok,
    n_hidden, n_inter, n_routed, topk, stride_we, stride_wn, stride_se, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """(act W_down^T) * routing weight of one M-tile and N-tile (columns n0 + BLOCK_N), fp32
    (padding rows are dropped by the caller's store; with TMA they hold whatever `act` held)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    base = _expert_base(w_ptr, ws_ptr, e, n_routed, stride_we, stride_se)
    stride_n = tl.where(e >= n_routed, stride_sn, stride_wn)
    offs_k = tl.arange(0, BLOCK_K)
    act_rows = (m_tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    a_ptrs = act_ptr + act_rows[:, None] * n_inter + offs_k[None, :]
    b_ptrs = base + offs_n[None, :].to(tl.int64) * stride_n + offs_k[:, None]
    if TMA:  # rows of the [experts * hidden, moe_inter] view, and of `act`
        row_w = e * n_hidden + n0
        row_a = m_tile * BLOCK_M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, n_inter, BLOCK_K):
        if TMA:
            a = act_desc.load([row_a, k])
            b = tl.trans(w_desc.load([row_w, k]))
        else:
            a_mask, b_mask = _k_masks(row_ok, n_ok, offs_k + k < n_inter, EVEN_K)
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    j = pair % PAIRS_PER_TOKEN
    routed = row_ok & (j < topk)
    w = tl.load(weights_ptr + (pair // PAIRS_PER_TOKEN) * topk + j, mask=routed, other=1.0)
    # Round to the model dtype first, as the reference does, then weight in fp32.
    return acc.to(act_ptr.dtype.element_ty).to(tl.float32) * w[:, None]


@triton.jit(do_not_specialize=["n_tokens"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _down_kernel(
    act_ptr, w_ptr, ws_ptr, act_desc, w_desc, out_ptr, weights_ptr, ids_ptr, sorted_ptr,
    block_expert_ptr, block_rows_ptr, n_tokens, topk, n_hidden, n_inter, n_routed,
    stride_we, stride_wn, stride_se, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Each pair's weighted expert output to its own row of `out` ([pairs, hidden])."""
    if DIRECT:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:  # N-tiles fastest: an M-tile's `act` rows are read from L2 by all its N-tiles
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                            n_tokens, topk, n_routed, PAIRS_PER_TOKEN, BLOCK_M, DIRECT)
    if e < 0:
        return
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_hidden
    y = _down_tile(act_ptr, w_ptr, ws_ptr, act_desc, w_desc, weights_ptr, pid_m, e, pair,
                   row_ok, pid_n * BLOCK_N, n_ok, n_hidden, n_inter, n_routed, topk,
                   stride_we, stride_wn, stride_se, stride_sn,
                   PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, PRECISION, TMA)
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * n_hidden + offs_n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["n_tokens", "n_tiles"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _down_sum_kernel(
    act_ptr, w_ptr, ws_ptr, out_ptr, extra_ptr, weights_ptr, ids_ptr,
    n_tokens, topk, n_tiles, n_hidden, n_inter, n_routed,
    stride_we, stride_wn, stride_se, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_EXTRA: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Direct layout only: one program per N-tile runs every M-tile in order and sums the
    tokens' rows (row r is token r in every tile; other rows add exact zeros), in the order
    and the rounding of `_sum_kernel`: same result, no [pairs, hidden] buffer, one launch."""
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_hidden
    rows = tl.arange(0, BLOCK_M)
    out_offs = rows.to(tl.int64)[:, None] * n_hidden + offs_n[None, :]
    out_ok = (rows < n_tokens)[:, None] & n_ok[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_EXTRA:  # the shared experts' output, when computed apart
        total += tl.load(extra_ptr + out_offs, mask=out_ok, other=0.0).to(tl.float32)
    for q in range(0, n_tiles):
        e, pair, row_ok = direct_tile(q, ids_ptr, n_tokens, topk, n_routed, PAIRS_PER_TOKEN,
                                      BLOCK_M)
        y = _down_tile(act_ptr, w_ptr, ws_ptr, None, None, weights_ptr, q, e, pair, row_ok,
                       n0, n_ok, n_hidden, n_inter, n_routed, topk,
                       stride_we, stride_wn, stride_se, stride_sn,
                       PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, PRECISION, False)
        total += y.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _sum_kernel(buf_ptr, extra_ptr, out_ptr, n_hidden, PAIRS_PER_TOKEN: tl.constexpr,
                HAS_EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if HAS_EXTRA:  # the shared experts' output, when computed apart
        acc += tl.load(extra_ptr + t * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(PAIRS_PER_TOKEN):
        row = t * PAIRS_PER_TOKEN + j
        acc += tl.load(buf_ptr + row * n_hidden + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * n_hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _fit(tile: tuple[int, int, int, int], n: int, k: int) -> tuple[int, int, int, int]:
    """Shrink N/K tiles to small test sizes (tl.dot needs at least 16)."""
    bn, bk, warps, stages = tile
    fit = lambda b, d: max(16, min(b, triton.next_power_of_2(d)))  # noqa: E731
    return fit(bn, n), fit(bk, k), warps, stages


def _desc(w: Tensor, rows: int, cols: int) -> TensorDescriptor:
    """A TMA descriptor of `w` seen as a matrix [everything but the last axis, last axis],
    loading [rows, cols] tiles (zero past the matrix's edges)."""
    if not w.is_contiguous():
        raise ValueError("MoEConfig.tma needs contiguous expert weights")
    return TensorDescriptor.from_tensor(w.view(-1, w.shape[-1]), [rows, cols])


def shared_as_experts(
    shared_gate_up: Float[Tensor, "2 inter hidden"],
    shared_down: Float[Tensor, "hidden inter"],
    moe_inter: int,
) -> tuple[Float[Tensor, "shared 2 moe_inter hidden"], Float[Tensor, "shared hidden moe_inter"]]:
    """A shared MLP of width shared * moe_inter as `shared` experts: strided views, no copy."""
    hidden, inter = shared_down.shape
    if inter % moe_inter:
        raise ValueError(f"shared width {inter} is not a multiple of moe_inter {moe_inter}")
    n = inter // moe_inter
    gate_up = shared_gate_up.view(2, n, moe_inter, hidden).transpose(0, 1)
    down = shared_down.view(hidden, n, moe_inter).transpose(0, 1)
    return gate_up, down


def fused_experts(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"],
    down: Float[Tensor, "experts hidden moe_inter"],
    shared_gate_up: Float[Tensor, "2 inter hidden"] | None = None,
    shared_down: Float[Tensor, "hidden inter"] | None = None,
    config: MoEConfig | None = None,
) -> Float[Tensor, "tokens hidden"]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) (+ the shared MLP when given: folded
    into the launches up to FUSE_SHARED_MAX_TOKENS tokens, else `kernels.swiglu.swiglu`
    added in the sum).
    `config` (default `pick_config(tokens)`) picks the tiles and the path."""
    tokens, topk = ids.shape
    n_routed, _, n_inter, n_hidden = gate_up.shape
    cfg = config or pick_config(tokens)
    fold = tokens <= FUSE_SHARED_MAX_TOKENS if cfg.fuse_shared is None else cfg.fuse_shared
    extra = None
    if shared_gate_up is not None and (not fold or shared_down.shape[1] % n_inter):
        extra = swiglu(x, shared_gate_up, shared_down).contiguous()
        shared_gate_up = shared_down = None
    if shared_gate_up is None:
        s_gate_up, s_down, n_shared = gate_up, down, 0
    else:
        s_gate_up, s_down = shared_as_experts(shared_gate_up, shared_down, n_inter)
        n_shared = s_gate_up.shape[0]
    for w in (gate_up, down, s_gate_up, s_down):
        if w.stride(-1) != 1:
            raise ValueError("expert weights must be contiguous along their last axis")
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    pairs_per_token = topk + n_shared
    pdl = cfg.pdl and pdl_supported(x.device)
    if cfg.tma and (cfg.direct or n_shared):
        raise ValueError("MoEConfig.tma needs the aligned layout and the shared experts apart")
    if cfg.direct:
        if tokens > DIRECT_BLOCK_M:
            raise ValueError(f"the direct path takes at most {DIRECT_BLOCK_M} tokens")
        bm, n_tiles = DIRECT_BLOCK_M, tokens * topk + n_shared
        layout = (ids, ids, ids)  # no alignment: the kernels read the tiles off `ids`
    else:
        if cfg.fused_sum:
            raise ValueError("fused_sum needs the direct layout (MoEConfig.direct)")
        bm = cfg.block_m
        layout = align(ids, n_routed, n_shared, bm, pdl)
        n_tiles = layout[1].shape[0]
    tiles = (ids, *layout, tokens, topk)
    common = dict(PAIRS_PER_TOKEN=pairs_per_token, BLOCK_M=bm,
                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32")

    act = torch.empty(n_tiles * bm, n_inter, dtype=x.dtype, device=x.device)
    bn, bk, warps, stages = _fit(cfg.gate_up, n_inter, n_hidden)
    n_n = triton.cdiv(n_inter, bn)
    _gate_up_kernel[(n_tiles, n_n) if cfg.direct else (n_n, n_tiles)](
        x, gate_up, s_gate_up, _desc(gate_up, bn, bk) if cfg.tma else None, act, *tiles,
        n_inter, n_hidden, n_routed, x.stride(0),
        gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
        s_gate_up.stride(0), s_gate_up.stride(1), s_gate_up.stride(2),
        BLOCK_N=bn, BLOCK_K=bk, EVEN_K=n_hidden % bk == 0, DIRECT=cfg.direct, **common,
        PDL=pdl, TMA=cfg.tma, num_warps=warps, num_stages=stages,
        **({"launch_pdl": True} if pdl else {}))

    out = torch.empty_like(x)
    bn, bk, warps, stages = _fit(cfg.down, n_hidden, n_inter)
    strides = (down.stride(0), down.stride(1), s_down.stride(0), s_down.stride(1))
    if cfg.fused_sum:
        _down_sum_kernel[(triton.cdiv(n_hidden, bn),)](
            act, down, s_down, out, out if extra is None else extra, weights, ids,
            tokens, topk, n_tiles, n_hidden, n_inter, n_routed, *strides,
            BLOCK_N=bn, BLOCK_K=bk, EVEN_K=n_inter % bk == 0, HAS_EXTRA=extra is not None,
            **common, num_warps=warps, num_stages=stages)
        return out
    buf = torch.empty(tokens * pairs_per_token, n_hidden, dtype=x.dtype, device=x.device)
    descs = (_desc(act, bm, bk), _desc(down, bn, bk)) if cfg.tma else (None, None)
    n_n = triton.cdiv(n_hidden, bn)
    _down_kernel[(n_tiles, n_n) if cfg.direct else (n_n, n_tiles)](
        act, down, s_down, *descs, buf, weights, *tiles, n_hidden, n_inter, n_routed, *strides,
        BLOCK_N=bn, BLOCK_K=bk, EVEN_K=n_inter % bk == 0, DIRECT=cfg.direct, **common,
        TMA=cfg.tma, num_warps=warps, num_stages=stages)
    block = min(1024, triton.next_power_of_2(n_hidden))
    _sum_kernel[(tokens, triton.cdiv(n_hidden, block))](
        buf, buf if extra is None else extra, out, n_hidden, PAIRS_PER_TOKEN=pairs_per_token,
        HAS_EXTRA=extra is not None, BLOCK=block, num_warps=4)
    return out
