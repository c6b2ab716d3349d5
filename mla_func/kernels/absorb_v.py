"""The absorbed decode's epilogue: the value up-projection o = o_lat . W_UV^T per head.

o[t, h] = o_lat[h, t] . W_UV[h]^T (DeepSeek-V2, arXiv:2405.04434, appendix C: W_UV is absorbed
into the output side, so attention averages the cached latent c_kv and only its result is
projected up to v_head). It replaces a cuBLAS bmm with a strided output, built like absorb.py's
absorb half and sharing its per-head product (`head_tile`, `rows_times_tile`).

Grid (one axis, a function of tensor shapes only, so the launch is safe inside a CUDA graph):
heads * col_blocks * token_blocks programs, each owning one head, one block of BLOCK_V v_head
columns and up to ROWS tokens (the token block varies fastest: programs that read the same
weight tile run next to each other). Each loads its [BLOCK_V, kv_lora] rows of W_UV[h] once
and loops over its tokens BLOCK_T at a time (fp32 accumulation), storing straight into o's
[tokens, heads, v_head] layout, which o_proj reads flattened without a transposing copy.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from mla_func.kernels.absorb import BLOCK_T, ROWS, head_tile, rows_times_tile

# v_head columns per program: at 16 heads and one token, v_head 128 makes 64 programs, each
# reading 32 KB of bf16 weights.
BLOCK_V = 32


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _absorb_v_kernel(
    o_lat, w_uv, o, sl_h, sl_t, sw_h, sw_v, so_t, so_h,
    tokens, kv_lora, v_head, col_blocks, token_blocks,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr, PRECISION: tl.constexpr,
):
    h, vb, tb = head_tile(tl.program_id(0), col_blocks, token_blocks)
    c = tl.arange(0, BLOCK_K)
    v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    cm = c < kv_lora
    vm = v < v_head
    dtype = o_lat.dtype.element_ty  # what the bmm it replaces multiplied in
    # Rows of W_UV[h] (kv_lora contiguous), used as the [kv_lora, BLOCK_V] operand.
    w = tl.load(w_uv + h * sw_h + v[:, None] * sw_v + c[None, :],
                mask=vm[:, None] & cm[None, :], other=0.0).to(dtype)
    rows_times_tile(o_lat + h * sl_h, sl_t, o + h * so_h, so_t, tl.trans(w), c, cm, v, vm,
                    tb * ROWS, tokens, BLOCK_T, ROWS, PRECISION)


def absorb_v_launch(o_lat, w_uv, o, block_v=BLOCK_V) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the kernel (the sm90 compile test reads the
    same)."""
    heads, tokens, kv_lora = o_lat.shape
    v_head = w_uv.shape[1]
    # Column offsets are added unscaled: every innermost dimension must be contiguous.
    assert o_lat.stride(-1) == 1 and w_uv.stride(-1) == 1 and o.stride(-1) == 1
    block_v = min(block_v, max(16, triton.next_power_of_2(v_head)))  # tl.dot's smallest N
    col_blocks = triton.cdiv(v_head, block_v)
    token_blocks = triton.cdiv(tokens, ROWS)
    args = (o_lat, w_uv, o, o_lat.stride(0), o_lat.stride(1), w_uv.stride(0), w_uv.stride(1),
            o.stride(0), o.stride(1), tokens, kv_lora, v_head, col_blocks, token_blocks)
    kwargs = dict(
        BLOCK_T=BLOCK_T, BLOCK_K=max(16, triton.next_power_of_2(kv_lora)), BLOCK_V=block_v,
        ROWS=ROWS, PRECISION="ieee" if o_lat.dtype == torch.float32 else "tf32", num_warps=4)
    return (heads * col_blocks * token_blocks,), args, kwargs


def absorb_v(
    o_lat: Float[Tensor, "heads tokens kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    o: Float[Tensor, "tokens heads v_head"],
) -> Float[Tensor, "tokens heads v_head"]:
    """o[t, h] = o_lat[h, t] . w_uv[h]^T (fp32 accumulation, multiplied in o_lat's dtype,
    stored in o's); o is returned."""
    if o_lat.shape[1] == 0:
        return o
    grid, args, kwargs = absorb_v_launch(o_lat, w_uv, o)
    _absorb_v_kernel[grid](*args, **kwargs)
    return o


def reference_absorb_v(
    o_lat: Float[Tensor, "heads tokens kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    dtype: torch.dtype,
) -> Float[Tensor, "tokens heads v_head"]:
    """What the kernel computes, in torch (tests; the bmm it replaces)."""
    return torch.bmm(o_lat.to(dtype), w_uv.to(dtype).transpose(1, 2)).transpose(0, 1)


__all__ = ["absorb_v", "absorb_v_launch", "reference_absorb_v"]
