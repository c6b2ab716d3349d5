"""The absorbed MLA decode's split kernel with the keys along the products' M dimension
(`DecodePlan.keys_m`): the same contract, grid, paging and partials as `mla_decode._split_kernel`.

Why: at 16 heads a program's products are [16 heads, 576] x [576, keys] and [16, keys] x
[keys, 512]. With the heads as M (16 rows) Triton lowers them to mma.sync, which holds the
whole query in registers (168 a thread at 32-key tiles) and chains 36 dependent MMAs a tile; at
B=32, ctx 1024 the kernel then issues an instruction every 4.2 cycles per scheduler at 12.5%
occupancy and reads the cache at half the copy bandwidth (Nsight Compute, H100, 2026-11-23,
docs/perf/2026-11-23-h100-run87). Transposed, as FlashMLA arranges its products, the scores
are s^T = [keys, 576] x [576, heads] and the output o^T = [512, keys] x [keys, heads]: M is 64
keys or 512 latent columns, both wgmma shapes on sm90, with the KV tile read from shared
memory as A in both (the second time transposed) and the query as B.

The softmax runs down the columns (one per head): max and sum over the keys axis. The output
o^T [512, heads] is stored transposed into the same [rows, heads, splits, kv_lora] partials
(or o_lat), so the merges are unchanged. No fused merge, no shared_p (16 heads only). The
latent columns go in two halves, the widest box a TMA load takes (256): with `TMA` (page
tiles, power-of-two latent and rope widths) a tile is three descriptor loads issued by one
thread instead of every thread's pointer loads; the box then brings whole pages' rows, and
rows past the split's end (other keys of the same page, finite as the cache starts zeroed)
are weighed 0.
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.l2_prefetch import prefetch_rows
from mla_func.kernels.mla_merge import split_chunk


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def tile_pages(pt, n0, nn, end, page_size, max_pages, PAGE_TILES: tl.constexpr):
    """Page ids of the key tile at n0: one scalar (PAGE_TILES: the tile lies in one page) or
    one per key. Keys at or past `end` load nothing; a row past its page table reads the
    scratch page 0 instead of another row's pages."""
    if PAGE_TILES:
        n = n0
    else:
        n = n0 + nn
    slot = n // page_size
    return tl.load(pt + slot, mask=(n < end) & (slot < max_pages), other=0)


@triton.jit(do_not_specialize=["s_pt", "max_pages", "num_splits"])  # fewer compiled variants
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def split_kernel_km(
    q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out, kv_desc,
    kp_desc, sq_h, sq_t, sp_t, sp_h, s_row, s_pt, so_h, so_t,
    heads, kv_lora, rope, page_size, max_pages, scale_log2, num_splits,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, PAGE_TILES: tl.constexpr,
    PREFETCH: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr = False,
    L2_KEYS: tl.constexpr = 0, ROW_BYTES: tl.constexpr = 0, TMA: tl.constexpr = False,
):
    if PDL:  # the merge may launch once every program has started; it waits for our end
        tl.extra.cuda.gdc_launch_dependents()
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    seq = tl.load(token_seq + t).to(tl.int64)
    kv_len = tl.load(positions + t).to(tl.int32) + 1
    chunk = split_chunk(kv_len, num_splits, BLOCK_N)
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)

    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    hm = h < heads
    rm = r < rope
    pt = page_table + seq * s_pt
    nn = tl.arange(0, BLOCK_N)
    if PREFETCH:
        nxt = tile_pages(pt, start, nn, end, page_size, max_pages, PAGE_TILES)
    if EARLY:  # launched while the absorb kernel runs (see mla_decode._split_kernel)
        if L2_KEYS > 0:
            if hb == 0:
                prefetch_rows(cache, pt, start, end, page_size, max_pages, s_row, ROW_BYTES,
                              L2_KEYS)
        tl.extra.cuda.gdc_wait()
    # The query transposed: [latent columns, heads], the products' B operand; in two halves
    # of columns, as the TMA boxes (at most 256 wide) bring the tile.
    HALF: tl.constexpr = BLOCK_C // 2
    ca = tl.arange(0, HALF)
    cb = HALF + ca
    qa = tl.load(q_lat + h[None, :] * sq_h + t * sq_t + ca[:, None],
                 mask=(ca < kv_lora)[:, None] & hm[None, :], other=0.0).to(cache.dtype.element_ty)
    qb = tl.load(q_lat + h[None, :] * sq_h + t * sq_t + cb[:, None],
                 mask=(cb < kv_lora)[:, None] & hm[None, :], other=0.0).to(cache.dtype.element_ty)
    qp_t = tl.load(q_pe + t * sp_t + h[None, :] * sp_h + r[:, None],
                   mask=rm[:, None] & hm[None, :], other=0.0).to(cache.dtype.element_ty)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc_a = tl.zeros([HALF, BLOCK_H], tl.float32)
    acc_b = tl.zeros([HALF, BLOCK_H], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + nn
        nm = n < end
        if PREFETCH:
            page = nxt
            nxt = tile_pages(pt, n0 + BLOCK_N, nn, end, page_size, max_pages, PAGE_TILES)
        else:
            page = tile_pages(pt, n0, nn, end, page_size, max_pages, PAGE_TILES)
        if TMA:  # whole boxes: rows past `end` are other keys of the page (finite: the cache
            row0 = page * page_size + n0 % page_size  # starts zeroed), weighed 0 below
            kva = kv_desc.load([row0, 0])
            kvb = kv_desc.load([row0, HALF])
            kp = kp_desc.load([row0, kv_lora])
        else:
            if PAGE_TILES:  # n0 is a multiple of BLOCK_N, which divides page_size
                rows = page.to(tl.int64) * page_size + n0 % page_size + nn
            else:
                rows = page.to(tl.int64) * page_size + n % page_size
            at = cache + rows[:, None] * s_row
            kva = tl.load(at + ca[None, :], mask=nm[:, None] & (ca < kv_lora)[None, :],
                          other=0.0)
            kvb = tl.load(at + cb[None, :], mask=nm[:, None] & (cb < kv_lora)[None, :],
                          other=0.0)
            kp = tl.load(at + kv_lora + r[None, :], mask=nm[:, None] & rm[None, :], other=0.0)
        s_t = (tl.dot(kva, qa) + tl.dot(kvb, qb) + tl.dot(kp, qp_t)) * scale_log2
        s_t = tl.where(nm[:, None], s_t, float("-inf"))  # [keys, heads]
        m_new = tl.maximum(m, tl.max(s_t, 0))
        alpha = tl.exp2(m - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        lsum = lsum * alpha + tl.sum(p_t, 0)
        m = m_new
        p_t = p_t.to(kva.dtype)
        acc_a = acc_a * alpha[None, :] + tl.dot(tl.trans(kva), p_t)
        acc_b = acc_b * alpha[None, :] + tl.dot(tl.trans(kvb), p_t)

    safe = tl.where(lsum > 0, lsum, 1.0)
    hm_out = hm
    if SPLIT:
        live = (h * 0 + start) < kv_len  # a tensor: the interpreter rejects scalar masks
        base = (t * heads + h) * num_splits + split
        lse = tl.where(lsum > 0, m + tl.log2(safe), float("-inf"))
        tl.store(part_lse + base, lse, mask=hm)  # -inf from empty splits: they weigh 0
        hm_out = hm & live
        dst = part_o + base[None, :] * kv_lora
    else:
        dst = out + h[None, :] * so_h + t * so_t
    for half in tl.static_range(2):
        cols = ca if half == 0 else cb
        o_t = (acc_a if half == 0 else acc_b) / safe[None, :]
        tl.store(dst + cols[:, None], o_t.to(dst.dtype.element_ty),
                 mask=(cols < kv_lora)[:, None] & hm_out[None, :])
