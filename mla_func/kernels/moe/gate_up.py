"""The fused MoE's first grouped GEMM (the expert SwiGLU of DeepSeekMoE, arXiv:2401.06066, as
vLLM's `fused_moe` Triton kernel groups it): act = silu(x W_gate^T) * (x W_up^T) of each M-tile
of an expert's rows (token rows gathered from their pairs) and N-tile of `moe_inter` (SiLU·up
fused in the epilogue), stored to `act` in the M-tile's rows for the down GEMM (`down.py`).
Operands and layouts: `gemm.py`; the tiles and the launch: `fused_moe.fused_experts`. With FP8
the weights are block-FP8 (e4m3 data and their block scales, `q_ptr`) and the gathered x rows
are quantised per token group in the K loop (`fp8_gemm.py`); the epilogue is the same.
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.act_quant import quant_rows
from mla_func.kernels.moe.fp8_gemm import mma, scale_ptrs
from mla_func.kernels.moe.gemm import expert_base, k_masks
from mla_func.kernels.moe.inline_align import inline_tile
from mla_func.kernels.moe.split_k import arrive, k_range, store_partial, summed
from mla_func.kernels.moe.tile import is_shared_tile, tail_tile, tile
from mla_func.kernels.swap_ab import WGMMA_M, acc_rows, acc_zeros


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _act_store(act_ptr, act, act_row0, offs_n, row_ok, n_ok, n_inter, BM: tl.constexpr):
    """BM rows of silu(gate) * up, stored to `act` rows act_row0.."""
    act_rows = (act_row0 + tl.arange(0, BM)).to(tl.int64)
    act_ptrs = act_ptr + act_rows[:, None] * n_inter + offs_n[None, :]
    tl.store(act_ptrs, act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _gate_up_rows(
    x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, e, pair, row_ok, act_row0, pid_n,
    n_inter, n_hidden, n_routed, stride_x, stride_we, stride_wg, stride_wn, stride_se,
    stride_sg, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    TMA: tl.constexpr, t_pair, t_ok, TAIL: tl.constexpr, q_ptr, qs_ptr, stride_qe, stride_qg,
    stride_qn, stride_sqe, stride_sqg, stride_sqn, blk_n, s_blk_n, FP8: tl.constexpr,
    ROUND: tl.constexpr, xs_ptr, stride_xs, XQ: tl.constexpr, part_ptr=None, cnt_ptr=None,
    n_rows=0, SPLIT: tl.constexpr = 1,
):
    """silu(x W_gate^T) * (x W_up^T) of BM rows of expert e (token rows gathered from `pair`)
    and N-tile pid_n, stored to `act` rows act_row0... TAIL (`MoEConfig.merge_tail`): also
    BM // 2 more rows of expert e (`t_pair`, `t_ok`; `act` rows act_row0 + BM..), a second
    product on the same weight tiles of every K step. FP8: e4m3 weights, their block scales
    at `q_ptr` (routed, [experts, 2, blocks_out, blocks_in]) and `qs_ptr` (shared slices),
    `blk_n` / `s_blk_n` rows a block; x quantised per row and K step (`fp8_gemm`), or, XQ,
    given quantised (e4m3 at x_ptr, its scales at xs_ptr: `act_quant.quant_tokens`). SWAP:
    pointer-loaded FP8 tiles of fewer rows than a warp-group MMA multiply as w x^T
    (`kernels.swap_ab`). SPLIT > 1: the K slice `program_id(2)` of SPLIT, the tile's
    partials summed by the last slice to arrive (`split_k`: `part_ptr` its workspace of
    n_rows rows, `cnt_ptr` one counter a tile), which alone stores."""
    SWAP: tl.constexpr = FP8 and not TMA and BM < WGMMA_M and BLOCK_N >= WGMMA_M
    shared = e >= n_routed
    base = expert_base(w_ptr, ws_ptr, e, n_routed, stride_we, stride_se)
    stride_g = tl.where(shared, stride_sg, stride_wg)
    stride_n = tl.where(shared, stride_sn, stride_wn)
    tok = (pair // PAIRS_PER_TOKEN).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_inter
    k_lo, k_hi = k_range(n_hidden, BLOCK_K, SPLIT)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * stride_x + (k_lo + offs_k)[None, :]
    g_ptrs = base + offs_n[None, :].to(tl.int64) * stride_n + (k_lo + offs_k)[:, None]
    u_ptrs = g_ptrs + stride_g
    if TAIL:
        t_tok = (t_pair // PAIRS_PER_TOKEN).to(tl.int64)
        t_ptrs = x_ptr + t_tok[:, None] * stride_x + (k_lo + offs_k)[None, :]
    if FP8:  # the rows' weight scales at K block 0 (the next K blocks follow)
        stride_q = tl.where(shared, stride_sqg, stride_qg)  # gate's to up's
        if TMA:  # the [2 * BLOCK_N] columns of the double-width product: gate's, then up's
            col = tl.arange(0, 2 * BLOCK_N)
            offs_q = pid_n * BLOCK_N + col % BLOCK_N
            q_ok = offs_q < n_inter
            qg_ptrs = scale_ptrs(q_ptr, qs_ptr, e, n_routed, offs_q, stride_qe, stride_qn,
                                 stride_sqe, stride_sqn, blk_n, s_blk_n) \
                + (col // BLOCK_N) * stride_q
        else:
            q_ok = n_ok
            qg_ptrs = scale_ptrs(q_ptr, qs_ptr, e, n_routed, offs_n, stride_qe, stride_qn,
                                 stride_sqe, stride_sqn, blk_n, s_blk_n)
            qu_ptrs = qg_ptrs + stride_q
    if TMA:  # one [BM, 2 * BLOCK_N] product: gate's columns, then up's (one wgmma of
        acc = tl.zeros((BM, 2 * BLOCK_N), dtype=tl.float32)  # twice the width)
        if TAIL:
            acc_t = tl.zeros((BM // 2, 2 * BLOCK_N), dtype=tl.float32)
    else:  # SWAP (`kernels.swap_ab`): the accumulators [BLOCK_N, rows], transposed after the loop
        acc_g = acc_zeros(BM, BLOCK_N, SWAP)
        acc_u = acc_zeros(BM, BLOCK_N, SWAP)
        if TAIL:
            acc_tg = acc_zeros(BM // 2, BLOCK_N, SWAP)
            acc_tu = acc_zeros(BM // 2, BLOCK_N, SWAP)
    for k in range(k_lo, k_hi, BLOCK_K):
        k_ok = offs_k + k < n_hidden
        a_mask, b_mask = k_masks(row_ok, n_ok, k_ok, EVEN_K)
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        a_s, a_ts, gs, us = None, None, None, None  # the scales (FP8): none loop-carried
        if FP8:
            if XQ:  # x came quantised: this K step's scales of the rows
                a_s = tl.load(xs_ptr + tok * stride_xs + k // BLOCK_K, mask=row_ok, other=1.0)
            else:
                a, a_s = quant_rows(a, ROUND)
        if TAIL:
            t_mask, _ = k_masks(t_ok, n_ok, k_ok, EVEN_K)
            a_t = tl.load(t_ptrs, mask=t_mask, other=0.0)
            if FP8:
                if XQ:
                    a_ts = tl.load(xs_ptr + t_tok * stride_xs + k // BLOCK_K, mask=t_ok,
                                   other=1.0)
                else:
                    a_t, a_ts = quant_rows(a_t, ROUND)
            t_ptrs += BLOCK_K
        if TMA:  # the [1, 2, BLOCK_N, BLOCK_K] block of gate and up rows, one load
            b = w_desc.load([e, 0, pid_n * BLOCK_N, k]).reshape(2 * BLOCK_N, BLOCK_K)
            if FP8:
                gs = tl.load(qg_ptrs + k // BLOCK_K, mask=q_ok, other=0.0)
            acc = mma(a, tl.trans(b), acc, a_s, gs, PRECISION, FP8)
            if TAIL:
                acc_t = mma(a_t, tl.trans(b), acc_t, a_ts, gs, PRECISION, FP8)
        else:
            g = tl.load(g_ptrs, mask=b_mask, other=0.0)
            u = tl.load(u_ptrs, mask=b_mask, other=0.0)
            if FP8:
                gs = tl.load(qg_ptrs + k // BLOCK_K, mask=q_ok, other=0.0)
                us = tl.load(qu_ptrs + k // BLOCK_K, mask=q_ok, other=0.0)
            acc_g = mma(a, g, acc_g, a_s, gs, PRECISION, FP8, SWAP)
            acc_u = mma(a, u, acc_u, a_s, us, PRECISION, FP8, SWAP)
            if TAIL:
                acc_tg = mma(a_t, g, acc_tg, a_ts, gs, PRECISION, FP8, SWAP)
                acc_tu = mma(a_t, u, acc_tu, a_ts, us, PRECISION, FP8, SWAP)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if TMA:
        acc_g, acc_u = tl.split(tl.permute(acc.reshape(BM, 2, BLOCK_N), (0, 2, 1)))
        if TAIL:
            acc_tg, acc_tu = tl.split(tl.permute(acc_t.reshape(BM // 2, 2, BLOCK_N),
                                                 (0, 2, 1)))
    else:
        acc_g, acc_u = acc_rows(acc_g, SWAP), acc_rows(acc_u, SWAP)
        if TAIL:
            acc_tg, acc_tu = acc_rows(acc_tg, SWAP), acc_rows(acc_tu, SWAP)
    # Shared tiles too: `act` and the split partials may reuse memory that the router still
    # uses (its partials).
    if PDL:
        tl.extra.cuda.gdc_wait()
    last = True
    if SPLIT > 1:  # the partials stored, the last slice to arrive sums them (`split_k`)
        rows = act_row0 + tl.arange(0, BM)
        mask = row_ok[:, None] & n_ok[None, :]
        store_partial(acc_g, 0, 2, part_ptr, rows, offs_n, mask, n_rows, n_inter)
        store_partial(acc_u, 1, 2, part_ptr, rows, offs_n, mask, n_rows, n_inter)
        counter, last = arrive(cnt_ptr, SPLIT)
        if last:
            acc_g = summed(0, 2, part_ptr, rows, offs_n, mask, n_rows, n_inter, SPLIT)
            acc_u = summed(1, 2, part_ptr, rows, offs_n, mask, n_rows, n_inter, SPLIT)
            tl.store(counter, 0)
    if last:
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        _act_store(act_ptr, act, act_row0, offs_n, row_ok, n_ok, n_inter, BM)
        if TAIL:
            act_t = acc_tg * tl.sigmoid(acc_tg) * acc_tu
            _act_store(act_ptr, act_t, act_row0 + BM, offs_n, t_ok, n_ok, n_inter, BM // 2)


# The token count only sizes the direct layout, the tile count only the last tile's tail: not
# specialised, one compile serves every bucket.
@triton.jit(do_not_specialize=["n_tokens", "n_blocks", "first_expert"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def gate_up_kernel(
    x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, ids_ptr, sorted_ptr, block_expert_ptr,
    block_rows_ptr, n_tokens, n_blocks, topk, n_inter, n_hidden, n_routed, first_expert,
    stride_x, stride_we, stride_wg, stride_wn, stride_se, stride_sg, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr, TMA: tl.constexpr, INLINE: tl.constexpr = False,
    E_P2: tl.constexpr = 2, P_BLOCK: tl.constexpr = 1, MERGE_TAIL: tl.constexpr = False,
    LOCAL: tl.constexpr = False, q_ptr=None, qs_ptr=None, stride_qe=0, stride_qg=0,
    stride_qn=0, stride_sqe=0, stride_sqg=0, stride_sqn=0, blk_n=1, s_blk_n=1,
    FP8: tl.constexpr = False, ROUND: tl.constexpr = False, xs_ptr=None, stride_xs=0,
    XQ: tl.constexpr = False, part_ptr=None, cnt_ptr=None, SPLIT: tl.constexpr = 1,
):
    """INLINE (aligned layout, whole tiles): the routed tiles find themselves from `ids`
    (`moe_inline_align`) and the first N-tile's programs write the tile table. MERGE_TAIL
    (aligned layout, whole tiles, no shared experts): a program also takes its expert's tail
    (`moe_tile.tail_tile`). LOCAL (expert parallelism): `ids` are global, the routed experts
    are first_expert.. (`moe_tile.local_expert`); the table of the aligned layout holds local
    ids already. FP8: block-FP8 weights (`_gate_up_rows`; ROUND: off CUDA, `fp8_gemm`); XQ:
    x given in e4m3 with its scales at xs_ptr (`MoEConfig.quant_x`): every tile then waits
    for the kernel before it (the quantisation), the shared ones too. SPLIT (neither
    MERGE_TAIL nor INLINE): K in SPLIT slices, `program_id(2)` (`split_k`)."""
    if DIRECT:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:  # N-tiles fastest: the shared experts' M-tiles, the first, launch first
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    if PDL:  # launched while the router (and alignment) run: routed tiles need their output
        if XQ:  # every tile reads x from the quantisation before it
            tl.extra.cuda.gdc_wait()
        elif not is_shared_tile(pid_m, n_tokens, topk, PAIRS_PER_TOKEN, BLOCK_M, DIRECT):
            tl.extra.cuda.gdc_wait()
    if MERGE_TAIL:
        e, pair, row_ok, merge, t_pair, t_ok = tail_tile(pid_m, sorted_ptr, block_expert_ptr,
                                                         block_rows_ptr, n_blocks, BLOCK_M)
        if e < 0:
            return
        if merge:
            _gate_up_rows(
                x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, e, pair, row_ok, pid_m * BLOCK_M,
                pid_n, n_inter, n_hidden, n_routed, stride_x, stride_we, stride_wg, stride_wn,
                stride_se, stride_sg, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, BLOCK_K,
                EVEN_K, PRECISION, PDL, TMA, t_pair, t_ok, True, q_ptr, qs_ptr, stride_qe,
                stride_qg, stride_qn, stride_sqe, stride_sqg, stride_sqn, blk_n, s_blk_n, FP8,
                ROUND, xs_ptr, stride_xs, XQ)
        else:
            _gate_up_rows(
                x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, e, pair, row_ok, pid_m * BLOCK_M,
                pid_n, n_inter, n_hidden, n_routed, stride_x, stride_we, stride_wg, stride_wn,
                stride_se, stride_sg, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, BLOCK_K,
                EVEN_K, PRECISION, PDL, TMA, None, None, False, q_ptr, qs_ptr, stride_qe,
                stride_qg, stride_qn, stride_sqe, stride_sqg, stride_sqn, blk_n, s_blk_n, FP8,
                ROUND, xs_ptr, stride_xs, XQ)
    else:
        if INLINE:
            e, pair, row_ok = inline_tile(pid_m, pid_n, ids_ptr, sorted_ptr, block_expert_ptr,
                                          block_rows_ptr, n_tokens, topk, n_routed,
                                          first_expert, PAIRS_PER_TOKEN, BLOCK_M, E_P2,
                                          P_BLOCK, LOCAL)
        else:
            e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr,
                                   block_rows_ptr, n_tokens, topk, n_routed, first_expert,
                                   PAIRS_PER_TOKEN, BLOCK_M, DIRECT, LOCAL)
        if e < 0:
            return
        _gate_up_rows(
            x_ptr, w_ptr, ws_ptr, w_desc, act_ptr, e, pair, row_ok, pid_m * BLOCK_M, pid_n,
            n_inter, n_hidden, n_routed, stride_x, stride_we, stride_wg, stride_wn, stride_se,
            stride_sg, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
            PRECISION, PDL, TMA, None, None, False, q_ptr, qs_ptr, stride_qe, stride_qg,
            stride_qn, stride_sqe, stride_sqg, stride_sqn, blk_n, s_blk_n, FP8, ROUND, xs_ptr,
            stride_xs, XQ, part_ptr, cnt_ptr, n_blocks * BLOCK_M, SPLIT)

