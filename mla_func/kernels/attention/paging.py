"""What the split-KV decode kernels (decode.py, decode_fp8.py) share: a program's keys, the
page lookups of its key tiles, its early start behind the absorb kernel, and the stores of
its results (a split's partials, or the output)."""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.attention.merge import split_chunk
from mla_func.kernels.launch.l2_prefetch import prefetch_rows


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def split_keys(token_seq, positions, t, split, num_splits, BLOCK_N: tl.constexpr):
    """(sequence, keys, first key, end) of query row t's split `split`: row t sees keys
    0..positions[t] of sequence token_seq[t], read on the device, cut into `num_splits`
    chunks of whole key tiles (`merge.split_chunk`); empty past the row's length."""
    seq = tl.load(token_seq + t).to(tl.int64)
    kv_len = tl.load(positions + t).to(tl.int32) + 1
    chunk = split_chunk(kv_len, num_splits, BLOCK_N)
    start = split * chunk
    return seq, kv_len, start, tl.minimum(start + chunk, kv_len)


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


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def early_wait(cache, pt, start, end, page_size, max_pages, s_row, hb,
               ROW_BYTES: tl.constexpr, L2_KEYS: tl.constexpr):
    """A split launched while the absorb kernel runs (`DecodePlan.early`): the batch's
    metadata and the old cache rows are ready, its q_lat, q_pe and new rows are not yet. The
    first head block warms L2 with up to L2_KEYS rows of its chunk (the other head blocks read
    the same rows), then every program waits for the absorb kernel's end."""
    if L2_KEYS > 0:
        if hb == 0:
            prefetch_rows(cache, pt, start, end, page_size, max_pages, s_row, ROW_BYTES,
                          L2_KEYS)
    tl.extra.cuda.gdc_wait()


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def store_lse(part_lse, base, m, lsum, hm):
    """A split's log2-sum-exp of its scores, per head; -inf from an empty split, which the
    merge weighs 0."""
    safe = tl.where(lsum > 0, lsum, 1.0)
    tl.store(part_lse + base, tl.where(lsum > 0, m + tl.log2(safe), float("-inf")), mask=hm)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def store_o(o, out, part_o, h, t, c, hm, cm, base, live, so_h, so_t, kv_lora,
            SPLIT: tl.constexpr):
    """A program's normalised values `o` (heads h, latent columns c of row t): SPLIT, to its
    split's partials (float32; `live`: none from a split past the row's keys), else to `out`
    in its dtype."""
    if SPLIT:
        tl.store(part_o + base[:, None] * kv_lora + c[None, :], o,
                 mask=(hm & live)[:, None] & cm[None, :])
    else:
        tl.store(out + h[:, None] * so_h + t * so_t + c[None, :],
                 o.to(out.dtype.element_ty), mask=hm[:, None] & cm[None, :])


__all__ = ["early_wait", "split_keys", "store_lse", "store_o", "tile_pages"]
