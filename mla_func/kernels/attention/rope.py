"""Fused MLA prologue: rope on q_pe and k_pe, RMSNorm on c_kv, and the [c_kv, k_pe] cache row.

One program per token replaces the ~24 small kernels of the reference path
(`ops.attention.prologue`). Interleaved-pair rope (DeepSeek's checkpoint layout): pair (a, b) at
(2i, 2i+1) becomes (a cos - b sin, b cos + a sin), with the angle position * inv_freq[2i] in
float32 and cos/sin scaled by YaRN's attention factor, as `ops.rope` computes it.

`prologue_row` is one token's work; `mla_prologue` launches it over the step's tokens (rows
returned), and the absorbed decode's fused launch (absorb.py) runs it with the token's cache row
as the destination: an FP8 cache row (`FP8`, `fp8_rows`) takes the row quantised, its values
first rounded to the input's dtype as the reference's row is before `cache_fp8.pack_rows`.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.kernels.attention.fp8_rows import rope_values, store_latent
from mla_func.kernels.e4m3 import to_bf16
from mla_func.kernels.linear.norm import rms_scaled


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def prologue_row(t, q_src, kv_ptr, w_ptr, pos_ptr, freq_ptr, q_pe_ptr, row_ptr, slot,
                 rope_scale, eps, heads, sq_t, sq_h, kv_stride, ROPE: tl.constexpr,
                 KV_LORA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                 FP8: tl.constexpr, GS: tl.constexpr, GROUPS: tl.constexpr,
                 ROPE_AT: tl.constexpr):
    """Token t: q_pe[t] = rope(q_src[t]) for every head (q_src: the unrotated q_pe, strides
    sq_t, sq_h), and the row [rmsnorm(c_kv), rope(k_pe)] of kv[t] stored at row_ptr, only
    where slot >= 0 (the token's cache slot: a padded token's, -1, is written nowhere). `FP8`:
    row_ptr is an FP8 cache row (`fp8_rows`: GS, GROUPS, ROPE_AT its layout)."""
    t = t.to(tl.int64)
    half = tl.arange(0, ROPE // 2)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    angle = pos * tl.load(freq_ptr + 2 * half)
    cos = tl.cos(angle) * rope_scale
    sin = tl.sin(angle) * rope_scale

    # c_kv: RMSNorm in float32, rounded to the input dtype, then scaled (as ops.norm).
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < KV_LORA
    c = tl.load(kv_ptr + t * kv_stride + cols, mask=cmask, other=0.0)
    cf = c.to(tl.float32)
    y = rms_scaled(cf, tl.sum(cf * cf, axis=0), KV_LORA, eps, w_ptr, cols, cmask, c.dtype)
    # k_pe: shared by all heads.
    k_row = kv_ptr + t * kv_stride + KV_LORA
    ke = tl.load(k_row + 2 * half).to(tl.float32)
    ko = tl.load(k_row + 2 * half + 1).to(tl.float32)
    rmask = (half * 0 + slot) >= 0
    k_even = ke * cos - ko * sin
    k_odd = ko * cos + ke * sin
    if FP8:
        store_latent(row_ptr, y.to(c.dtype).to(tl.float32), slot, BLOCK_C, GS, KV_LORA, GROUPS)
        pe = rope_values(row_ptr, ROPE_AT)
        tl.store(pe + 2 * half, to_bf16(k_even.to(c.dtype).to(tl.float32)), mask=rmask)
        tl.store(pe + 2 * half + 1, to_bf16(k_odd.to(c.dtype).to(tl.float32)), mask=rmask)
    else:
        dt = row_ptr.dtype.element_ty
        # A vector mask (the interpreter takes no scalar one).
        tl.store(row_ptr + cols, y.to(dt), mask=cmask & ((cols * 0 + slot) >= 0))
        tl.store(row_ptr + KV_LORA + 2 * half, k_even.to(dt), mask=rmask)
        tl.store(row_ptr + KV_LORA + 2 * half + 1, k_odd.to(dt), mask=rmask)

    # q_pe of every head, BLOCK_H heads at a time.
    for h0 in range(0, heads, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hmask = hs[:, None] < heads
        src = q_src + t * sq_t + hs[:, None] * sq_h + 2 * half[None, :]
        qe = tl.load(src, mask=hmask, other=0.0).to(tl.float32)
        qo = tl.load(src + 1, mask=hmask, other=0.0).to(tl.float32)
        dst = q_pe_ptr + (t * heads + hs[:, None]) * ROPE + 2 * half[None, :]
        qdt = q_pe_ptr.dtype.element_ty
        tl.store(dst, (qe * cos[None, :] - qo * sin[None, :]).to(qdt), mask=hmask)
        tl.store(dst + 1, (qo * cos[None, :] + qe * sin[None, :]).to(qdt), mask=hmask)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _prologue_kernel(q_src, kv_ptr, w_ptr, pos_ptr, freq_ptr, q_pe_ptr, kv_out_ptr,
                     rope_scale, eps, heads, sq_t, sq_h, kv_stride, ROPE: tl.constexpr,
                     KV_LORA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0)
    prologue_row(t, q_src, kv_ptr, w_ptr, pos_ptr, freq_ptr, q_pe_ptr,
                 kv_out_ptr + t.to(tl.int64) * (KV_LORA + ROPE), t, rope_scale, eps, heads,
                 sq_t, sq_h, kv_stride, ROPE, KV_LORA, BLOCK_H, BLOCK_C, False, 1, 1, 0)


def prologue_blocks(heads: int, kv_lora: int) -> dict:
    """The constexpr blocks of `prologue_row` (every launch that runs it)."""
    return dict(BLOCK_H=min(triton.next_power_of_2(heads), 16),
                BLOCK_C=triton.next_power_of_2(kv_lora))


def mla_prologue(
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    kv_norm: Float[Tensor, " kv_lora"],
    positions: Int[Tensor, " tokens"],
    inv_freq: Float[Tensor, " qk_rope"],
    rope_scale: float,
    eps: float,
) -> tuple[Float[Tensor, "tokens heads qk_rope"], Float[Tensor, "tokens latent"]]:
    """q_pe and kv (kv_a_proj output), unrotated -> (rotated q_pe, cache rows
    [rmsnorm(c_kv), rope(k_pe)]), as `ops.attention.prologue`. q_pe and kv may be strided
    views (parts of the fused input projection's output)."""
    tokens, heads, rope = q_pe.shape
    kv_lora = kv.shape[1] - rope
    q_src, q_pe = q_pe, torch.empty(tokens, heads, rope, dtype=q_pe.dtype, device=q_pe.device)
    kv_out = torch.empty(kv.shape, dtype=torch.promote_types(kv.dtype, kv_norm.dtype),
                         device=kv.device)
    if tokens:
        assert q_src.stride(2) == 1, "q_pe's last axis must be contiguous"
        kv = kv if kv.stride(1) == 1 else kv.contiguous()
        _prologue_kernel[(tokens,)](
            q_src, kv, kv_norm, positions, inv_freq, q_pe, kv_out, rope_scale, eps,
            heads, q_src.stride(0), q_src.stride(1), kv.stride(0), ROPE=rope, KV_LORA=kv_lora,
            **prologue_blocks(heads, kv_lora), num_warps=4)
    return q_pe, kv_out


__all__ = ["mla_prologue", "prologue_blocks", "prologue_row"]
