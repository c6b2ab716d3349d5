"""Absorbed MLA decode at 64 heads a program for Hopper (sm90): warp-specialised, in Gluon.

The math is `mla_decode`'s (DeepSeek-V2, arXiv:2405.04434, appendix C; split-KV and the LSE
merge after FlashDecoding): scores of the 64 heads' [q_lat, q_pe] against each cached
[c_kv, k_pe] row, o_lat = softmax . c_kv, one (row, split) at a time, its partial and lse
written for `mla_merge` (or o_lat itself at one split). The work split between warps follows
FlashMLA (DeepSeek, 2025) as its write-up describes it; the code is our own (the partitions
and their mbarrier protocol: ws_partitions.py):

- a **loader** warp streams key tiles [BLOCK_N, 576] of the paged cache into a ring of STAGES
  shared-memory buffers by TMA (a tile lies in one page: page_size % BLOCK_N == 0);
- the **score** warpgroup computes S = Q K^T for all 64 heads (Q stays in shared memory), the
  online softmax, hands p (bf16) and the rescale factor to the other warpgroup through shared
  memory, and accumulates the left 256 value columns; it issues the next tile's score product
  before this tile's softmax, so the tensor cores run under the softmax;
- the **value** warpgroup accumulates the right 256 columns from the same p.

Why: in Triton (`mla_decode`, `DecodePlan.shared_p`) one program runs score product, softmax
and value product in series, and p travels through global scratch, so the tensor cores idle
through every softmax (H100, 2026-11-23: 250-265 TFLOP/s, 2.4-2.65x the floor at B=128).
This kernel takes a third less time than the Triton plan at B=128 (docs/DECISIONS.md,
`DecodePlan.ws`; docs/PERF.md has its latest table).

Shared memory (230 KB at 32-key tiles in 4 stages: one program a SM) holds the query and the
key tiles in chunks of 64 columns (allocations must be powers of 2, and a TMA box row may not
exceed the 128-byte swizzle); the score product chains 9 chunk products, and each warpgroup
keeps its 256 value columns as four 64-column accumulators. q_lat arrives by TMA while the
partitions start. Launched early (`DecodePlan.early`, up to `WS_EARLY_MAX_ROWS` rows: sm90
programmatic dependent launch behind the absorb + prologue kernel), the loader first loads the
tiles that hold old rows only (up to STAGES of them), then waits for that kernel and loads
q_lat; the score warpgroup waits before it reads q_pe. The newest row of each sequence, which
that kernel writes, is read only after the wait.

Graph safety is `mla_decode`'s: the grid and split count are the plan's; each program reads
its row's length on the device; empty splits write lse = -inf only. The rows of the last tile
past the row's end are zeroed in shared memory before the value products (0 x NaN is NaN).
"""

from functools import cache
from typing import no_type_check

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mla_func.kernels.attention.decode_plan import (
    LatentRows,
    PageTable,
    PartialLse,
    PartialO,
    RopeRows,
    RowIndex,
)
from mla_func.kernels.attention.ws_partitions import (
    BLOCK_H,
    CHUNKS,
    COLS,
    GATHER_WARPS,
    KV_LORA_SIZE,
    ROPE_SIZE,
    load_q,
    loader,
    score_partition,
    value_partition,
)
from mla_func.ops.attention import CacheLayer


@gluon.jit
@no_type_check
def _decode_ws_kernel(
    q_desc, q_pe, desc, cache, s_row, page_table, token_seq, positions, part_o, part_lse, out,
    sp_t, sp_h, s_pt, so_h, so_t, heads, kv_lora, page_size, max_pages,
    scale_log2, num_splits, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    P_BUFS: gl.constexpr, GATHER: gl.constexpr, LOADER_REGS: gl.constexpr,
    VALUE_REGS: gl.constexpr, EARLY: gl.constexpr = False,
):
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, COLS], gl.bfloat16)
    p_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    # Shared memory in chunks of 64 columns: shapes must be powers of 2.
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [CHUNKS, BLOCK_H, COLS], q_layout)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES * CHUNKS, BLOCK_N, COLS],
                                       desc.layout)
    p_bufs = gl.allocate_shared_memory(gl.bfloat16, [P_BUFS, BLOCK_H, BLOCK_N], p_smem)
    a_bufs = gl.allocate_shared_memory(gl.float32, [P_BUFS, BLOCK_H], flat)
    l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_full = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [P_BUFS, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # TMA: one arrival with the tile's bytes; gather: every loader thread's cp.async.
        mbarrier.init(ready.index(i), count=GATHER_WARPS * 32 if GATHER else 1)
        mbarrier.init(empty.index(i), count=2)  # both value products of the tile
    for i in gl.static_range(P_BUFS):
        mbarrier.init(p_full.index(i), count=1)
        mbarrier.init(p_empty.index(i), count=1)
    mbarrier.init(fin, count=1)

    # The 64 heads' q_lat by TMA, under way while the partitions start (q_pe: the score
    # partition's first work); EARLY: the loader loads it once the kernel before has ended.
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    fence_async_shared()  # the barriers' initialisation before the TMA unit uses them
    if not EARLY:
        load_q(q_desc, q_smem, q_ready, kv_lora)

    gl.warp_specialize([
        (score_partition, (q_smem, q_ready, q_pe, sp_t, sp_h, k_bufs, p_bufs, a_bufs, l_smem,
                            ready, empty, p_full, p_empty, fin, positions, part_o, part_lse,
                            out, so_h, so_t, heads, kv_lora, scale_log2, num_splits, SPLIT,
                            BLOCK_N, STAGES, P_BUFS, EARLY)),
        (value_partition, (k_bufs, p_bufs, a_bufs, l_smem, empty, p_full, p_empty, fin,
                            positions, part_o, out, so_h, so_t, heads, kv_lora, num_splits,
                            SPLIT, BLOCK_N, STAGES, P_BUFS)),
        (loader, (desc, cache, s_row, k_bufs, ready, empty, page_table, token_seq, positions,
                  s_pt, page_size, max_pages, num_splits, q_desc, q_smem, q_ready, kv_lora,
                  BLOCK_N, STAGES, GATHER, EARLY)),
    ], [4, GATHER_WARPS if GATHER else 1], [VALUE_REGS, LOADER_REGS])


def device_ok(device: torch.device) -> bool:
    """Whether `device` runs the kernel: CUDA of compute capability 9.x (wgmma, TMA)."""
    if device.type != "cuda":
        return False
    return _major(device.index if device.index is not None else torch.cuda.current_device()) == 9


@cache
def _major(index: int) -> int:
    """The compute capability's major number of CUDA device `index` (asked once: each call
    costs host time on every decode launch)."""
    return torch.cuda.get_device_capability(index)[0]


def supported(cache: Tensor, heads: int, block_n: int) -> bool:
    """Whether `decode_ws` runs this case: an sm90 device, a bf16 cache of 576-wide rows (512
    + 64) with TMA-aligned rows, above 16 heads, 32- or 64-key tiles (pages of any size: key
    tiles that span pages are gathered)."""
    if not device_ok(cache.device):
        return False
    return (cache.dtype == torch.bfloat16 and cache.shape[-1] == KV_LORA_SIZE + ROPE_SIZE
            and block_n in (32, 64) and heads > 16
            and cache.stride(-1) == 1 and cache.stride(1) * 2 % 16 == 0
            and cache.stride(0) == cache.shape[1] * cache.stride(1)
            and cache.data_ptr() % 16 == 0)


def cache_descriptor(cache: Tensor, block_n: int) -> TensorDescriptor:
    """TMA descriptor of the paged cache as [pages * page_size, latent] rows; a box is 64
    columns of a key tile (a box row may not exceed the 128-byte swizzle)."""
    rows = cache.view(-1, cache.shape[-1]) if cache.is_contiguous() else cache.flatten(0, 1)
    return TensorDescriptor.from_tensor(rows, [block_n, 64], _box_layout(block_n))


@cache
def _box_layout(rows: int) -> gl.NVMMASharedLayout:
    """The shared-memory layout of a [rows, 64] bf16 TMA box (made once: ~10 µs a call)."""
    return gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16)


def decode_ws(
    q_lat: LatentRows,
    q_pe: RopeRows,
    cache: CacheLayer,
    page_table: PageTable,
    token_seq: RowIndex,
    positions: RowIndex,
    scale: float,
    num_splits: int,
    block_n: int,
    stages: int,
    out: LatentRows,
    part_o: PartialO,
    part_lse: PartialLse,
    early: bool = False,
) -> None:
    """`mla_decode`'s split kernel (no merge): the partials and lse of each (row, head block,
    split) into part_o / part_lse, or, at one split, o_lat into `out`. Key tiles of
    `block_n` keys in a ring of `stages` (at least 2); 64-key tiles hand p over through one
    buffer, 32-key tiles through two (what fits in sm90's 227 KB of shared memory: 230 KB at
    32 keys x 4 stages or 64 x 2). `early` (`DecodePlan.early`): launched as a programmatic
    dependent of the kernel before (which writes q_lat, q_pe and the rows' newest cache rows):
    the loader's first tiles of old rows load while that kernel still runs."""
    grid, args, kwargs = ws_launch(q_lat, q_pe, cache, page_table, token_seq, positions, scale,
                                   num_splits, block_n, stages, out, part_o, part_lse, early)
    _decode_ws_kernel[grid](*args, **kwargs)


def ws_launch(q_lat: LatentRows, q_pe: RopeRows, cache: CacheLayer, page_table: PageTable,
              token_seq: RowIndex, positions: RowIndex, scale: float, num_splits: int,
              block_n: int, stages: int, out: LatentRows, part_o: PartialO,
              part_lse: PartialLse, early: bool = False) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of `decode_ws`'s launch (the sm90 compile test
    reads the same)."""
    heads, tokens, kv_lora = q_lat.shape
    assert (kv_lora, q_pe.shape[-1]) == (KV_LORA_SIZE, ROPE_SIZE), "V2/V3's 512 + 64"
    assert q_lat.is_contiguous(), "q_lat is read by TMA as [heads, tokens * kv_lora]"
    assert q_pe.stride(-1) == 1 and out.stride(-1) == 1
    assert stages >= 2 and block_n in (32, 64), (block_n, stages)
    grid = (triton.cdiv(heads, BLOCK_H), num_splits, tokens)
    gather = cache.shape[1] % block_n != 0  # key tiles span pages: cp.async, not TMA
    q_desc = TensorDescriptor.from_tensor(q_lat.view(heads, tokens * kv_lora), [64, 64],
                                          _box_layout(64))
    args = (q_desc, q_pe, cache_descriptor(cache, block_n), cache, cache.stride(1), page_table,
            token_seq, positions, part_o, part_lse, out, q_pe.stride(0), q_pe.stride(1),
            page_table.stride(0), out.stride(0), out.stride(1), heads, kv_lora,
            cache.shape[1], page_table.shape[1], scale * 1.4426950408889634, num_splits)
    # One hand-over buffer at 64-key tiles: two do not fit beside 2 stages (238 KB).
    kwargs = dict(SPLIT=num_splits > 1, BLOCK_N=block_n, STAGES=stages,
                  P_BUFS=1 if block_n == 64 else 2, GATHER=gather,
                  LOADER_REGS=56 if gather else 24, VALUE_REGS=192, EARLY=early,
                  num_warps=4, **({"launch_pdl": True} if early else {}))
    return grid, args, kwargs
