"""Paged absorbed MLA decode in Triton: split-KV over the latent cache, then an LSE merge.

Math (DeepSeek-V2, arXiv:2405.04434, 2.1 and appendix C): with q_lat = q_nope . W_UK per head,
scores are [q_lat, q_pe] . [c_kv, k_pe] over the cached 576-wide rows, o_lat = softmax . c_kv,
and o = o_lat . W_UV^T. The split-KV scheme and the log-sum-exp merge follow FlashDecoding
(Dao et al., 2023) and FlashMLA; the paged layout follows vLLM's PagedAttention.

One program owns (head block, split, query row): it loads each KV tile [BLOCK_N, latent] once
and scores all BLOCK_H heads against it, so at 16 heads the cache is read once, and at 128 heads
the head blocks of one tile run next to each other (head block is the fastest grid axis) and
share it through L2. Row t sees keys 0..positions[t] of sequence token_seq[t], read on the
device, so one kernel serves decodes and short extends; padded rows (position 0, scratch page)
read one key and are harmless.

Graph safety: the split count comes from `plan_decode(rows, capacity, num_sms)`
(decode_plan.py), a function of tensor shapes only (rows in the bucket, page-table capacity),
never of host-read lengths; each split covers a device-computed chunk of its row's real length,
and empty splits write only lse = -inf, which the merge weighs 0. Workspace buffers live in a
`DecodeWorkspace` the backend owns, allocated at the first (warm-up) call per shape and
reused, so replays see the same addresses.

A key tile is addressed from one page-table entry when page_size is a multiple of block_n
(contiguous rows; gathered per key otherwise), and the next tile's page entries load one
iteration ahead, so the KV tile load never waits on a page-table load in the same iteration
(sm90 compiles double-buffer it at num_stages 3). The merge (merge.py) launches while the
split kernel runs (sm90, programmatic dependent launch; its programs wait for its end).
Variants (`DecodePlan` fields, so one benchmark run compares them): `early` (sm90) launches
the split kernel itself while the absorb kernel before it runs: it reads the batch's metadata
and bulk-prefetches the first cache rows of its chunk into L2 (`l2_prefetch.py`), then waits
for the absorbed query and the new rows; `warm` has the merge, launched early, prefetch W_UV
into L2 for the product after it; `uv` fuses that product into the merge (merge_uv.py: o
written directly, no o_lat, no bmm launch); `shared_p` hands p and the rescale factor to the
value product through per-program scratch (`p_scratch.through_memory`), so that at 64 heads a
program the two warpgroups split the score tile instead of both computing it; `ws` (sm90, 64
heads a program) runs the split in decode_ws.py's warp-specialised Gluon kernel instead
(same partials, same merge).

An FP8 cache (`mla_func.cache_fp8`, FlashMLA's 656-byte rows) runs, at 16 heads a program,
decode_fp8.py's form of the split kernel (`DecodePlan.group_scores`: the rows' group scales
multiply the scores and the probabilities, never the key tile); at 64 heads a program this
kernel with `FP8` set: each key tile's e4m3 c_kv is dequantised in registers
(`fp8_rows.load_latent`: e4m3 x scale in float32, then the dots' dtype, q_lat's), the bf16
rope values read through a recast pointer, and the tile then feeds the same score and value
products. Either way the cache is read in half the bytes, and the partials and the merge are
the float cache's. The plan says which (`DecodePlan.fp8`, never `ws`: decode_ws.py reads bf16
rows).

The whole absorbed attention around these launches (the absorbed query, the value product) is
absorbed.py's `attend_absorbed`.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

from mla_func.cache_fp8 import compute_dtype, is_fp8
from mla_func.kernels.attention.decode_fp8 import split_fp8_kernel
from mla_func.kernels.attention.decode_plan import (
    MAX_SPLITS,
    DecodePlan,
    DecodeWorkspace,
    LatentRows,
    PageTable,
    PartialLse,
    PartialO,
    RopeRows,
    RowIndex,
    effective_plan,
    num_sms,
    pdl,
    plan_decode,
    shared_p_numel,
    shrink,
    smaller_plan,
)
from mla_func.kernels.attention.decode_ws import decode_ws
from mla_func.kernels.attention.decode_ws import supported as ws_supported
from mla_func.kernels.attention.fp8_rows import load_latent, rope_values, row_constexprs
from mla_func.kernels.attention.merge import launch_merge
from mla_func.kernels.attention.p_scratch import through_memory
from mla_func.kernels.attention.paging import (
    early_wait,
    split_keys,
    store_lse,
    store_o,
    tile_pages,
)
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.ops.attention import CacheLayer

__all__ = ["MAX_SPLITS", "DecodePlan", "DecodeWorkspace", "effective_plan", "mla_decode",
           "num_sms", "plan_decode"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@triton.jit(do_not_specialize=["s_pt", "max_pages", "num_splits"])  # fewer compiled variants
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _split_kernel(
    q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out,
    p_buf, a_buf, sq_h, sq_t, sp_t, sp_h, s_row, s_pt, so_h, so_t,
    heads, kv_lora, rope, page_size, max_pages, scale_log2, num_splits,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, PAGE_TILES: tl.constexpr,
    PDL: tl.constexpr, SHARED_P: tl.constexpr, ASM_SYNC: tl.constexpr,
    FP8: tl.constexpr, GS: tl.constexpr, GROUPS: tl.constexpr, ROPE_AT: tl.constexpr,
    EARLY: tl.constexpr = False, L2_KEYS: tl.constexpr = 0, ROW_BYTES: tl.constexpr = 0,
):
    if PDL:  # the merge may launch once every program has started; it waits for our end
        tl.extra.cuda.gdc_launch_dependents()
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    if SHARED_P:  # two tiles of p and of alpha per program
        program = (t * num_splits + split) * tl.num_programs(0) + hb
        p_buf += program * (2 * BLOCK_H * BLOCK_N)
        a_buf += program * (2 * BLOCK_H)
    seq, kv_len, start, end = split_keys(token_seq, positions, t, split, num_splits, BLOCK_N)

    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    hm = h < heads
    cm = c < kv_lora
    rm = r < rope

    pt = page_table + seq * s_pt
    nn = tl.arange(0, BLOCK_N)
    # Page tiles: loop-invariant offsets from one scalar row base per tile.
    kv_off = nn[:, None] * s_row + c[None, :]
    kp_off = nn[:, None] * s_row + kv_lora + r[None, :]
    nxt = tile_pages(pt, start, nn, end, page_size, max_pages, PAGE_TILES)
    if EARLY:  # launched while the absorb kernel runs
        early_wait(cache, pt, start, end, page_size, max_pages, s_row, hb, ROW_BYTES, L2_KEYS)
    q = tl.load(q_lat + h[:, None] * sq_h + t * sq_t + c[None, :],
                mask=hm[:, None] & cm[None, :], other=0.0)
    qp = tl.load(q_pe + t * sp_t + h[:, None] * sp_h + r[None, :],
                 mask=hm[:, None] & rm[None, :], other=0.0)
    if FP8:  # the dots run in q_lat's dtype, on dequantised tiles
        q = q.to(q_lat.dtype.element_ty)
        qp = qp.to(q_lat.dtype.element_ty)
    else:
        q = q.to(cache.dtype.element_ty)
        qp = qp.to(cache.dtype.element_ty)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + nn
        nm = n < end
        page = nxt  # loaded one iteration ahead
        nxt = tile_pages(pt, n0 + BLOCK_N, nn, end, page_size, max_pages, PAGE_TILES)
        if PAGE_TILES:  # n0 is a multiple of BLOCK_N, which divides page_size
            tile = cache + (page.to(tl.int64) * page_size + n0 % page_size) * s_row
            kv_ptr = tile + kv_off
            kp_ptr = tile + kp_off
            rows = tile + nn * s_row
        else:
            row = page.to(tl.int64) * page_size + n % page_size
            kv_ptr = cache + row[:, None] * s_row + c[None, :]
            kp_ptr = cache + row[:, None] * s_row + kv_lora + r[None, :]
            rows = cache + row * s_row
        if FP8:  # rows are bytes: e4m3 c_kv, its scales, bf16 k_pe (fp8_rows)
            kv = load_latent(rows, c, nm, kv_lora, BLOCK_N, BLOCK_C, GS, GROUPS)
            kv = kv.to(q_lat.dtype.element_ty)
            kp = tl.load(rope_values(rows, ROPE_AT)[:, None] + r[None, :],
                         mask=nm[:, None] & rm[None, :], other=0.0).to(kv.dtype)
        else:
            kv = tl.load(kv_ptr, mask=nm[:, None] & cm[None, :], other=0.0)
            kp = tl.load(kp_ptr, mask=nm[:, None] & rm[None, :], other=0.0)
        if SHARED_P:  # scaled apart: `a + dot(b, c)` would become a dot chained to the first
            s = tl.dot(q, tl.trans(kv)) * scale_log2 + tl.dot(qp, tl.trans(kp)) * scale_log2
        else:
            s = (tl.dot(q, tl.trans(kv)) + tl.dot(qp, tl.trans(kp))) * scale_log2
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        m = m_new
        if SHARED_P:
            p, alpha = through_memory(p.to(kv.dtype), alpha, p_buf, a_buf, n0, start, end,
                                       BLOCK_H, BLOCK_N, ASM_SYNC)
            acc = tl.dot(p, kv, acc * alpha[:, None])
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)

    safe = tl.where(lsum > 0, lsum, 1.0)
    # A tensor, not a scalar: the interpreter rejects scalar-and-tensor masks.
    live = (h * 0 + start) < kv_len
    base = (t * heads + h) * num_splits + split
    if SPLIT:
        store_lse(part_lse, base, m, lsum, hm)
    store_o(acc / safe[:, None], out, part_o, h, t, c, hm, cm, base, live, so_h, so_t, kv_lora,
            SPLIT)


def mla_decode(
    q_lat: LatentRows,
    q_pe: RopeRows,
    cache: CacheLayer,
    page_table: PageTable,
    token_seq: RowIndex,
    positions: RowIndex,
    scale: float,
    plan: DecodePlan,
    out: LatentRows,
    part_o: PartialO,
    part_lse: PartialLse,
    scratch: tuple[Tensor, Tensor] | None = None,
    warm: Tensor | None = None,
    merge: bool = True,
    shrunk: dict[DecodePlan, DecodePlan] | None = None,
) -> LatentRows:
    """o_lat[h, t] = softmax over keys 0..positions[t] of sequence token_seq[t]; into `out`.
    `scratch` (p in q_lat's dtype, alpha in fp32; `DecodeWorkspace.shared_p`): needed by
    plan.shared_p only. `warm`: what plan.warm prefetches into L2 (the next product's
    weights). `merge` False: the merge is left to the caller (`mla_merge_uv`), which
    reads the partials; `out` is then written only by a single split. `shrunk`: where plans
    that ran out of resources are recorded (`DecodeWorkspace.shrunk`; default: nowhere)."""
    assert q_lat.stride(-1) == 1 and q_pe.stride(-1) == 1 and out.stride(-1) == 1
    assert cache.stride(-1) == 1 and cache.stride(0) == cache.shape[1] * cache.stride(1)
    if plan.fp8 != is_fp8(cache) or (plan.group_scores and not plan.fp8) or (
            plan.f16 and not plan.group_scores):
        raise ValueError(f"the decode plan's fp8={plan.fp8}, group_scores="
                         f"{plan.group_scores}, f16={plan.f16} do not describe the cache "
                         f"({cache.dtype}) or agree: plan it with plan_decode(..., fp8=...)")
    shrunk = {} if shrunk is None else shrunk
    plan = effective_plan(plan, shrunk)
    if plan.ws and ws_supported(cache, q_lat.shape[0], plan.block_n):  # decode_ws.py
        decode_ws(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan.num_splits,
                  plan.block_n, plan.num_stages, out, part_o, part_lse,
                  plan.early and pdl_supported(q_lat.device))
    else:
        plan = _launch_split(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan,
                             out, part_o, part_lse, scratch, shrunk)
    if plan.num_splits > 1 and merge:
        launch_merge(plan.block_n, part_o, part_lse, positions, out, pdl(plan, q_lat.device),
                     warm if plan.warm else None)
    return out


def _launch_split(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan, out,
                  part_o, part_lse, scratch, shrunk) -> DecodePlan:
    """Launch the Triton split kernel; the plan it ran (smaller tiles where `plan` ran out of
    resources)."""
    while True:
        try:
            kernel, grid, args, kwargs = split_launch(q_lat, q_pe, cache, page_table,
                                                      token_seq, positions, scale, plan, out,
                                                      part_o, part_lse, scratch)
            kernel[grid](*args, **kwargs)
            return plan
        except OutOfResources:
            smaller = smaller_plan(plan)
            if smaller is None:
                raise
            plan = shrink(plan, smaller, shrunk)


def split_launch(q_lat: LatentRows, q_pe: RopeRows, cache: CacheLayer, page_table: PageTable,
                 token_seq: RowIndex, positions: RowIndex, scale: float, plan: DecodePlan,
                 out: LatentRows, part_o: PartialO, part_lse: PartialLse,
                 scratch: tuple[Tensor, Tensor] | None = None) -> tuple:
    """(kernel, grid, arguments, keyword arguments) of the split launch for `plan`:
    `_split_kernel`, or decode_fp8.py's `split_fp8_kernel` where the plan says
    `group_scores` (the sm90 compile test reads the same)."""
    heads, tokens, kv_lora = q_lat.shape
    splits = plan.num_splits
    if splits > 1:
        assert part_o.shape[2] == splits and part_lse.shape[2] == splits
    grid = (_cdiv(heads, plan.block_h), splits, tokens)
    block_c = triton.next_power_of_2(kv_lora)
    rows = (q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1), cache.stride(1),
            page_table.stride(0), out.stride(0), out.stride(1), heads, kv_lora, q_pe.shape[-1],
            cache.shape[1], page_table.shape[1], scale * 1.4426950408889634, splits)
    kwargs = dict(
        SPLIT=splits > 1, BLOCK_H=plan.block_h, BLOCK_N=plan.block_n,
        BLOCK_R=max(16, triton.next_power_of_2(q_pe.shape[-1])),
        PAGE_TILES=cache.shape[1] % plan.block_n == 0, PDL=pdl(plan, q_lat.device),
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    if plan.early and pdl_supported(q_lat.device):
        kwargs.update(early_launch(plan, cache))
    tensors = (q_lat, q_pe, cache, page_table, token_seq, positions, part_o, part_lse, out)
    fp8 = row_constexprs(cache, kv_lora, block_c)
    if plan.group_scores:
        del fp8["FP8"]
        return split_fp8_kernel, grid, tensors + rows, kwargs | fp8 | dict(F16=plan.f16)
    p_buf, a_buf = part_lse, part_lse  # unused unless shared_p
    if plan.shared_p:
        assert scratch is not None, "plan.shared_p needs the scratch buffers"
        p_buf, a_buf = scratch
        p_numel, a_numel = shared_p_numel(plan, tokens, heads)
        assert p_buf.dtype == compute_dtype(cache, q_lat.dtype) and a_buf.dtype == torch.float32
        assert p_buf.numel() >= p_numel and a_buf.numel() >= a_numel
    kwargs.update(BLOCK_C=block_c, SHARED_P=plan.shared_p, ASM_SYNC=cache.is_cuda, **fp8)
    return _split_kernel, grid, tensors + (p_buf, a_buf) + rows, kwargs


def early_launch(plan: DecodePlan, cache: Tensor) -> dict:
    """Keyword arguments of an early split launch (`DecodePlan.early`): a programmatic
    dependent of the launch before it, warming L2 with up to one cache row a thread of its
    chunk (none where a row is not a whole number of 16-byte units) before it waits."""
    row_bytes = cache.shape[-1] * cache.element_size()
    aligned = (row_bytes % 16 == 0 and cache.stride(1) * cache.element_size() % 16 == 0
               and cache.data_ptr() % 16 == 0)
    keys = plan.num_warps * 32 if aligned else 0
    return dict(EARLY=True, L2_KEYS=keys, ROW_BYTES=row_bytes, launch_pdl=True)
