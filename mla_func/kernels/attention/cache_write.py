"""Paged latent-cache write: cache[slot] = [c_kv, k_pe] for every new token with slot >= 0.

The cache holds only the compressed [c_kv, k_pe] row per token (DeepSeek-V2, arXiv:2405.04434,
2.1.3), in pages of `page_size` rows; `slot = page * page_size + offset`. Rows whose slot is -1
(padding of a captured bucket) write nothing at all, not even the scratch page, so a padded
replay can never disturb a live page. One program per token; the shape of the launch depends
only on tensor shapes, so the write is safe inside a CUDA graph.
"""

from typing import no_type_check

import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def write_row(kv, cache, slots, t, stride_kv, stride_row, latent, BLOCK: tl.constexpr):
    """Token t's row to cache[slots[t]]; nothing when the slot is -1."""
    slot = tl.load(slots + t).to(tl.int64)
    d = tl.arange(0, BLOCK)
    mask = (d < latent) & ((d * 0 + slot) >= 0)
    row = tl.load(kv + t.to(tl.int64) * stride_kv + d, mask=mask, other=0.0)
    tl.store(cache + slot * stride_row + d, row.to(cache.dtype.element_ty), mask=mask)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _write_kernel(
    kv, cache, slots, stride_kv, stride_row, latent,
    BLOCK: tl.constexpr,
):
    write_row(kv, cache, slots, tl.program_id(0), stride_kv, stride_row, latent, BLOCK)


def write_row_args(
    cache: Float[Tensor, "pages page_size latent"], kv_new: Float[Tensor, "tokens latent"]
) -> tuple[Tensor, int, int, int, int]:
    """What a launch that writes cache rows takes besides the slots (`write_row` here, the
    absorbed decode's prologue in absorb.py): kv_new with a contiguous last axis, its row
    stride, the cache's row stride, latent and its block. Slots address flat rows, so the
    cache's pages must be contiguous runs of rows."""
    assert cache.stride(2) == 1 and cache.stride(0) == cache.shape[1] * cache.stride(1)
    kv_new = kv_new if kv_new.stride(-1) == 1 else kv_new.contiguous()
    latent = cache.shape[-1]
    return kv_new, kv_new.stride(0), cache.stride(1), latent, triton.next_power_of_2(latent)


def write_cache(
    cache: Float[Tensor, "pages page_size latent"],
    kv_new: Float[Tensor, "tokens latent"],
    slot_mapping: Int[Tensor, " tokens"],
) -> None:
    """Write each token's latent row at its slot, in place; slot -1 rows write nothing."""
    if kv_new.shape[0] == 0:
        return
    kv_new, stride_kv, stride_row, latent, block = write_row_args(cache, kv_new)
    _write_kernel[(kv_new.shape[0],)](
        kv_new, cache, slot_mapping, stride_kv, stride_row, latent, BLOCK=block, num_warps=4,
    )


def reference_write(
    cache: Float[Tensor, "pages page_size latent"],
    kv_new: Float[Tensor, "tokens latent"],
    slot_mapping: Int[Tensor, " tokens"],
) -> None:
    """What `write_cache` must do, in torch (tests): rows with slot -1 are dropped."""
    keep = slot_mapping >= 0
    flat = cache.view(-1, cache.shape[-1])
    flat.index_copy_(0, slot_mapping[keep].long(), kv_new[keep].to(cache.dtype))


__all__ = ["reference_write", "write_cache", "write_row", "write_row_args"]
