"""Page-table lookups of the split-KV decode kernels (decode.py, decode_fp8.py)."""

from typing import no_type_check

import triton
import triton.language as tl


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


__all__ = ["tile_pages"]
