"""Warm L2 with what a program, or the launch after it, is about to read (sm90: bulk
prefetches, `cp.async.bulk.prefetch.L2.global`, PTX ISA 8.0).

Used by the absorbed MLA decode's kernels while they wait for the launch before them (PDL,
`kernels/launch/pdl.py`): the split kernel while the absorb + prologue kernel that writes the query
and the new cache rows leaves the memory system idle for a few microseconds (the rows the
split reads first are the only thing that does not depend on it: `prefetch_rows`), and the
merge while the split kernel runs, below copy bandwidth, warming the W_UV weights of the
product after it (`prefetch_span`). A prefetch only fetches into L2; it reads no register
and writes nothing, so a row rewritten by the kernel before (the new row) is still read
afterwards from L2, the point of coherence, with its new bytes. Off sm90 (the interpreter
included) the callers compile these out.
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _bulk_prefetch(at, size):
    """One bulk prefetch into L2 per element: `size` bytes (int32, a multiple of 16) from the
    16-byte aligned address `at`; elements of size 0 issue nothing."""
    tl.inline_asm_elementwise(
        "{\n .reg .pred p;\n setp.gt.s32 p, $2, 0;\n"
        " @p cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;\n}",
        "=r,l,r", [at, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def prefetch_rows(cache, pt, start, end, page_size, max_pages, s_row,
                  ROW_BYTES: tl.constexpr, KEYS: tl.constexpr):
    """Bulk-prefetch rows start .. min(start + KEYS, end) of one sequence's paged cache (`pt`:
    its page-table row) into L2, one row per element. ROW_BYTES: the bytes of a cache row,
    a multiple of 16. Rows past `end` issue nothing."""
    n = start + tl.arange(0, KEYS)
    live = n < end
    slot = n // page_size
    page = tl.load(pt + slot, mask=live & (slot < max_pages), other=0)
    row = cache + (page.to(tl.int64) * page_size + n % page_size) * s_row
    _bulk_prefetch(row, tl.where(live, ROW_BYTES, 0))


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def prefetch_span(base, nbytes, part, parts, THREADS: tl.constexpr):
    """Bulk-prefetch share `part` of `parts` of the `nbytes` bytes at `base` (16-byte aligned,
    nbytes a multiple of 16) into L2: THREADS slices of 16-byte units, one per element."""
    units = tl.cdiv(nbytes, 16)
    per = tl.cdiv(units, parts * THREADS) * 16  # bytes a slice
    offset = (part * THREADS + tl.arange(0, THREADS)).to(tl.int64) * per
    size = tl.minimum(per, nbytes - offset).to(tl.int32)
    live = size > 0
    at = base.to(tl.pointer_type(tl.int8)) + tl.where(live, offset, 0)
    _bulk_prefetch(at, tl.where(live, size, 0))
