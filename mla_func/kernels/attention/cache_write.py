"""Paged latent-cache write: cache[slot] = [c_kv, k_pe] for every new token with slot >= 0.

The cache holds only the compressed [c_kv, k_pe] row per token (DeepSeek-V2, arXiv:2405.04434,
2.1.3), in pages of `page_size` rows; `slot = page * page_size + offset`. Rows whose slot is -1
(padding of a captured bucket) write nothing at all, not even the scratch page, so a padded
replay can never disturb a live page. One program per token; the shape of the launch depends
only on tensor shapes, so the write is safe inside a CUDA graph.

An FP8 cache (`mla_func.cache_fp8`) is quantised on write: c_kv to e4m3 with its group
scales, k_pe to bf16 (`fp8_rows.store_latent`), the bytes `cache_fp8.pack_rows` writes.
"""

from typing import no_type_check

import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.cache_fp8 import is_fp8, pack_rows
from mla_func.kernels.attention.fp8_rows import rope_values, row_constexprs, store_latent
from mla_func.kernels.e4m3 import to_bf16
from mla_func.ops.attention import CacheLayer


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
def write_fp8_row(kv, cache, slots, t, stride_kv, stride_row, BLOCK_C: tl.constexpr,
                  BLOCK_R: tl.constexpr, ROPE: tl.constexpr, KV_LORA: tl.constexpr,
                  GS: tl.constexpr, GROUPS: tl.constexpr, ROPE_AT: tl.constexpr):
    """Token t's row quantised into the FP8 cache row at slots[t]; nothing when it is -1."""
    t = t.to(tl.int64)
    slot = tl.load(slots + t).to(tl.int64)
    row = cache + tl.maximum(slot, 0) * stride_row
    c = tl.arange(0, BLOCK_C)
    y = tl.load(kv + t * stride_kv + c, mask=c < KV_LORA, other=0.0).to(tl.float32)
    store_latent(row, y, slot, BLOCK_C, GS, KV_LORA, GROUPS)
    r = tl.arange(0, BLOCK_R)
    k_pe = tl.load(kv + t * stride_kv + KV_LORA + r, mask=r < ROPE, other=0.0)
    tl.store(rope_values(row, ROPE_AT) + r, to_bf16(k_pe.to(tl.float32)),
             mask=(r < ROPE) & ((r * 0 + slot) >= 0))


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _write_kernel(
    kv, cache, slots, stride_kv, stride_row, latent,
    BLOCK: tl.constexpr, FP8: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
    ROPE: tl.constexpr, KV_LORA: tl.constexpr, GS: tl.constexpr, GROUPS: tl.constexpr,
    ROPE_AT: tl.constexpr,
):
    if FP8:
        write_fp8_row(kv, cache, slots, tl.program_id(0), stride_kv, stride_row, BLOCK_C,
                      BLOCK_R, ROPE, KV_LORA, GS, GROUPS, ROPE_AT)
    else:
        write_row(kv, cache, slots, tl.program_id(0), stride_kv, stride_row, latent, BLOCK)


def write_row_args(
    cache: CacheLayer, kv_new: Float[Tensor, "tokens latent"]
) -> tuple[Tensor, int, int, int, int]:
    """What a launch that writes cache rows takes besides the slots (`write_row` here, the
    absorbed decode's prologue in absorb.py): kv_new with a contiguous last axis, its row
    stride, the cache's row stride (bytes, for an FP8 cache), latent and its block. Slots
    address flat rows, so the cache's pages must be contiguous runs of rows."""
    assert cache.stride(2) == 1 and cache.stride(0) == cache.shape[1] * cache.stride(1)
    kv_new = kv_new if kv_new.stride(-1) == 1 else kv_new.contiguous()
    latent = kv_new.shape[-1]
    return kv_new, kv_new.stride(0), cache.stride(1), latent, triton.next_power_of_2(latent)


def write_cache(
    cache: CacheLayer,
    kv_new: Float[Tensor, "tokens latent"],
    slot_mapping: Int[Tensor, " tokens"],
    kv_lora: int | None = None,
) -> None:
    """Write each token's latent row at its slot, in place; slot -1 rows write nothing. An
    FP8 cache takes the rows quantised (`kv_lora`: the c_kv values each row starts with)."""
    if kv_new.shape[0] == 0:
        return
    kv_new, stride_kv, stride_row, latent, block = write_row_args(cache, kv_new)
    fp8 = dict(BLOCK_C=1, BLOCK_R=1, ROPE=0, KV_LORA=0)  # a float cache's: unused
    if is_fp8(cache):
        if kv_lora is None:
            raise ValueError("writing an FP8 cache's rows needs kv_lora")
        fp8 = dict(BLOCK_C=triton.next_power_of_2(kv_lora), ROPE=latent - kv_lora,
                   BLOCK_R=triton.next_power_of_2(latent - kv_lora), KV_LORA=kv_lora)
    fp8.update(row_constexprs(cache, kv_lora, fp8["BLOCK_C"]))
    _write_kernel[(kv_new.shape[0],)](
        kv_new, cache, slot_mapping, stride_kv, stride_row, latent, BLOCK=block, **fp8,
        num_warps=4)


def reference_write(
    cache: CacheLayer,
    kv_new: Float[Tensor, "tokens latent"],
    slot_mapping: Int[Tensor, " tokens"],
    kv_lora: int | None = None,
) -> None:
    """What `write_cache` must do, in torch (tests): rows with slot -1 are dropped; an FP8
    cache takes `cache_fp8.pack_rows` of them."""
    keep = slot_mapping >= 0
    flat = cache.view(-1, cache.shape[-1])
    rows = kv_new[keep]
    rows = pack_rows(rows, kv_lora) if is_fp8(cache) else rows.to(cache.dtype)
    flat.index_copy_(0, slot_mapping[keep].long(), rows)


__all__ = ["reference_write", "write_cache", "write_fp8_row", "write_row", "write_row_args"]
