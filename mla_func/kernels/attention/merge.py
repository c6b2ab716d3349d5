"""LSE merge of the split-KV partials of the absorbed MLA decode (`mla_decode`).

Split s of row t wrote, per head, its normalised output o_s = softmax_s . c_kv over its keys
and lse_s = log2 of its softmax denominator (scores already in log2 units). The row's output
is sum_s 2^(lse_s - top) o_s / sum_s 2^(lse_s - top), top = max_s lse_s (FlashDecoding, Dao
et al. 2023; FlashMLA). Splits past the row's real length wrote lse = -inf and no o_s: they
weigh 0, and their o_s (anything, NaN included) is never multiplied in.

`merged` (which `merge_tile` stores) vectorises over splits: it loads one [heads, splits,
columns] tile instead of one 512-wide row per split in a dependent loop. `_merge_kernel` runs
it with one program per (row, head, block of columns); at many splits only over those the
row's length reaches: the split count is fixed per captured bucket for the longest row the page
table holds, so a short row leaves most splits empty (at 1 row and 8256 keys of capacity, 96 of
128 splits for 1024 keys). It sums in split order within one program: deterministic.
"""

from typing import no_type_check

import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.launch.l2_prefetch import prefetch_span

# fp32 elements of one [splits, columns] tile a merge program holds (64 per thread at 4 warps):
# the column block narrows as the splits grow (to 64 columns at MAX_SPLITS).
MERGE_TILE = 8192
# From this many splits on, the tile merge reads a row's length and skips the splits it does not
# reach; at 8 splits or fewer that costs more than it saves, so the plain form stays there
# (docs/DECISIONS.md, `merge.ACTIVE_MIN_SPLITS`).
ACTIVE_MIN_SPLITS = 9


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def split_chunk(kv_len, num_splits, BLOCK_N: tl.constexpr):
    """Keys per split of a row of `kv_len` keys: a multiple of BLOCK_N (so a key tile never
    straddles two splits, nor a page when page_size is a multiple of BLOCK_N)."""
    return tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def reached_splits(positions, t, num_splits, BLOCK_N: tl.constexpr):
    """The splits row t's keys (positions[t] + 1 of them) reach; the rest are empty."""
    kv_len = tl.load(positions + t).to(tl.int32) + 1
    return tl.cdiv(kv_len, split_chunk(kv_len, num_splits, BLOCK_N))


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def merged(
    part_o, part_lse, t, h, hm, c, cm, heads, kv_lora, num_splits, active,
    MERGE_H: tl.constexpr, MERGE_C: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """[MERGE_H, MERGE_C] fp32: the LSE merge of the first `active` splits of row t, for heads
    `h` (live where `hm`) and columns `c` (live where `cm`)."""
    # where(w > 0, ...), not w * o: an empty split's o_s is never written and may be NaN.
    base = (t * heads + h) * num_splits  # [MERGE_H]
    s = tl.arange(0, SPLITS_P2)
    lse = tl.load(part_lse + base[:, None] + s[None, :],
                  mask=hm[:, None] & (s < active)[None, :], other=float("-inf"))
    top = tl.max(lse, 1)
    top = tl.where(top > float("-inf"), top, 0.0)  # heads past `heads`: no NaN from -inf - -inf
    w = tl.exp2(lse - top[:, None])  # [MERGE_H, SPLITS_P2]; masked splits weigh 0
    total = tl.sum(w, 1)
    hcm = hm[:, None, None] & cm[None, None, :]
    po = tl.load(part_o + (base[:, None, None] + s[None, :, None]) * kv_lora + c[None, None, :],
                 mask=hcm & (s < active)[None, :, None], other=0.0)
    acc = tl.sum(tl.where(w[:, :, None] > 0, w[:, :, None] * po, 0.0), 1)
    safe = tl.where(total > 0, total, 1.0)
    return acc / safe[:, None]


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def merge_tile(
    part_o, part_lse, out, t, h, hm, c, cm, so_h, so_t, heads, kv_lora, num_splits, active,
    MERGE_H: tl.constexpr, MERGE_C: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """out[h, t, c] = `merged`, rounded to out's dtype."""
    o = merged(part_o, part_lse, t, h, hm, c, cm, heads, kv_lora, num_splits, active, MERGE_H,
               MERGE_C, SPLITS_P2)
    tl.store(out + h[:, None] * so_h + t * so_t + c[None, :], o.to(out.dtype.element_ty),
             mask=hm[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["num_splits"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _merge_kernel(
    part_o, part_lse, positions, out, warm, warm_bytes, so_h, so_t, heads, kv_lora, num_splits,
    MERGE_C: tl.constexpr, SPLITS_P2: tl.constexpr, PDL: tl.constexpr, BLOCK_N: tl.constexpr,
    ACTIVE: tl.constexpr, WARM: tl.constexpr = False,
):
    if WARM:  # while the split kernel runs: the next product's weights into L2, this
        part = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) \
            * tl.num_programs(2) + tl.program_id(2)  # program's share
        parts = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        prefetch_span(warm, warm_bytes, part, parts, 128)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) + tl.arange(0, 1)  # one head: a [1, MERGE_C] tile
    c = tl.program_id(2) * MERGE_C + tl.arange(0, MERGE_C)
    active = num_splits  # splits past the row's keys wrote lse = -inf: they weigh 0
    if ACTIVE:  # ...and are not read. The positions are the split kernel's input.
        active = reached_splits(positions, t, num_splits, BLOCK_N)
    if PDL:  # launched early (programmatic dependent launch): wait for the split kernel
        tl.extra.cuda.gdc_wait()
    merge_tile(part_o, part_lse, out, t, h, h < heads, c, c < kv_lora, so_h, so_t, heads,
               kv_lora, num_splits, active, 1, MERGE_C, SPLITS_P2)


def merge_cols(kv_lora: int, splits: int) -> int:
    """MERGE_C of a merge tile: the widest column block (at least 32) whose [splits, columns]
    tile fits MERGE_TILE, so each program loads its partials at once."""
    mc = max(32, MERGE_TILE // triton.next_power_of_2(splits))
    return min(triton.next_power_of_2(mc), triton.next_power_of_2(kv_lora))


def launch_merge(block_n: int, part_o: Tensor, part_lse: Tensor, positions: Tensor, out: Tensor,
                 pdl: bool = False, warm: Tensor | None = None) -> None:
    """Merge the partials [tokens, heads, splits, kv_lora] into out [heads, tokens, kv_lora]
    (`block_n`: the split kernel's key block, from which it finds a row's active splits from
    ACTIVE_MIN_SPLITS splits on). `pdl`: launch as a programmatic dependent of the split
    kernel (sm90; it triggers it). `warm` (with `pdl`; contiguous, 16-byte aligned and
    sized): a tensor the merge prefetches into L2 before it waits, spread over its
    programs."""
    tokens, heads, splits, kv_lora = part_o.shape
    p2 = triton.next_power_of_2(splits)
    mc = merge_cols(kv_lora, splits)
    nbytes = warm.numel() * warm.element_size() if warm is not None else 0
    warm_ok = (pdl and warm is not None and warm.is_contiguous() and nbytes % 16 == 0
               and warm.data_ptr() % 16 == 0)
    _merge_kernel[(tokens, heads, triton.cdiv(kv_lora, mc))](
        part_o, part_lse, positions, out, warm if warm_ok else part_lse, nbytes if warm_ok else 0,
        out.stride(0), out.stride(1), heads, kv_lora, splits,
        MERGE_C=mc, SPLITS_P2=p2, PDL=pdl, BLOCK_N=block_n,
        ACTIVE=splits >= ACTIVE_MIN_SPLITS, WARM=warm_ok, num_warps=4,
        **({"launch_pdl": True} if pdl else {}))
