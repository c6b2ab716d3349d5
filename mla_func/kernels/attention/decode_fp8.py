"""The split-KV decode over the FP8 latent cache: group scales on the scores, not on the tile.

An FP8 cache row (`mla_func.cache_fp8`, FlashMLA's 656 bytes) holds c_kv as e4m3 values q8
with one float32 scale a group of GS columns, and k_pe in bf16. With q = [q_lat, q_pe] and
c_kv[n, c] = q8[n, c] * sc[n, g(c)] (DeepSeek-V2, arXiv:2405.04434, 2.1 and appendix C):

    score[h, n] = sum_g sc[n, g] * (q_lat[h, g] . q8[n, g]) + q_pe[h] . k_pe[n]
    o_lat[h, g] = sum_n (p[h, n] * sc[n, g]) . q8[n, g]

so the scales multiply [heads, keys] tiles (one a group) and never the [keys, kv_lora] tile,
which is only converted: e4m3 values are exact in bf16 and in float16. The latent products run
group by group: GROUPS dots of GS columns, one float32 accumulator a group. In the query's
dtype (bf16) the products are exact where decode.py's dequantised tiles round e4m3 x scale
to bf16, and p * sc is rounded to bf16 as p is there. `F16` (`DecodePlan.f16`) runs them in
float16, to which e4m3 converts in one instruction a value pair (bf16 takes three: ~390
of the bf16 form's PTX instructions were conversions, against 68 tensor-core ones): the
query's latent part is first multiplied by one power of two that brings its largest |value|
into [2^14, 2^15), exact in float16 down to 2^-28 of that value, and the scores by its
inverse; p enters the value product as p * sc / top, top the tile's largest scale of the
group (so <= 1), the product then multiplied by top.

At 16 heads a program this form is faster than dequantising the tile (`DecodePlan.group_scores`,
docs/DECISIONS.md); at 64 it keeps four accumulators and tiles and spills, and decode.py's
`_split_kernel` runs those plans. Splits, pages, the early launch and the partials are
`_split_kernel`'s (same arguments, same merge).
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.attention.fp8_rows import rope_values
from mla_func.kernels.attention.paging import (
    early_wait,
    split_keys,
    store_lse,
    store_o,
    tile_pages,
)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _pow2(e):
    """The float32 2**e (e an int32, clamped to float32's normal range), built from its bits."""
    return (tl.minimum(tl.maximum(e + 127, 1), 254) << 23).to(tl.float32, bitcast=True)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _f16_range(qs, GROUPS: tl.constexpr):
    """(2**k, 2**-k): the power of two that brings the largest |value| of the float32 tiles
    `qs` into [2^14, 2^15); (1, 1) where they are all zero."""
    amax = tl.max(tl.max(tl.abs(qs[0]), 1), 0)
    for g in tl.static_range(1, GROUPS):
        amax = tl.maximum(amax, tl.max(tl.max(tl.abs(qs[g]), 1), 0))
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # amax in [2^e, 2^(e+1))
    k = tl.where(amax > 0, 14 - e, 0)
    return _pow2(k), _pow2(-k)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _latent(x, like, F16: tl.constexpr):
    """`x` in the latent products' dtype: float16 (F16), else `like`'s (the query's)."""
    if F16:
        y = x.to(tl.float16)
    else:
        y = x.to(like.dtype)
    return y


@triton.jit(do_not_specialize=["s_pt", "max_pages", "num_splits"])  # fewer compiled variants
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def split_fp8_kernel(
    q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out,
    sq_h, sq_t, sp_t, sp_h, s_row, s_pt, so_h, so_t,
    heads, kv_lora, rope, page_size, max_pages, scale_log2, num_splits,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, PAGE_TILES: tl.constexpr, PDL: tl.constexpr,
    GS: tl.constexpr, GROUPS: tl.constexpr, ROPE_AT: tl.constexpr, F16: tl.constexpr,
    EARLY: tl.constexpr = False, L2_KEYS: tl.constexpr = 0, ROW_BYTES: tl.constexpr = 0,
):
    if PDL:  # the merge may launch once every program has started; it waits for our end
        tl.extra.cuda.gdc_launch_dependents()
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    seq, kv_len, start, end = split_keys(token_seq, positions, t, split, num_splits, BLOCK_N)

    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    cg = tl.arange(0, GS)
    r = tl.arange(0, BLOCK_R)
    hm = h < heads
    rm = r < rope
    pt = page_table + seq * s_pt
    nn = tl.arange(0, BLOCK_N)
    nxt = tile_pages(pt, start, nn, end, page_size, max_pages, PAGE_TILES)
    if EARLY:  # launched while the absorb kernel runs
        early_wait(cache, pt, start, end, page_size, max_pages, s_row, hb, ROW_BYTES, L2_KEYS)
    qs = ()
    for g in tl.static_range(GROUPS):
        c = g * GS + cg
        qs = qs + (tl.load(q_lat + h[:, None] * sq_h + t * sq_t + c[None, :],
                           mask=hm[:, None] & (c < kv_lora)[None, :], other=0.0
                           ).to(tl.float32),)
    up = 1.0
    down = 1.0
    if F16:  # float16 holds q * up exactly down to 2^-28 of its largest value
        up, down = _f16_range(qs, GROUPS)
    qp = tl.load(q_pe + t * sp_t + h[:, None] * sp_h + r[None, :],
                 mask=hm[:, None] & rm[None, :], other=0.0).to(q_lat.dtype.element_ty)
    ql = ()
    for g in tl.static_range(GROUPS):
        ql = ql + (_latent(qs[g] * up, qp, F16),)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = ()
    for _g in tl.static_range(GROUPS):
        acc = acc + (tl.zeros([BLOCK_H, GS], tl.float32),)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + nn
        nm = n < end
        page = nxt  # loaded one iteration ahead
        nxt = tile_pages(pt, n0 + BLOCK_N, nn, end, page_size, max_pages, PAGE_TILES)
        if PAGE_TILES:  # n0 is a multiple of BLOCK_N, which divides page_size
            rows = cache + (page.to(tl.int64) * page_size + n0 % page_size) * s_row + nn * s_row
        else:
            rows = cache + (page.to(tl.int64) * page_size + n % page_size) * s_row
        kp = tl.load(rope_values(rows, ROPE_AT)[:, None] + r[None, :],
                     mask=nm[:, None] & rm[None, :], other=0.0).to(qp.dtype)
        s = tl.dot(qp, tl.trans(kp))
        sc_at = (rows + kv_lora).to(tl.pointer_type(tl.float32), bitcast=True)
        kv = ()
        sc = ()
        for g in tl.static_range(GROUPS):
            c = g * GS + cg
            cm = c < kv_lora
            # The group's bytes loaded twice, as [keys, c] for the value product and as
            # [c, keys] for the scores: each load has one use, so the pipeliner streams both
            # into shared memory ahead of the dots (one load with two uses stayed a register
            # load, converted apart for each dot; the second read hits L2).
            q8 = tl.load(rows[:, None] + c[None, :], mask=nm[:, None] & cm[None, :], other=0)
            k8 = tl.load(rows[None, :] + c[:, None], mask=nm[None, :] & cm[:, None], other=0)
            kv = kv + (_latent(q8.to(tl.float8e4nv, bitcast=True), qp, F16),)
            sc = sc + (tl.load(sc_at + g, mask=nm, other=0.0),)
            kt = _latent(k8.to(tl.float8e4nv, bitcast=True), qp, F16)
            s += tl.dot(ql[g], kt) * (sc[g] * down)[None, :]
        s = tl.where(nm[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        m = m_new
        new = ()
        for g in tl.static_range(GROUPS):
            if F16:  # p * sc / top <= 1 (float16's range), the product then times top
                top = tl.max(sc[g], 0)
                top = tl.where(top > 0, top, 1.0)
                pg = (p * (sc[g] / top)[None, :]).to(tl.float16)
                new = new + (acc[g] * alpha[:, None] + tl.dot(pg, kv[g]) * top,)
            else:
                pg = (p * sc[g][None, :]).to(qp.dtype)
                new = new + (tl.dot(pg, kv[g], acc[g] * alpha[:, None]),)
        acc = new

    safe = tl.where(lsum > 0, lsum, 1.0)
    # A tensor, not a scalar: the interpreter rejects scalar-and-tensor masks.
    live = (h * 0 + start) < kv_len
    base = (t * heads + h) * num_splits + split
    if SPLIT:
        store_lse(part_lse, base, m, lsum, hm)
    for g in tl.static_range(GROUPS):
        c = g * GS + cg
        store_o(acc[g] / safe[:, None], out, part_o, h, t, c, hm, c < kv_lora, base, live,
                so_h, so_t, kv_lora, SPLIT)


__all__ = ["split_fp8_kernel"]
