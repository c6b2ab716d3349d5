"""Fused MLA prologue: rope on q_pe and k_pe, RMSNorm on c_kv, and the [c_kv, k_pe] cache row.

One program per token replaces the ~24 small kernels of the reference path (ops/norm.py,
ops/rope.py, torch.cat). Interleaved-pair rope (DeepSeek's checkpoint layout): pair (a, b) at
(2i, 2i+1) becomes (a cos - b sin, b cos + a sin), with the angle position * inv_freq[2i] in
float32 and cos/sin scaled by YaRN's attention factor, as `ops.rope` computes it.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _prologue_kernel(q_ptr, kv_ptr, w_ptr, pos_ptr, freq_ptr, q_pe_ptr, kv_out_ptr,
                     rope_scale, eps, heads, q_stride, kv_stride, NOPE: tl.constexpr,
                     ROPE: tl.constexpr, KV_LORA: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
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
    rstd = 1.0 / tl.sqrt(tl.sum(cf * cf, axis=0) / KV_LORA + eps)
    normed = (cf * rstd).to(c.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    out_row = kv_out_ptr + t * (KV_LORA + ROPE)
    tl.store(out_row + cols, (w * normed).to(kv_out_ptr.dtype.element_ty), mask=cmask)

    # k_pe: shared by all heads.
    k_row = kv_ptr + t * kv_stride + KV_LORA
    ke = tl.load(k_row + 2 * half).to(tl.float32)
    ko = tl.load(k_row + 2 * half + 1).to(tl.float32)
    dt = kv_out_ptr.dtype.element_ty
    tl.store(out_row + KV_LORA + 2 * half, (ke * cos - ko * sin).to(dt))
    tl.store(out_row + KV_LORA + 2 * half + 1, (ko * cos + ke * sin).to(dt))

    # q_pe of every head, BLOCK_H heads at a time.
    for h0 in range(0, heads, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hmask = hs[:, None] < heads
        src = q_ptr + t * q_stride + hs[:, None] * (NOPE + ROPE) + NOPE + 2 * half[None, :]
        qe = tl.load(src, mask=hmask, other=0.0).to(tl.float32)
        qo = tl.load(src + 1, mask=hmask, other=0.0).to(tl.float32)
        dst = q_pe_ptr + (t * heads + hs[:, None]) * ROPE + 2 * half[None, :]
        qdt = q_pe_ptr.dtype.element_ty
        tl.store(dst, (qe * cos[None, :] - qo * sin[None, :]).to(qdt), mask=hmask)
        tl.store(dst + 1, (qo * cos[None, :] + qe * sin[None, :]).to(qdt), mask=hmask)


@torch.library.custom_op("mla_func::mla_prologue", mutates_args=())
def mla_prologue(q: Tensor, kv: Tensor, kv_norm: Tensor, positions: Tensor, inv_freq: Tensor,
                 rope_scale: float, eps: float, qk_nope: int) -> tuple[Tensor, Tensor]:
    """q [tokens, heads, qk_head], kv [tokens, latent] (kv_a_proj output) ->
    (rotated q_pe [tokens, heads, qk_rope], cache rows [tokens, latent]). q and kv may be
    row-strided views (the two parts of the fused input projection's output)."""
    tokens, heads, qk_head = q.shape
    rope = qk_head - qk_nope
    kv_lora = kv.shape[1] - rope
    q_pe = torch.empty(tokens, heads, rope, dtype=q.dtype, device=q.device)
    kv_out = torch.empty(kv.shape, dtype=torch.promote_types(kv.dtype, kv_norm.dtype),
                         device=kv.device)
    if tokens:
        assert q.stride(2) == 1 and q.stride(1) == qk_head, "q rows must be [heads, qk_head]"
        kv = kv if kv.stride(1) == 1 else kv.contiguous()
        _prologue_kernel[(tokens,)](
            q, kv, kv_norm, positions, inv_freq, q_pe, kv_out, rope_scale, eps,
            heads, q.stride(0), kv.stride(0), NOPE=qk_nope, ROPE=rope, KV_LORA=kv_lora,
            BLOCK_H=min(triton.next_power_of_2(heads), 16),
            BLOCK_C=triton.next_power_of_2(kv_lora), num_warps=4)
    return q_pe, kv_out


@mla_prologue.register_fake
def _(q, kv, kv_norm, positions, inv_freq, rope_scale, eps, qk_nope):
    tokens, heads, qk_head = q.shape
    q_pe = q.new_empty(tokens, heads, qk_head - qk_nope)
    kv_out = torch.empty(kv.shape, dtype=torch.promote_types(kv.dtype, kv_norm.dtype),
                         device=kv.device)
    return q_pe, kv_out
