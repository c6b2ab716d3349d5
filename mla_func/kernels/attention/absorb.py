"""The absorbed decode's prologue in one launch: query absorption, rope, latent norm, cache write.

q_lat[h, t] = q_nope[t, h] . W_UK[h] (DeepSeek-V2, arXiv:2405.04434, appendix C: W_UK is
absorbed into the query, so scores are taken against the cached latent c_kv directly), and the
new tokens' prologue (`rope.prologue_row`): q_pe rotated, and cache[slot[t]] = [rmsnorm(c_kv),
rope(k_pe)] of the input projection's output (slot -1 writes nothing). Run apart (a cuBLAS bmm,
the prologue kernel, the cache write) they cost three kernels and their launch gaps per layer
at small batch; q_nope does not go through the prologue, so one grid holds both halves.

Grid (one axis, a function of tensor shapes only, so the launch is safe inside a CUDA graph):
programs [0, heads * col_blocks * token_blocks) each own one head, one block of BLOCK_C kv_lora
columns and up to ROWS tokens; the token block is the fastest-varying, so programs that read
the same W_UK tile run next to each other and share it through L2. Each loads its W_UK tile
once and loops over its tokens BLOCK_T at a time (fp32 accumulation, stored in q_lat's dtype).
The last `tokens` programs each run one token's prologue (an FP8 cache's rows quantised on
write: `rope.prologue_row`).
"""

from dataclasses import dataclass
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.cache_fp8 import is_fp8
from mla_func.fp8 import Fp8Weight
from mla_func.kernels.attention.cache_write import write_row_args
from mla_func.kernels.attention.fp8_rows import (
    row_constexprs,
    weight_args,
    weight_scales,
    weight_tile,
)
from mla_func.kernels.attention.rope import prologue_blocks, prologue_row
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.ops.attention import CacheLayer

BLOCK_T = 16  # tl.dot's smallest M
ROWS = 64  # tokens per absorb program: one W_UK tile load serves up to ROWS / BLOCK_T dots
BLOCK_C = 128  # kv_lora columns per absorb program


@dataclass(frozen=True)
class NewRows:
    """The step's new tokens as the input projection leaves them, and what their prologue
    needs to turn them into a rotated q_pe and cache rows (`ops.attention.prologue`)."""

    q_pe: Float[Tensor, "tokens heads qk_rope"]  # unrotated; may be a strided view of q
    kv: Float[Tensor, "tokens latent"]  # [c_kv, k_pe] before the norm and the rope
    slot_mapping: Int[Tensor, " tokens"]
    positions: Int[Tensor, " tokens"]
    kv_norm: Float[Tensor, " kv_lora"]
    inv_freq: Float[Tensor, " qk_rope"]
    rope_scale: float
    eps: float


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _absorb_prologue_kernel(
    q_nope, w_uk, q_lat, q_src, q_pe, kv, cache, slots, positions, kv_norm, inv_freq,
    sn_t, sn_h, sw_h, sw_k, sl_h, sl_t, sq_t, sq_h, stride_kv, stride_row, rope_scale, eps,
    tokens, heads, qk_nope, col_blocks, token_blocks, uk_s, ss_h, ss_r, block_rows,
    block_cols, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    ROPE: tl.constexpr, KV_LORA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr,
    ROWS: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr, GS: tl.constexpr,
    GROUPS: tl.constexpr, ROPE_AT: tl.constexpr, PDL: tl.constexpr = False,
    W8: tl.constexpr = 0,
):
    if PDL:  # the split kernel may launch now: it warms L2 with old cache rows, then waits
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    absorb_programs = tl.num_programs(0) - tokens
    if pid < absorb_programs:
        tb = pid % token_blocks
        cb = (pid // token_blocks) % col_blocks
        h = (pid // (token_blocks * col_blocks)).to(tl.int64)
        k = tl.arange(0, BLOCK_K)
        c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        km = k < qk_nope
        cm = c < KV_LORA
        dtype = q_lat.dtype.element_ty  # what the bmm it replaces multiplied in
        w = tl.load(w_uk + h * sw_h + k[:, None] * sw_k + c[None, :],
                    mask=km[:, None] & cm[None, :], other=0.0)
        # Block FP8 (W8): dequantised to the query's dtype, `fp8.dequantize`'s bits.
        ws = weight_scales(uk_s, h, k, c, km, cm, ss_h, ss_r, block_rows, block_cols, W8)
        w = weight_tile(w, ws, q_nope.dtype.element_ty, W8).to(dtype)
        t0 = tb * ROWS
        for ts in range(t0, tl.minimum(t0 + ROWS, tokens), BLOCK_T):
            t = (ts + tl.arange(0, BLOCK_T)).to(tl.int64)
            tm = t < tokens
            q = tl.load(q_nope + t[:, None] * sn_t + h * sn_h + k[None, :],
                        mask=tm[:, None] & km[None, :], other=0.0).to(dtype)
            acc = tl.dot(q, w, input_precision=PRECISION)
            tl.store(q_lat + h * sl_h + t[:, None] * sl_t + c[None, :], acc.to(dtype),
                     mask=tm[:, None] & cm[None, :])
    else:
        t = pid - absorb_programs
        slot = tl.load(slots + t).to(tl.int64)
        row = cache + tl.maximum(slot, 0) * stride_row
        prologue_row(t, q_src, kv, kv_norm, positions, inv_freq, q_pe, row, slot,
                     rope_scale, eps, heads, sq_t, sq_h, stride_kv, ROPE, KV_LORA, BLOCK_H,
                     BLOCK_L, FP8, GS, GROUPS, ROPE_AT)


def absorb_launch(q_nope: Float[Tensor, "tokens heads qk_nope"],
                  w_uk: Float[Tensor, "heads qk_nope kv_lora"] | Fp8Weight,
                  q_lat: Float[Tensor, "heads tokens kv_lora"],
                  cache: CacheLayer,
                  new: NewRows, q_pe: Float[Tensor, "tokens heads qk_rope"],
                  block_c: int = BLOCK_C) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the fused kernel (the sm90 compile test reads
    the same)."""
    tokens, heads, qk_nope = q_nope.shape
    kv_lora = w_uk.shape[-1]
    w_uk, fp8, w8 = weight_args(w_uk)
    rope = new.q_pe.shape[-1]
    # Column offsets are added unscaled: every innermost dimension must be contiguous.
    for t in (q_nope, w_uk, q_lat, new.q_pe, q_pe):
        assert t.stride(-1) == 1
    assert q_pe.is_contiguous() and new.kv.shape[-1] == kv_lora + rope
    assert is_fp8(cache) or cache.shape[-1] == kv_lora + rope
    kv, stride_kv, stride_row, _, _ = write_row_args(cache, new.kv)
    block_c = min(block_c, max(16, triton.next_power_of_2(kv_lora)))
    col_blocks = triton.cdiv(kv_lora, block_c)
    token_blocks = triton.cdiv(tokens, ROWS)
    args = (q_nope, w_uk, q_lat, new.q_pe, q_pe, kv, cache, new.slot_mapping, new.positions,
            new.kv_norm, new.inv_freq,
            q_nope.stride(0), q_nope.stride(1), w_uk.stride(0), w_uk.stride(1),
            q_lat.stride(0), q_lat.stride(1), new.q_pe.stride(0), new.q_pe.stride(1),
            stride_kv, stride_row, new.rope_scale, new.eps,
            tokens, heads, qk_nope, col_blocks, token_blocks, *fp8)
    blocks = prologue_blocks(heads, kv_lora)
    kwargs = dict(
        BLOCK_T=BLOCK_T, BLOCK_K=max(16, triton.next_power_of_2(qk_nope)), BLOCK_C=block_c,
        ROPE=rope, KV_LORA=kv_lora, BLOCK_H=blocks["BLOCK_H"], BLOCK_L=blocks["BLOCK_C"],
        ROWS=ROWS, PRECISION="ieee" if q_lat.dtype == torch.float32 else "tf32",
        PDL=pdl_supported(q_lat.device), W8=w8, num_warps=4,
        **row_constexprs(cache, kv_lora, blocks["BLOCK_C"]))
    return (heads * col_blocks * token_blocks + tokens,), args, kwargs


def absorb_prologue(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"] | Fp8Weight,
    q_lat: Float[Tensor, "heads tokens kv_lora"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: CacheLayer,
    new: NewRows,
) -> tuple[Float[Tensor, "heads tokens kv_lora"], Float[Tensor, "tokens heads qk_rope"]]:
    """q_lat[h, t] = q_nope[t, h] . w_uk[h] (fp32 accumulation, multiplied and stored in
    q_lat's dtype), q_pe = new.q_pe rotated, and the new rows' cache write, in one launch;
    (q_lat, q_pe) are returned. q_nope may be a strided view (a slice of the projected q).
    A block-FP8 w_uk is read as e4m3, each tile dequantised to q_nope's dtype as loaded."""
    if q_nope.shape[0] == 0:
        return q_lat, q_pe
    grid, args, kwargs = absorb_launch(q_nope, w_uk, q_lat, cache, new, q_pe)
    _absorb_prologue_kernel[grid](*args, **kwargs)
    return q_lat, q_pe


def reference_absorb(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    dtype: torch.dtype,
) -> Float[Tensor, "heads tokens kv_lora"]:
    """What the absorb half computes, in torch (tests; the bmm the fused launch replaces)."""
    return torch.bmm(q_nope.transpose(0, 1).to(dtype), w_uk.to(dtype))


__all__ = ["NewRows", "absorb_launch", "absorb_prologue", "reference_absorb"]
