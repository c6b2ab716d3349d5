"""The selection half of the fused router: scores, group mask, top-k, normalisation.

`ops.moe.route` after the logits (DeepSeek-V2 greedy / group_limited_greedy, DeepSeek-V3
noaux_tc; arXiv:2405.04434, arXiv:2412.19437), for a tile of tokens at once, inside the
router kernels (`kernels/router/route.py`, `kernels/router/rows.py`), which own the logits and the
launch; `sum_and_select` reads their per-split partial logits, sums them and selects.

Experts are laid out as (group, slot): position p = g * BLOCK_GS + j holds expert
g * GROUP_SIZE + j, so the per-group reductions are one reduction over the slot axis of a
[tokens, groups, slots] view, whatever the group size (a power of two or not). Positions
past the experts are -inf. Every argmax takes the lowest position on ties, which is the
lowest expert id.
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _argmax(x, axis: tl.constexpr):
    return tl.max(x, axis=axis, return_indices=True, return_indices_tie_break_left=True)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def expert_of(p, BLOCK_GS: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """The expert id at (group, slot) position p."""
    if BLOCK_GS == GROUP_SIZE:  # positions are ids: keeps loads by id contiguous
        return p
    else:
        return (p // BLOCK_GS) * GROUP_SIZE + p % BLOCK_GS


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def select_experts(logits, rows, T, bias_ptr, w_out, id_out, scale, E: tl.constexpr,
                   BLOCK_T: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                   METHOD: tl.constexpr, N_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,
                   BLOCK_GS: tl.constexpr, NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """logits fp32 [BLOCK_T, BLOCK_G * BLOCK_GS] of tokens `rows` -> (weights fp32, ids
    int64) [T, K] at rows < T. METHOD: 0 greedy, 1 group_limited_greedy, 2 noaux_tc."""
    BLOCK_P: tl.constexpr = BLOCK_G * BLOCK_GS
    p = tl.arange(0, BLOCK_P)
    eid = expert_of(p, BLOCK_GS, GROUP_SIZE)
    in_range = (p % BLOCK_GS < GROUP_SIZE) & (eid < E)
    valid = in_range[None, :]
    neg_inf = float("-inf")
    logits = tl.where(valid, logits, neg_inf)
    if METHOD == 2:
        scores = tl.sigmoid(logits)
        choice = scores
        if HAS_BIAS:
            bias = tl.load(bias_ptr + eid, mask=in_range, other=0.0).to(tl.float32)
            choice = scores + bias[None, :]
        choice = tl.where(valid, choice, neg_inf)
    else:
        ex = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = ex / tl.sum(ex, axis=1)[:, None]
        choice = tl.where(valid, scores, neg_inf)
    if METHOD != 0:
        c3 = tl.reshape(choice, [BLOCK_T, BLOCK_G, BLOCK_GS])
        top1, at = _argmax(c3, 2)
        gscore = top1
        if METHOD == 2:  # the sum of the group's top-2: drop one copy of the max
            j3 = tl.arange(0, BLOCK_GS)[None, None, :]
            gscore += tl.max(tl.where(j3 == at[:, :, None], neg_inf, c3), axis=2)
        g = tl.arange(0, BLOCK_G)[None, :]
        gscore = tl.where(g < N_GROUP, gscore, neg_inf)
        keep = tl.zeros([BLOCK_T, BLOCK_G], dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUP):
            _, best = _argmax(gscore, 1)
            hit = g == best[:, None]
            keep = tl.where(hit, 1, keep)
            gscore = tl.where(hit, neg_inf, gscore)
        # route masks the other groups' experts with -inf (noaux_tc) or 0 (V2's scores).
        fill = 0.0
        if METHOD == 2:
            fill = neg_inf
        c3 = tl.where(keep[:, :, None] > 0, c3, fill)
        choice = tl.where(valid, tl.reshape(c3, [BLOCK_T, BLOCK_P]), neg_inf)
    kk = tl.arange(0, BLOCK_K)[None, :]
    picked = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)  # positions
    for i in tl.static_range(K):
        _, at = _argmax(choice, 1)
        picked = tl.where(kk == i, at[:, None], picked)
        choice = tl.where(p[None, :] == at[:, None], neg_inf, choice)
    # The unbiased scores of the chosen experts (noaux_tc ranks by score + bias).
    weights = tl.where(kk < K, tl.gather(scores, picked, 1), 0.0)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=1)[:, None] + 1e-20)
    weights = weights * scale
    ids = expert_of(picked, BLOCK_GS, GROUP_SIZE).to(tl.int64)
    # (kk < K) & (rows < T), written so that the interpreter accepts it.
    kmask = (kk + tl.where(rows < T, 0, K)[:, None]) < K
    tl.store(w_out + rows[:, None] * K + kk, weights, mask=kmask)
    tl.store(id_out + rows[:, None] * K + kk, ids, mask=kmask)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def sum_and_select(part_ptr, b, T, n_split, bias_ptr, w_out, id_out, scale, E: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, SEL_T: tl.constexpr,
                   BLOCK_S: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                   METHOD: tl.constexpr, N_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,
                   BLOCK_GS: tl.constexpr, NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Block b's logits: its partials summed in split order, SEL_T tokens at a time, read
    straight into the (group, slot) layout of `select_experts`."""
    p = tl.arange(0, BLOCK_G * BLOCK_GS)
    eid = expert_of(p, BLOCK_GS, GROUP_SIZE)
    pmask = ((p % BLOCK_GS < GROUP_SIZE) & (eid < E))[None, None, :]
    js = tl.arange(0, BLOCK_S)
    # Partials are [block, split, BLOCK_T, BLOCK_E]: constant strides inside the tile.
    block_part = part_ptr + b.to(tl.int64) * n_split * BLOCK_T * BLOCK_E
    for r0 in range(0, tl.minimum(T - b.to(tl.int64) * BLOCK_T, BLOCK_T), SEL_T):
        r = r0 + tl.arange(0, SEL_T)
        rows = b.to(tl.int64) * BLOCK_T + r
        live = (rows < T)[:, None, None]
        logits = tl.zeros([SEL_T, BLOCK_G * BLOCK_GS], dtype=tl.float32)
        for j0 in tl.range(0, n_split, BLOCK_S, num_stages=3):
            ptrs = (block_part + j0 * BLOCK_T * BLOCK_E + js[None, :, None] * BLOCK_T * BLOCK_E
                    + r[:, None, None] * BLOCK_E + eid[None, None, :])
            mask = live & (j0 + js < n_split)[None, :, None] & pmask
            # .cg: other SMs wrote these, read them from L2. (Triton may stage them through
            # an L1-allocating cp.async; no L1 holds a stale line: nothing reads a block's
            # partials before its last program does, and L1 starts clean every launch.)
            logits += tl.sum(tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg"), axis=1)
        select_experts(logits, rows, T, bias_ptr, w_out, id_out, scale, E, SEL_T, K, BLOCK_K,
                       METHOD, N_GROUP, BLOCK_G, TOPK_GROUP, GROUP_SIZE, BLOCK_GS, NORMALIZE,
                       HAS_BIAS)
