"""The three partitions of the warp-specialised MLA decode (`mla_decode_ws`, Gluon, sm90) and
their helpers: the TMA loader warp, the score warpgroup (scores, online softmax, the hand-over
of p and its rescale factor, value columns [0, 256)) and the value warpgroup (columns [256,
512)). The protocol, on mbarriers in shared memory:

- `ready[s]` (TMA bytes) / `empty[s]` (two arrivals: both warpgroups' value products of the
  tile) guard the key-tile ring;
- `p_full[j]` / `p_empty[j]` guard the hand-over buffers of p (bf16) and alpha;
- `fin`: the score warpgroup's lsum reaches the value warpgroup for its normalisation.

The score warpgroup waits for tile i - 1's value products, issues tile i + 1's score product,
then runs tile i's softmax beneath it; tile i's value products run beneath the wait for that
score (wgmma groups complete in order).
"""

from typing import no_type_check

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# Triton 3.6 (the GPU machines) names the TMA load async_copy_global_to_shared; later
# versions (3.9 in CI) async_load, with the old name raising.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# Likewise cp.async (the gather of keys from pages under a tile).
cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
GATHER_WARPS = gl.constexpr(4)  # loader warps where keys are gathered (GATHER_WARPS * 32 arrive)

# The shapes the kernel is written for (V2 / V3): kv_lora 512 and qk_rope 64.
KV_LORA_SIZE, ROPE_SIZE = 512, 64
BLOCK_H = gl.constexpr(64)  # heads a program: one wgmma M
COLS = gl.constexpr(64)  # columns of a shared-memory chunk: one 128-byte swizzle row
CHUNKS = gl.constexpr(9)  # chunks of a cache row (kv_lora 512 + qk_rope 64) and of the query
HALF_CHUNKS = gl.constexpr(4)  # chunks of value columns a warpgroup accumulates (512 = 2 x 256)
# A warpgroup's 64-column value accumulator, p as its register operand, and its rows.
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, COLS.value, 16]))
P_OPERAND = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT.value, k_width=2))
O_ROWS = gl.constexpr(gl.SliceLayout(1, O_LAYOUT.value))


@gluon.jit
@no_type_check  # keeps the jaxtyping import hook off Gluon kernels
def gdc_wait():
    """sm90 programmatic dependent launch: wait until the kernel before has ended and its
    writes are visible (`tl.extra.cuda.gdc_wait`'s instruction; `kernels/launch/pdl.py`)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
@no_type_check  # keeps the jaxtyping import hook off Gluon kernels
def _work(positions, num_splits, BLOCK_N: gl.constexpr):
    """(row t, split, keys of row t, first key, end) of this program: `mla_merge.split_chunk`'s
    chunks."""
    split = gl.program_id(1)
    t = gl.program_id(2).to(gl.int64)
    kv_len = gl.load(positions + t).to(gl.int32) + 1
    chunk = gl.cdiv(gl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    return t, split, kv_len, start, gl.minimum(start + chunk, kv_len)


@gluon.jit
@no_type_check
def loader(desc, cache, s_row, k_bufs, ready, empty, page_table, token_seq, positions, s_pt,
           page_size, max_pages, num_splits, q_desc, q_smem, q_ready, kv_lora,
           BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr,
           EARLY: gl.constexpr):
    """Key tile i into stage i % STAGES once both value products of the tile that held it are
    done (`empty` takes two arrivals): by TMA, CHUNKS boxes of 64 columns from one warp, where
    the tile lies in one page; else (GATHER: pages under BLOCK_N keys) by cp.async from
    GATHER_WARPS warps, a key's page looked up per key, keys past the end zero-filled.
    EARLY (the kernel launched while the one before, which writes q_lat and the row's newest
    cache row, still runs): the first tiles that lie wholly before the newest row (up to
    STAGES of them) load first, then the loader waits for that kernel and loads q_lat."""
    t, _, kv_len, start, end = _work(positions, num_splits, BLOCK_N)
    pt = page_table + gl.load(token_seq + t).to(gl.int64) * s_pt
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    first = 0
    if EARLY:  # tiles ending at or before the newest row (kv_len - 1) are old rows only
        first = gl.minimum(gl.minimum(gl.maximum(kv_len - 1 - start, 0) // BLOCK_N, n_tiles),
                           STAGES)
        for i in range(first):
            _load_tile(desc, cache, s_row, k_bufs, ready, empty, pt, i, start, end, page_size,
                       max_pages, BLOCK_N, STAGES, GATHER)
        gdc_wait()
        load_q(q_desc, q_smem, q_ready, kv_lora)
    for i in range(first, n_tiles):
        _load_tile(desc, cache, s_row, k_bufs, ready, empty, pt, i, start, end, page_size,
                   max_pages, BLOCK_N, STAGES, GATHER)


@gluon.jit
@no_type_check
def load_q(q_desc, q_smem, q_ready, kv_lora):
    """The 64 heads' q_lat of this program's row by TMA into the query's chunks, arriving on
    q_ready (rows past the heads read as zeros)."""
    h0 = gl.program_id(0) * BLOCK_H
    col = gl.program_id(2) * kv_lora
    mbarrier.expect(q_ready, q_desc.block_type.nbytes * 2 * HALF_CHUNKS)
    for k in gl.static_range(2 * HALF_CHUNKS):
        tma_load(q_desc, [h0, col + k * COLS], q_ready, q_smem.index(k))


@gluon.jit
@no_type_check
def _load_tile(desc, cache, s_row, k_bufs, ready, empty, pt, i, start, end, page_size,
               max_pages, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    """Key tile i of the program's keys into stage i % STAGES once that stage is free."""
    s = i % STAGES
    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
    n0 = start + i * BLOCK_N
    if GATHER:
        _gather_tile(cache, s_row, k_bufs, s, ready.index(s), pt, n0, end, page_size,
                     max_pages, BLOCK_N)
    else:
        page = gl.load(pt + gl.minimum(n0 // page_size, max_pages - 1)).to(gl.int32)
        row = page * page_size + n0 % page_size
        mbarrier.expect(ready.index(s), desc.block_type.nbytes * CHUNKS)
        for c in gl.static_range(CHUNKS):
            tma_load(desc, [row, c * COLS], ready.index(s), k_bufs.index(s * CHUNKS + c))


@gluon.jit
@no_type_check
def _gather_tile(cache, s_row, k_bufs, s, ready, pt, n0, end, page_size, max_pages,
                 BLOCK_N: gl.constexpr):
    """The keys n0 .. n0 + BLOCK_N of the row's pages into stage s by cp.async (16 bytes a
    thread and copy); each thread's copies arrive on `ready` when done."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [GATHER_WARPS, 1], [1, 0])
    n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    live = n < end
    page = gl.load(pt + gl.minimum(n // page_size, max_pages - 1), mask=live, other=0)
    row = (page.to(gl.int64) * page_size + n % page_size) * s_row
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    for k in gl.static_range(CHUNKS):
        cp_async(k_bufs.index(s * CHUNKS + k), cache + row[:, None] + (k * COLS + c)[None, :],
                 mask=live[:, None])
    async_copy.mbarrier_arrive(ready, increment_count=False)


@gluon.jit
@no_type_check
def _score(q_smem, k_bufs, stage, s_zero):
    """S = Q K^T of the tile in `stage`, issued (CHUNKS chained products, one wgmma group
    each)."""
    tok = warpgroup_mma(q_smem.index(0), k_bufs.index(stage * CHUNKS).permute((1, 0)), s_zero,
                        use_acc=False, is_async=True)
    for c in gl.static_range(1, CHUNKS):
        tok = warpgroup_mma(q_smem.index(c), k_bufs.index(stage * CHUNKS + c).permute((1, 0)),
                            tok, is_async=True)
    return tok


@gluon.jit
@no_type_check
def _values(p_op, k_bufs, stage, first: gl.constexpr, o0, o1, o2, o3):
    """o_k += p V[:, chunk first + k] for the tile in `stage`, issued (one group each)."""
    base = stage * CHUNKS + first
    o0 = warpgroup_mma(p_op, k_bufs.index(base), o0, is_async=True)
    o1 = warpgroup_mma(p_op, k_bufs.index(base + 1), o1, is_async=True)
    o2 = warpgroup_mma(p_op, k_bufs.index(base + 2), o2, is_async=True)
    o3 = warpgroup_mma(p_op, k_bufs.index(base + 3), o3, is_async=True)
    return o0, o1, o2, o3


@gluon.jit
@no_type_check
def _softmax_step(s_cur, n0, end, m, lsum, scale_log2, s_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s = gl.where((keys < end)[None, :], s_cur * scale_log2, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, 1))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(s - m_new[:, None])
    return p, alpha, m_new, lsum * alpha + gl.sum(p, 1)


@gluon.jit
@no_type_check
def _hand_over(p, alpha, i, p_bufs, a_bufs, p_full, p_empty, P_BUFS: gl.constexpr):
    """p and alpha of tile i into hand-over buffer i % P_BUFS, once the value warpgroup is
    done with the tile that used it last."""
    j = i % P_BUFS
    mbarrier.wait(p_empty.index(j), ((i // P_BUFS) & 1) ^ 1)
    p_bufs.index(j).store(p)
    a_bufs.index(j).store(alpha)
    mbarrier.arrive(p_full.index(j))


@gluon.jit
@no_type_check
def _zero_tail(k_bufs, stage, n0, end, BLOCK_N: gl.constexpr):
    """Value rows of the last tile at or past `end`: zero, so that p = 0 times them is 0."""
    if end - n0 < BLOCK_N:
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        for c in gl.static_range(2 * HALF_CHUNKS):
            part = k_bufs.index(stage * CHUNKS + c)
            part.store(gl.where((rows < end)[:, None], part.load(layout), 0.0))
        fence_async_shared()  # generic-proxy stores before the wgmma reads


@gluon.jit
@no_type_check
def _store(o, k: gl.constexpr, lsum, h, t, split, kv_len, start, part_o, out, so_h, so_t,
           heads, kv_lora, num_splits, o_layout: gl.constexpr, SPLIT: gl.constexpr):
    """Columns [64 k, 64 k + 64) of o / lsum: the split's partial, or o_lat at one split."""
    c = k * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, o_layout))
    safe = gl.where(lsum > 0, lsum, 1.0)
    o = o / safe[:, None]
    hm = h < heads
    if SPLIT:
        base = ((t * heads + h) * num_splits + split).to(gl.int64)
        live = hm & ((h * 0 + start) < kv_len)
        gl.store(part_o + base[:, None] * kv_lora + c[None, :], o,
                 mask=live[:, None] & (c < kv_lora)[None, :])
    else:
        gl.store(out + h[:, None].to(gl.int64) * so_h + t * so_t + c[None, :],
                 o.to(out.dtype.element_ty), mask=hm[:, None] & (c < kv_lora)[None, :])


@gluon.jit
@no_type_check
def _store_half(o0, o1, o2, o3, first: gl.constexpr, lsum, h, t, split, kv_len, start, part_o,
                out, so_h, so_t, heads, kv_lora, num_splits, o_layout: gl.constexpr,
                SPLIT: gl.constexpr):
    """A warpgroup's four 64-column accumulators, chunks first .. first + 3."""
    _store(o0, first, lsum, h, t, split, kv_len, start, part_o, out, so_h, so_t, heads,
           kv_lora, num_splits, o_layout, SPLIT)
    _store(o1, first + 1, lsum, h, t, split, kv_len, start, part_o, out, so_h, so_t, heads,
           kv_lora, num_splits, o_layout, SPLIT)
    _store(o2, first + 2, lsum, h, t, split, kv_len, start, part_o, out, so_h, so_t, heads,
           kv_lora, num_splits, o_layout, SPLIT)
    _store(o3, first + 3, lsum, h, t, split, kv_len, start, part_o, out, so_h, so_t, heads,
           kv_lora, num_splits, o_layout, SPLIT)


@gluon.jit
@no_type_check
def score_partition(q_smem, q_ready, q_pe, sp_t, sp_h, k_bufs, p_bufs, a_bufs, l_smem, ready,
                    empty, p_full, p_empty, fin, positions, part_o, part_lse, out, so_h, so_t,
                    heads, kv_lora, scale_log2, num_splits, SPLIT: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, P_BUFS: gl.constexpr,
                    EARLY: gl.constexpr):
    """The score warpgroup: all scores, the softmax, value columns [0, 256)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = O_LAYOUT
    p_layout: gl.constexpr = P_OPERAND
    rows: gl.constexpr = O_ROWS
    t, split, kv_len, start, end = _work(positions, num_splits, BLOCK_N)
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    lsum = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    o0 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o1 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o2 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o3 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    # q_pe into the query's last chunk (q_lat arrives by TMA).
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    hq = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    r = gl.arange(0, COLS, layout=gl.SliceLayout(0, ld))
    if EARLY:  # q_pe is the kernel before's output
        gdc_wait()
    qp = gl.load(q_pe + t * sp_t + hq[:, None] * sp_h + r[None, :], mask=(hq < heads)[:, None],
                 other=0.0)
    q_smem.index(2 * HALF_CHUNKS).store(qp.to(gl.bfloat16))
    fence_async_shared()
    mbarrier.wait(q_ready, 0)
    if n_tiles > 0:
        mbarrier.wait(ready.index(0), 0)
        s_cur = warpgroup_mma_wait(0, deps=(_score(q_smem, k_bufs, 0, s_zero),))
        for i in range(n_tiles - 1):  # every tile but the last: the next score runs meanwhile
            # Tile i - 1's value products are done: its stage is free on this side.
            o0, o1, o2, o3 = warpgroup_mma_wait(0, deps=(o0, o1, o2, o3))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
            nxt = (i + 1) % STAGES
            mbarrier.wait(ready.index(nxt), ((i + 1) // STAGES) & 1)
            s_tok = _score(q_smem, k_bufs, nxt, s_zero)
            p, alpha, m, lsum = _softmax_step(s_cur, start + i * BLOCK_N, end, m, lsum,
                                              scale_log2, s_layout, BLOCK_N)
            p = p.to(gl.bfloat16)
            _hand_over(p, alpha, i, p_bufs, a_bufs, p_full, p_empty, P_BUFS)
            a = gl.convert_layout(alpha, rows)[:, None]
            o0, o1, o2, o3 = _values(gl.convert_layout(p, p_layout), k_bufs, i % STAGES, 0,
                                     o0 * a, o1 * a, o2 * a, o3 * a)
            # In order: the next score is done, the four value products may still run.
            s_cur, o0, o1, o2, o3 = warpgroup_mma_wait(HALF_CHUNKS,
                                                       deps=(s_tok, o0, o1, o2, o3))
        last = n_tiles - 1
        o0, o1, o2, o3 = warpgroup_mma_wait(0, deps=(o0, o1, o2, o3))
        p, alpha, m, lsum = _softmax_step(s_cur, start + last * BLOCK_N, end, m, lsum,
                                          scale_log2, s_layout, BLOCK_N)
        p = p.to(gl.bfloat16)
        _zero_tail(k_bufs, last % STAGES, start + last * BLOCK_N, end, BLOCK_N)
        _hand_over(p, alpha, last, p_bufs, a_bufs, p_full, p_empty, P_BUFS)
        a = gl.convert_layout(alpha, rows)[:, None]
        o0, o1, o2, o3 = _values(gl.convert_layout(p, p_layout), k_bufs, last % STAGES, 0,
                                 o0 * a, o1 * a, o2 * a, o3 * a)
        o0, o1, o2, o3 = warpgroup_mma_wait(0, deps=(o0, o1, o2, o3))
    l_smem.store(lsum)
    mbarrier.arrive(fin)
    h = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    if SPLIT:
        safe = gl.where(lsum > 0, lsum, 1.0)
        lse = gl.where(lsum > 0, m + gl.log2(safe), float("-inf"))
        gl.store(part_lse + (t * heads + h) * num_splits + split, lse, mask=h < heads)
    ho = gl.convert_layout(h, rows)
    lo = gl.convert_layout(lsum, rows)
    _store_half(o0, o1, o2, o3, 0, lo, ho, t, split, kv_len, start, part_o, out, so_h, so_t,
                heads, kv_lora, num_splits, o_layout, SPLIT)


@gluon.jit
@no_type_check
def value_partition(k_bufs, p_bufs, a_bufs, l_smem, empty, p_full, p_empty, fin, positions,
                    part_o, out, so_h, so_t, heads, kv_lora, num_splits, SPLIT: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, P_BUFS: gl.constexpr):
    """The value warpgroup: value columns [256, 512) from the score warpgroup's p."""
    o_layout: gl.constexpr = O_LAYOUT
    p_layout: gl.constexpr = P_OPERAND
    rows: gl.constexpr = O_ROWS
    t, split, kv_len, start, end = _work(positions, num_splits, BLOCK_N)
    o0 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o1 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o2 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    o3 = gl.zeros([BLOCK_H, COLS], gl.float32, o_layout)
    for i in range(gl.cdiv(end - start, BLOCK_N)):
        j = i % P_BUFS
        mbarrier.wait(p_full.index(j), (i // P_BUFS) & 1)
        a = a_bufs.index(j).load(rows)[:, None]
        p = p_bufs.index(j).load(p_layout)
        mbarrier.arrive(p_empty.index(j))  # p and alpha are in registers
        # Waited at once: this warpgroup has nothing else to do, and the stage is free sooner.
        o0, o1, o2, o3 = _values(p, k_bufs, i % STAGES, HALF_CHUNKS, o0 * a, o1 * a, o2 * a,
                                 o3 * a)
        o0, o1, o2, o3 = warpgroup_mma_wait(0, deps=(o0, o1, o2, o3))
        mbarrier.arrive(empty.index(i % STAGES))
    mbarrier.wait(fin, 0)
    lsum = l_smem.load(rows)
    h = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=rows)
    _store_half(o0, o1, o2, o3, HALF_CHUNKS, lsum, h, t, split, kv_len, start, part_o, out,
                so_h, so_t, heads, kv_lora, num_splits, o_layout, SPLIT)
