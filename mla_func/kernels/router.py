"""Fused MoE router: logits, scoring, group masking, top-k, normalisation in one launch.

Implements `ops.moe.route` (DeepSeek-V2 greedy / group_limited_greedy, DeepSeek-V3 noaux_tc;
arXiv:2405.04434, arXiv:2412.19437) for decode-sized steps, where the reference's six small
kernels (fp32 cast, GEMV, softmax, topk, ...) cost far more than their arithmetic.

Grid (token blocks, hidden splits). Program (b, s) computes, for each of the BLOCK_T tokens of
block b, the partial logits x[t, chunk s] . router[:, chunk s]^T in float32 (x upcast from the
model dtype); the router chunk is read from DRAM once per block and from cache for the other
tokens. With one split the program selects directly. Otherwise it stores its partials, and the
last program of the block to arrive (an acq_rel counter, reset by that program so the buffer
is zero again for the next launch) sums them in split order -- deterministic whatever the
arrival order -- and selects. Top-k is k rounds of argmax, the lowest index on ties.

The counter buffer is cached per device, allocated on the first call: run the op once
eagerly before a CUDA-graph capture (warm-up does), and do not run two router launches at
once on different streams of one device. Above `KERNEL_MAX_TOKENS` tokens the op runs the
torch reference (`route`), which reads the router once instead of once per token block.
"""

import functools
from dataclasses import replace
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.ops.moe import route

METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}
# Prefill-sized steps go to the reference: the kernel's router traffic grows with the tokens.
KERNEL_MAX_TOKENS = 64
MAX_EXPERTS = 256
# Router elements per (experts x hidden) tile: 32 KiB fp32, 16 per thread at 16 warps (the
# many warps keep enough loads in flight; AOT sm90: 64-118 registers, no spills).
_TILE = 8192
_NUM_WARPS = 16
_TARGET_PROGRAMS = 128  # about one program per SM on H100/H200 (132 SMs)
_MAX_SPLIT = 64
_MAX_BLOCK_T = 8  # tokens sharing one read of a router chunk
_COUNTERS: dict[torch.device, Tensor] = {}


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _select(logits, rows, e, T, bias_ptr, w_out, id_out, scale, E: tl.constexpr,
            BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
            METHOD: tl.constexpr, N_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
            TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, NORMALIZE: tl.constexpr,
            HAS_BIAS: tl.constexpr):
    """Scores, group mask, top-k and normalisation of logits [BLOCK_T, BLOCK_E], all tokens
    of the block at once (each reduction is paid once per block, not once per token)."""
    valid = (e < E)[None, :]
    neg_inf = float("-inf")
    logits = tl.where(valid, logits, neg_inf)
    if METHOD == 2:
        scores = tl.sigmoid(logits)
        choice = scores
        if HAS_BIAS:
            bias = tl.load(bias_ptr + e, mask=e < E, other=0.0).to(tl.float32)
            choice = scores + bias[None, :]
        choice = tl.where(valid, choice, neg_inf)
    else:
        p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
        choice = scores
    if METHOD != 0:
        g = tl.arange(0, BLOCK_G)[None, :]
        gscore = tl.full([BLOCK_T, BLOCK_G], neg_inf, tl.float32)
        for gi in tl.static_range(N_GROUP):
            vals = tl.where(((e // GROUP_SIZE) == gi)[None, :], choice, neg_inf)
            top1 = tl.max(vals, axis=1)
            if METHOD == 2:  # sum of the group's top-2: drop one copy of the max
                first = tl.min(tl.where(vals == top1[:, None], e[None, :], BLOCK_E), axis=1)
                top1 += tl.max(tl.where(e[None, :] == first[:, None], neg_inf, vals), axis=1)
            gscore = tl.where(g == gi, top1[:, None], gscore)
        keep = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            gm = tl.max(gscore, axis=1)
            best = tl.min(tl.where(gscore == gm[:, None], g, BLOCK_G), axis=1)
            keep = keep | (g == best[:, None])
            gscore = tl.where(g == best[:, None], neg_inf, gscore)
        # keep[t, group of e], as a sum over the (few) groups.
        kept = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.int32)
        for gi in tl.static_range(N_GROUP):
            kg = tl.sum(tl.where(g == gi, keep.to(tl.int32), 0), axis=1)
            kept += tl.where(((e // GROUP_SIZE) == gi)[None, :], kg[:, None], 0)
        if METHOD == 2:
            choice = tl.where(kept > 0, choice, neg_inf)
        else:
            choice = tl.where(kept > 0, choice, 0.0)
        choice = tl.where(valid, choice, neg_inf)
    kk = tl.arange(0, BLOCK_K)[None, :]
    weights = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
    for i in tl.static_range(K):
        cm = tl.max(choice, axis=1)
        idx = tl.min(tl.where(choice == cm[:, None], e[None, :], BLOCK_E), axis=1)
        hit = e[None, :] == idx[:, None]
        if METHOD == 2:
            wi = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        else:
            wi = cm
        weights = tl.where(kk == i, wi[:, None], weights)
        ids = tl.where(kk == i, idx.to(tl.int64)[:, None], ids)
        choice = tl.where(hit, neg_inf, choice)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=1)[:, None] + 1e-20)
    weights = weights * scale
    # (kk < K) & (rows < T), written so that the interpreter accepts it.
    kmask = (kk + tl.where(rows < T, 0, K)[:, None]) < K
    tl.store(w_out + rows[:, None] * K + kk, weights, mask=kmask)
    tl.store(id_out + rows[:, None] * K + kk, ids, mask=kmask)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _router_kernel(x_ptr, r_ptr, bias_ptr, part_ptr, cnt_ptr, w_out, id_out, T, hidden,
                   x_stride, chunk, n_split, scale, E: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                   K: tl.constexpr, BLOCK_K: tl.constexpr, METHOD: tl.constexpr,
                   N_GROUP: tl.constexpr, BLOCK_G: tl.constexpr, TOPK_GROUP: tl.constexpr,
                   GROUP_SIZE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   REDUCE: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    rows = b.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    h_lo = s * chunk
    h_hi = tl.minimum(h_lo + chunk, hidden)
    logits = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for i in range(BLOCK_T):
        t = b.to(tl.int64) * BLOCK_T + i
        acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
        t_hi = tl.where(t < T, h_hi, h_lo)  # padding tokens of the last block: no loads
        for h0 in range(h_lo, t_hi, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            hmask = h < t_hi
            xv = tl.load(x_ptr + t * x_stride + h, mask=hmask, other=0.0)
            w = tl.load(r_ptr + e[:, None] * hidden + h[None, :],
                        mask=emask[:, None] & hmask[None, :], other=0.0)
            acc += w * xv.to(tl.float32)[None, :]
        if REDUCE:
            tl.store(part_ptr + (t * n_split + s) * BLOCK_E + e, tl.sum(acc, axis=1))
        else:
            logits = tl.where((rows == t)[:, None], tl.sum(acc, axis=1)[None, :], logits)
    if REDUCE:
        # Every thread's partial stores happen-before the release of the counter increment.
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel", scope="gpu")
        if arrived == n_split - 1:
            # Sum the partials in split order: deterministic whatever the arrival order.
            js = tl.arange(0, BLOCK_S)
            for j0 in range(0, n_split, BLOCK_S):
                ptrs = (part_ptr + (rows[:, None, None] * n_split + j0 + js[None, :, None])
                        * BLOCK_E + e[None, None, :])
                jmask = (j0 + js < n_split)[None, :, None]
                # .cg: other SMs wrote these; read them from L2, never a stale L1 line.
                logits += tl.sum(tl.load(ptrs, mask=jmask, other=0.0, cache_modifier=".cg"),
                                 axis=1)
            tl.store(cnt_ptr + b, 0)
            _select(logits, rows, e, T, bias_ptr, w_out, id_out, scale, E, BLOCK_E, BLOCK_T,
                    K, BLOCK_K, METHOD, N_GROUP, BLOCK_G, TOPK_GROUP, GROUP_SIZE, NORMALIZE,
                    HAS_BIAS)
    else:
        _select(logits, rows, e, T, bias_ptr, w_out, id_out, scale, E, BLOCK_E, BLOCK_T, K,
                BLOCK_K, METHOD, N_GROUP, BLOCK_G, TOPK_GROUP, GROUP_SIZE, NORMALIZE, HAS_BIAS)


def launch_config(tokens: int, experts: int, hidden: int) -> dict[str, int]:
    """Block sizes and the hidden split of a launch (pure; the sm90 AOT test uses it too).
    The split spreads the router read over about `_TARGET_PROGRAMS` programs, capped at
    `_MAX_SPLIT` so that the last program's sum over the partials stays short."""
    block_e = max(triton.next_power_of_2(experts), 16)
    block_h = min(max(_TILE // block_e, 16), max(triton.next_power_of_2(hidden), 16))
    block_t = min(triton.next_power_of_2(max(tokens, 1)), _MAX_BLOCK_T)
    blocks = triton.cdiv(max(tokens, 1), block_t)
    tiles = triton.cdiv(hidden, block_h)
    want = min(tiles, _MAX_SPLIT, max(1, _TARGET_PROGRAMS // blocks))
    per_split = triton.cdiv(tiles, want)
    n_split = triton.cdiv(tiles, per_split)
    block_s = min(max(1, _TILE // (block_t * block_e)), triton.next_power_of_2(n_split))
    return dict(BLOCK_E=block_e, BLOCK_H=block_h, BLOCK_T=block_t, BLOCK_S=block_s,
                num_warps=_NUM_WARPS, blocks=blocks, chunk=per_split * block_h, n_split=n_split)


def _counters(device: torch.device, blocks: int) -> Tensor:
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < blocks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("mla_func::moe_route: run it once before CUDA-graph capture")
        buf = _COUNTERS[device] = torch.zeros(max(blocks, KERNEL_MAX_TOKENS), dtype=torch.int32,
                                              device=device)
    return buf


def _launch(x: Tensor, router: Tensor, score_bias: Tensor | None, top_k: int, n_group: int,
            topk_group: int, method: str, normalize: bool, scale: float
            ) -> tuple[Tensor, Tensor]:
    tokens, hidden = x.shape
    experts = router.shape[0]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=x.device)
    if not tokens:
        return weights, ids
    x = x.contiguous()
    router = router.float().contiguous()
    bias = score_bias.float().contiguous() if score_bias is not None else router
    cfg = launch_config(tokens, experts, hidden)
    reduce = cfg["n_split"] > 1
    part = (torch.empty(cfg["blocks"] * cfg["BLOCK_T"] * cfg["n_split"] * cfg["BLOCK_E"],
                        dtype=torch.float32, device=x.device) if reduce else weights)
    counters = _counters(x.device, cfg["blocks"]) if reduce else weights
    grouped = method != "greedy"
    _router_kernel[(cfg["blocks"], cfg["n_split"])](
        x, router, bias, part, counters, weights, ids, tokens, hidden, x.stride(0),
        cfg["chunk"], cfg["n_split"], scale, E=experts, BLOCK_E=cfg["BLOCK_E"],
        BLOCK_H=cfg["BLOCK_H"], BLOCK_T=cfg["BLOCK_T"], BLOCK_S=cfg["BLOCK_S"], K=top_k,
        BLOCK_K=triton.next_power_of_2(top_k), METHOD=METHODS[method],
        N_GROUP=n_group if grouped else 1, BLOCK_G=triton.next_power_of_2(n_group or 1),
        TOPK_GROUP=topk_group if grouped else 1,
        GROUP_SIZE=experts // n_group if grouped else experts, NORMALIZE=normalize,
        HAS_BIAS=score_bias is not None, REDUCE=reduce, num_warps=cfg["num_warps"])
    return weights, ids


@functools.lru_cache(maxsize=64)
def _reference_cfg(experts: int, top_k: int, n_group: int, topk_group: int, method: str,
                   normalize: bool, scale: float) -> MLAConfig:
    # deepseek_v3 makes `route` normalise exactly when norm_topk_prob (= normalize) is set.
    return replace(MLAConfig(), model_type="deepseek_v3", n_routed_experts=experts,
                   num_experts_per_tok=top_k, topk_method=method, n_group=n_group,
                   topk_group=topk_group, norm_topk_prob=normalize,
                   routed_scaling_factor=scale)


@torch.library.custom_op("mla_func::moe_route", mutates_args=())
def moe_route(x: Tensor, router: Tensor, score_bias: Tensor | None, top_k: int, n_group: int,
              topk_group: int, method: str, normalize: bool, scale: float
              ) -> tuple[Tensor, Tensor]:
    """x [tokens, hidden], router fp32 [experts, hidden] -> (weights fp32, ids int64)
    [tokens, top_k]: `route` with the settings passed as plain values."""
    if x.shape[0] <= KERNEL_MAX_TOKENS and router.shape[0] <= MAX_EXPERTS:
        return _launch(x, router, score_bias, top_k, n_group, topk_group, method, normalize,
                       scale)
    cfg = _reference_cfg(router.shape[0], top_k, n_group, topk_group, method, normalize, scale)
    weights, ids = route(x, router, score_bias, cfg)
    return weights.contiguous(), ids.contiguous()


@moe_route.register_fake
def _(x, router, score_bias, top_k, n_group, topk_group, method, normalize, scale):
    shape = (x.shape[0], top_k)
    return (torch.empty(shape, dtype=torch.float32, device=x.device),
            torch.empty(shape, dtype=torch.int64, device=x.device))


def route_fused(
    x: Float[Tensor, "tokens hidden"],
    router: Float[Tensor, "experts hidden"],
    score_bias: Float[Tensor, " experts"] | None,
    cfg: MLAConfig,
) -> tuple[Float[Tensor, "tokens topk"], Int[Tensor, "tokens topk"]]:
    """`ops.moe.route` as one custom op (one Triton launch for decode-sized steps)."""
    method = cfg.topk_method
    normalize = cfg.norm_topk_prob and (method == "noaux_tc" or cfg.model_type == "deepseek_v3")
    return torch.ops.mla_func.moe_route(
        x, router, score_bias, cfg.num_experts_per_tok, cfg.n_group or 1, cfg.topk_group or 1,
        method, normalize, float(cfg.routed_scaling_factor))
