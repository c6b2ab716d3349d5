"""The fused MoE's second grouped GEMM (DeepSeekMoE's expert output, arXiv:2401.06066, grouped as
in vLLM's `fused_moe` Triton kernel): (act W_down^T) times each pair's routing weight, written
to the pair's own row of a [pairs, hidden] buffer (no atomic reduction: deterministic, replayed
bit-identically), which the pair sum (`pair_sum.py`) adds up per token; at a few tokens with that
sum as its programs' tail (`moe_sum.last_sum`). `act` is the gate_up GEMM's output
(`gate_up.py`). Operands and layouts: `gemm.py`; the tiles and the launch:
`fused_moe.fused_experts`. With FP8 the weights are block-FP8 and `act`'s rows are quantised
per token group in the K loop (`fp8_gemm.py`), or once before the launch (`quant_act`); the
routing weights and the store are the same.
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.act_quant import quant_rows
from mla_func.kernels.moe.fp8_gemm import mma, scale_ptrs
from mla_func.kernels.moe.gemm import expert_base, k_masks
from mla_func.kernels.moe.pair_sum import last_sum
from mla_func.kernels.moe.split_k import arrive, k_range, store_partial, summed
from mla_func.kernels.moe.tile import tail_tile, tile
from mla_func.kernels.swap_ab import WGMMA_M, acc_rows, acc_zeros


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _weighted(acc, pair, row_ok, weights_ptr, topk, dtype: tl.constexpr,
              PAIRS_PER_TOKEN: tl.constexpr):
    """A down product's rows times their pairs' routing weights (1 for shared experts), fp32."""
    j = pair % PAIRS_PER_TOKEN
    routed = row_ok & (j < topk)
    w = tl.load(weights_ptr + (pair // PAIRS_PER_TOKEN) * topk + j, mask=routed, other=1.0)
    # Round to the model dtype first, as the reference does, then weight in fp32.
    return acc.to(dtype).to(tl.float32) * w[:, None]


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _down_tile(
    act_ptr, w_ptr, ws_ptr, act_desc, w_desc, act_row0, e, row_ok, n0, n_ok, n_hidden,
    n_inter, n_routed, stride_we, stride_wn, stride_se, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    t_desc, t_ok, TAIL: tl.constexpr, q_ptr, qs_ptr, stride_qe, stride_qn, stride_sqe,
    stride_sqn, blk_n, s_blk_n, FP8: tl.constexpr, ROUND: tl.constexpr, as_ptr,
    AQ: tl.constexpr, SPLIT: tl.constexpr = 1,
):
    """act W_down^T of the BLOCK_M `act` rows from act_row0 and the N-tile of columns
    n0 + BLOCK_N, fp32, before the routing weights (`_weighted`; padding rows are dropped by
    the caller's store; with TMA they hold whatever `act` held). TAIL (`MoEConfig.merge_tail`):
    also that of the BLOCK_M // 2 rows from act_row0 + BLOCK_M (`t_desc`: TMA blocks of that
    many rows) on the same weight tiles: returns both. FP8: e4m3 weights with their block
    scales (`q_ptr`: routed [experts, blocks_out, blocks_in], `qs_ptr`: shared slices),
    `act` quantised per row and K step (`fp8_gemm`), or, AQ, given in e4m3 with its scales
    at as_ptr ([rows, groups]: `act_quant.quant_tokens`, `MoEConfig.quant_act`). SWAP: FP8
    tiles of fewer rows than a warp-group MMA multiply as w act^T (`kernels.swap_ab`). SPLIT:
    over K slice `program_id(2)` of SPLIT only (`split_k`)."""
    SWAP: tl.constexpr = FP8 and BLOCK_M < WGMMA_M and BLOCK_N >= WGMMA_M
    offs_n = n0 + tl.arange(0, BLOCK_N)
    base = expert_base(w_ptr, ws_ptr, e, n_routed, stride_we, stride_se)
    stride_n = tl.where(e >= n_routed, stride_sn, stride_wn)
    k_lo, k_hi = k_range(n_inter, BLOCK_K, SPLIT)
    offs_k = tl.arange(0, BLOCK_K)
    act_rows = (act_row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    a_ptrs = act_ptr + act_rows[:, None] * n_inter + (k_lo + offs_k)[None, :]
    b_ptrs = base + offs_n[None, :].to(tl.int64) * stride_n + (k_lo + offs_k)[:, None]
    if TAIL:
        t_rows = (act_row0 + BLOCK_M + tl.arange(0, BLOCK_M // 2)).to(tl.int64)
        t_ptrs = act_ptr + t_rows[:, None] * n_inter + (k_lo + offs_k)[None, :]
        acc_t = acc_zeros(BLOCK_M // 2, BLOCK_N, SWAP)
    if TMA:  # rows of the [experts * hidden, moe_inter] view, and of `act`
        row_w = e * n_hidden + n0
    if FP8:  # the rows' weight scales at K block 0 (the next K blocks follow)
        q_ptrs = scale_ptrs(q_ptr, qs_ptr, e, n_routed, offs_n, stride_qe, stride_qn,
                            stride_sqe, stride_sqn, blk_n, s_blk_n)
        if AQ:  # act's scales ([rows, groups]) at K block 0, padding rows too
            as_ptrs = as_ptr + act_rows * tl.cdiv(n_inter, BLOCK_K)
            if TAIL:
                as_t_ptrs = as_ptr + t_rows * tl.cdiv(n_inter, BLOCK_K)
    acc = acc_zeros(BLOCK_M, BLOCK_N, SWAP)
    for k in range(k_lo, k_hi, BLOCK_K):
        if TMA:
            a = act_desc.load([act_row0, k])
            b = tl.trans(w_desc.load([row_w, k]))
            if TAIL:
                a_t = t_desc.load([act_row0 + BLOCK_M, k])
        else:
            k_ok = offs_k + k < n_inter
            a_mask, b_mask = k_masks(row_ok, n_ok, k_ok, EVEN_K)
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
            if TAIL:
                t_mask, _ = k_masks(t_ok, n_ok, k_ok, EVEN_K)
                a_t = tl.load(t_ptrs, mask=t_mask, other=0.0)
        a_s, a_ts, b_s = None, None, None  # the scales (FP8): none loop-carried
        if FP8:
            if AQ:  # act came quantised: this K step's scales of the rows
                a_s = tl.load(as_ptrs + k // BLOCK_K)
                if TAIL:
                    a_ts = tl.load(as_t_ptrs + k // BLOCK_K)
            else:
                a, a_s = quant_rows(a, ROUND)
                if TAIL:
                    a_t, a_ts = quant_rows(a_t, ROUND)
            b_s = tl.load(q_ptrs + k // BLOCK_K, mask=n_ok, other=0.0)
        acc = mma(a, b, acc, a_s, b_s, PRECISION, FP8, SWAP)
        if TAIL:
            acc_t = mma(a_t, b, acc_t, a_ts, b_s, PRECISION, FP8, SWAP)
            t_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if TAIL:
        return acc_rows(acc, SWAP), acc_rows(acc_t, SWAP)
    else:
        return acc_rows(acc, SWAP)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _store_pairs(out_ptr, y, pair, row_ok, offs_n, n_ok, n_hidden):
    """Each row of y to its pair's row of `out`."""
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * n_hidden + offs_n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _down_rows(
    act_ptr, w_ptr, ws_ptr, act_desc, w_desc, out_ptr, weights_ptr, act_row0, e, pair,
    row_ok, pid_n, n_hidden, n_inter, n_routed, topk, stride_we, stride_wn, stride_se,
    stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    t_desc, t_pair, t_ok, TAIL: tl.constexpr, q_ptr, qs_ptr, stride_qe, stride_qn, stride_sqe,
    stride_sqn, blk_n, s_blk_n, FP8: tl.constexpr, ROUND: tl.constexpr, as_ptr,
    AQ: tl.constexpr, part_ptr=None, cnt_ptr=None, n_rows=0, SPLIT: tl.constexpr = 1,
):
    """`_down_tile` of BM rows (TAIL: and BM // 2 more), stored to each pair's row of `out`;
    whether this program stored them. SPLIT > 1 (not TAIL): K slice `program_id(2)`, the
    partials summed and stored by the tile's last slice to arrive (`split_k`: `part_ptr`
    its workspace of n_rows rows, `cnt_ptr` one counter a tile)."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_hidden
    dtype = out_ptr.dtype.element_ty  # the model's (`act` may be e4m3)
    if TAIL:  # the tail's rows first: one accumulator's epilogue at a time (registers)
        acc, acc_t = _down_tile(
            act_ptr, w_ptr, ws_ptr, act_desc, w_desc, act_row0, e, row_ok, pid_n * BLOCK_N,
            n_ok, n_hidden, n_inter, n_routed, stride_we, stride_wn, stride_se, stride_sn,
            BM, BLOCK_N, BLOCK_K, EVEN_K, PRECISION, TMA, t_desc, t_ok, True, q_ptr, qs_ptr,
            stride_qe, stride_qn, stride_sqe, stride_sqn, blk_n, s_blk_n, FP8, ROUND, as_ptr,
            AQ)
        _store_pairs(out_ptr, _weighted(acc_t, t_pair, t_ok, weights_ptr, topk, dtype,
                                        PAIRS_PER_TOKEN), t_pair, t_ok, offs_n, n_ok, n_hidden)
    else:
        acc = _down_tile(act_ptr, w_ptr, ws_ptr, act_desc, w_desc, act_row0, e, row_ok,
                         pid_n * BLOCK_N, n_ok, n_hidden, n_inter, n_routed, stride_we,
                         stride_wn, stride_se, stride_sn, BM, BLOCK_N, BLOCK_K, EVEN_K,
                         PRECISION, TMA, None, None, False, q_ptr, qs_ptr, stride_qe,
                         stride_qn, stride_sqe, stride_sqn, blk_n, s_blk_n, FP8, ROUND, as_ptr,
                         AQ, SPLIT)
    last = tl.program_id(2) >= 0  # true: unsplit, every program stores
    if SPLIT > 1:  # the partials stored, the last slice to arrive sums them
        rows = act_row0 + tl.arange(0, BM)
        mask = row_ok[:, None] & n_ok[None, :]
        store_partial(acc, 0, 1, part_ptr, rows, offs_n, mask, n_rows, n_hidden)
        counter, last = arrive(cnt_ptr, SPLIT)
        if last:
            acc = summed(0, 1, part_ptr, rows, offs_n, mask, n_rows, n_hidden, SPLIT)
            tl.store(counter, 0)
    if last:
        y = _weighted(acc, pair, row_ok, weights_ptr, topk, dtype, PAIRS_PER_TOKEN)
        _store_pairs(out_ptr, y, pair, row_ok, offs_n, n_ok, n_hidden)
    return last


@triton.jit(do_not_specialize=["n_tokens", "n_blocks", "first_expert"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def down_kernel(
    act_ptr, w_ptr, ws_ptr, act_desc, act_tail_desc, w_desc, out_ptr, weights_ptr, ids_ptr,
    sorted_ptr, block_expert_ptr, block_rows_ptr, n_tokens, n_blocks, topk, n_hidden, n_inter,
    n_routed, first_expert, stride_we, stride_wn, stride_se, stride_sn,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    TMA: tl.constexpr,
    sum_ptr=None, extra_ptr=None, res_ptr=None, y_ptr=None, nw_ptr=None, counter_ptr=None,
    eps=0.0, LAST_SUM: tl.constexpr = False, HAS_EXTRA: tl.constexpr = False,
    ADD_NORM: tl.constexpr = False, SUM_BLOCK: tl.constexpr = 1, TRIGGER: tl.constexpr = False,
    NORM: tl.constexpr = True, MERGE_TAIL: tl.constexpr = False, LOCAL: tl.constexpr = False,
    q_ptr=None, qs_ptr=None, stride_qe=0, stride_qn=0, stride_sqe=0, stride_sqn=0, blk_n=1,
    s_blk_n=1, FP8: tl.constexpr = False, ROUND: tl.constexpr = False, as_ptr=None,
    AQ: tl.constexpr = False, part_ptr=None, cnt_ptr=None, SPLIT: tl.constexpr = 1,
):
    """Each pair's weighted expert output to its own row of `out` ([pairs, hidden]); with
    MERGE_TAIL, M-tiles as in `gate_up_kernel` (`act_tail_desc`: TMA blocks of the tails'
    half tiles).
    LAST_SUM (direct layout): then `moe_sum.last_sum` into `sum_ptr` (+ extra, + the residual
    with ADD_NORM, and the norm into y unless NORM is off). TRIGGER (sm90): let the launch
    after start at once (PDL; it waits for this one's end before it reads). LOCAL (expert
    parallelism): as in `gate_up_kernel`; a pair of another rank's expert gets no row here.
    FP8: block-FP8 weights (`_down_tile`; ROUND: off CUDA, `fp8_gemm`); AQ: `act` given in
    e4m3 with its scales at as_ptr. SPLIT (not MERGE_TAIL): K in SPLIT slices, `program_id(2)`
    (`split_k`); a tile's last slice to arrive stores it and arrives at the pair sum's counter
    (of a tile of no expert here, its first slice)."""
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    if DIRECT:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:  # N-tiles fastest: an M-tile's `act` rows are read from L2 by all its N-tiles
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    if MERGE_TAIL:
        e, pair, row_ok, merge, t_pair, t_ok = tail_tile(pid_m, sorted_ptr, block_expert_ptr,
                                                         block_rows_ptr, n_blocks, BLOCK_M)
        if e < 0:
            return
        if merge:
            _down_rows(
                act_ptr, w_ptr, ws_ptr, act_desc, w_desc, out_ptr, weights_ptr,
                pid_m * BLOCK_M, e, pair, row_ok, pid_n, n_hidden, n_inter, n_routed, topk,
                stride_we, stride_wn, stride_se, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N,
                BLOCK_K, EVEN_K, PRECISION, TMA, act_tail_desc, t_pair, t_ok, True, q_ptr,
                qs_ptr, stride_qe, stride_qn, stride_sqe, stride_sqn, blk_n, s_blk_n, FP8, ROUND,
                as_ptr, AQ)
        else:
            _down_rows(
                act_ptr, w_ptr, ws_ptr, act_desc, w_desc, out_ptr, weights_ptr,
                pid_m * BLOCK_M, e, pair, row_ok, pid_n, n_hidden, n_inter, n_routed, topk,
                stride_we, stride_wn, stride_se, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N,
                BLOCK_K, EVEN_K, PRECISION, TMA, None, None, None, False, q_ptr, qs_ptr,
                stride_qe, stride_qn, stride_sqe, stride_sqn, blk_n, s_blk_n, FP8, ROUND,
                as_ptr, AQ)
    else:
        e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                                n_tokens, topk, n_routed, first_expert, PAIRS_PER_TOKEN,
                                BLOCK_M, DIRECT, LOCAL)
        last = tl.program_id(2) == 0  # a tile of no expert here: its first slice arrives
        if e >= 0:
            last = _down_rows(
                act_ptr, w_ptr, ws_ptr, act_desc, w_desc, out_ptr, weights_ptr,
                pid_m * BLOCK_M, e, pair, row_ok, pid_n, n_hidden, n_inter, n_routed, topk,
                stride_we, stride_wn, stride_se, stride_sn, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N,
                BLOCK_K, EVEN_K, PRECISION, TMA, None, None, None, False, q_ptr, qs_ptr,
                stride_qe, stride_qn, stride_sqe, stride_sqn, blk_n, s_blk_n, FP8, ROUND,
                as_ptr, AQ, part_ptr, cnt_ptr, n_blocks * BLOCK_M, SPLIT)
        if LAST_SUM:  # an M-tile's storing program arrives, the N-tile's last sums it
            if last:
                last_sum(out_ptr, extra_ptr, sum_ptr, res_ptr, y_ptr, nw_ptr, counter_ptr,
                         ids_ptr, pid_n, tl.num_programs(0), tl.num_programs(1), n_tokens,
                         n_hidden, eps, topk, n_routed, first_expert, PAIRS_PER_TOKEN, HAS_EXTRA,
                         ADD_NORM, BLOCK_N, SUM_BLOCK, NORM, LOCAL)
