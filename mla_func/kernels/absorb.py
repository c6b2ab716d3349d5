"""Query absorption and the paged cache write in one launch (the absorbed decode's prologue).

q_lat[h, t] = q_nope[t, h] . W_UK[h] (DeepSeek-V2, arXiv:2405.04434, appendix C: W_UK is
absorbed into the query, so scores are taken against the cached latent c_kv directly), and
cache[slot[t]] = kv_new[t] exactly as `cache_write.write_cache` does (slot -1 writes nothing).
Run as two launches (a cuBLAS bmm and the write) they cost two kernels and a launch gap per
layer at small batch; the two are independent, so one grid holds both.

Grid (one axis, a function of tensor shapes only, so the launch is safe inside a CUDA graph):
programs [0, heads * col_blocks * token_blocks) each own one head, one block of BLOCK_C kv_lora
columns and up to ROWS tokens; the token block is the fastest-varying, so programs that read
the same W_UK tile run next to each other and share it through L2. Each loads its W_UK tile
once and loops over its tokens BLOCK_T at a time (fp32 accumulation, stored in q_lat's dtype).
The last `tokens` programs each write one cache row (`cache_write.write_row`).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.kernels.cache_write import write_row, write_row_args

BLOCK_T = 16  # tl.dot's smallest M
ROWS = 64  # tokens per absorb program: one W_UK tile load serves up to ROWS / BLOCK_T dots
BLOCK_C = 128  # kv_lora columns per absorb program


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _absorb_write_kernel(
    q_nope, w_uk, q_lat, kv, cache, slots,
    sn_t, sn_h, sw_h, sw_k, sl_h, sl_t, stride_kv, stride_row,
    tokens, qk_nope, kv_lora, latent, col_blocks, token_blocks,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    absorb_programs = tl.num_programs(0) - tokens
    if pid < absorb_programs:
        tb = pid % token_blocks
        cb = (pid // token_blocks) % col_blocks
        h = (pid // (token_blocks * col_blocks)).to(tl.int64)
        k = tl.arange(0, BLOCK_K)
        c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        km = k < qk_nope
        cm = c < kv_lora
        dtype = q_lat.dtype.element_ty  # what the bmm it replaces multiplied in
        w = tl.load(w_uk + h * sw_h + k[:, None] * sw_k + c[None, :],
                    mask=km[:, None] & cm[None, :], other=0.0).to(dtype)
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
        write_row(kv, cache, slots, pid - absorb_programs, stride_kv, stride_row, latent,
                  BLOCK_W)


def absorb_launch(q_nope, w_uk, q_lat, cache, kv_new, slot_mapping,
                  block_c=BLOCK_C) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the fused kernel (the sm90 compile test reads
    the same)."""
    tokens, heads, qk_nope = q_nope.shape
    kv_lora = w_uk.shape[-1]
    # Column offsets are added unscaled: every innermost dimension must be contiguous.
    assert q_nope.stride(-1) == 1 and w_uk.stride(-1) == 1 and q_lat.stride(-1) == 1
    kv_new, stride_kv, stride_row, latent, block_w = write_row_args(cache, kv_new)
    block_c = min(block_c, max(16, triton.next_power_of_2(kv_lora)))
    col_blocks = triton.cdiv(kv_lora, block_c)
    token_blocks = triton.cdiv(tokens, ROWS)
    args = (q_nope, w_uk, q_lat, kv_new, cache, slot_mapping,
            q_nope.stride(0), q_nope.stride(1), w_uk.stride(0), w_uk.stride(1),
            q_lat.stride(0), q_lat.stride(1), stride_kv, stride_row,
            tokens, qk_nope, kv_lora, latent, col_blocks, token_blocks)
    kwargs = dict(
        BLOCK_T=BLOCK_T, BLOCK_K=max(16, triton.next_power_of_2(qk_nope)), BLOCK_C=block_c,
        BLOCK_W=block_w, ROWS=ROWS,
        PRECISION="ieee" if q_lat.dtype == torch.float32 else "tf32", num_warps=4)
    return (heads * col_blocks * token_blocks + tokens,), args, kwargs


def absorb_and_write(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    q_lat: Float[Tensor, "heads tokens kv_lora"],
    cache: Float[Tensor, "pages page_size latent"],
    kv_new: Float[Tensor, "tokens latent"],
    slot_mapping: Int[Tensor, " tokens"],
) -> Float[Tensor, "heads tokens kv_lora"]:
    """q_lat[h, t] = q_nope[t, h] . w_uk[h] (fp32 accumulation, multiplied and stored in
    q_lat's dtype) and `write_cache(cache, kv_new, slot_mapping)`, in one launch; q_lat is
    returned. q_nope may be a strided view (a slice of the projected q)."""
    if q_nope.shape[0] == 0:
        return q_lat
    grid, args, kwargs = absorb_launch(q_nope, w_uk, q_lat, cache, kv_new, slot_mapping)
    _absorb_write_kernel[grid](*args, **kwargs)
    return q_lat


def reference_absorb(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    dtype: torch.dtype,
) -> Float[Tensor, "heads tokens kv_lora"]:
    """What the absorb half computes, in torch (tests; the bmm the fused launch replaces)."""
    return torch.bmm(q_nope.transpose(0, 1).to(dtype), w_uk.to(dtype))


__all__ = ["absorb_and_write", "absorb_launch", "reference_absorb"]
