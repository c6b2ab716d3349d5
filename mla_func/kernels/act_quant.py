"""DeepSeek's act_quant for every block-FP8 GEMM: activations in e4m3 per token and group of
columns, a float32 scale a group (arXiv:2412.19437, 3.3; its inference code's `act_quant`).

The scale is amax / 448 (1 for an all-zero group) and the values x * (448 / amax)
(`e4m3.group_scales`: one division a group, not one an element), the bits of
`fp8.quantize_activations`. `quant_rows` quantises a tile inside a GEMM's K loop (the
experts' GEMMs); `quant_tokens` quantises x once, in one launch, before a GEMM that reads
e4m3 rows (the projections' GEMM past a few rows, the experts' `quant_x` / `quant_act`).

The cast to e4m3 rounds to nearest even on a GPU. Triton's interpreter (3.9) does not: its
float-to-fp8 conversion drops the carry of a mantissa that rounds up into the exponent and
truncates subnormals, so off CUDA the values are first rounded in float32 to e4m3's grid
(`ROUND`), so that the cast is exact.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Float8e4m3fn, Float32
from torch import Tensor

from mla_func.kernels.e4m3 import group_scales, round_e4m3


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def quant_rows(a, ROUND: tl.constexpr):
    """Each row of the [rows, group] tile `a` in e4m3 and its float32 scale: (e4m3 tile,
    [rows] scales)."""
    s, inv = group_scales(tl.max(tl.abs(a), axis=1).to(tl.float32))  # amax exact in a's dtype
    v = tl.minimum(tl.maximum(a.to(tl.float32) * inv[:, None], -448.0), 448.0)
    if ROUND:
        v = round_e4m3(v)
    return v.to(tl.float8e4nv), s


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _quant_tokens_kernel(x_ptr, q_ptr, s_ptr, n_tokens, n_hidden, stride_x, n_groups,
                         BLOCK_T: tl.constexpr, GROUP_K: tl.constexpr, ROUND: tl.constexpr):
    """BLOCK_T tokens' group `program_id(1)` (GROUP_K columns) by `quant_rows`: their e4m3
    values and scales."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    g = tl.program_id(1)
    k = g * GROUP_K + tl.arange(0, GROUP_K)
    ok = (t < n_tokens)[:, None] & (k < n_hidden)[None, :]
    t64 = t.to(tl.int64)
    a = tl.load(x_ptr + t64[:, None] * stride_x + k[None, :], mask=ok, other=0.0)
    q, s = quant_rows(a, ROUND)
    tl.store(q_ptr + t64[:, None] * n_hidden + k[None, :], q, mask=ok)
    tl.store(s_ptr + t64 * n_groups + g, s, mask=t < n_tokens)


def quant_tokens(x: Float[Tensor, "tokens width"], group: int
                 ) -> tuple[Float8e4m3fn[Tensor, "tokens width"],
                            Float32[Tensor, "tokens act_groups"]]:
    """(e4m3 values, float32 scales) of x (unit column stride) per token and `group`
    columns (the last group may be partial), the bits `quant_rows` gives inside a K loop."""
    tokens, width = x.shape
    groups = triton.cdiv(width, group)
    q = torch.empty(tokens, width, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(tokens, groups, dtype=torch.float32, device=x.device)
    if tokens:
        _quant_tokens_kernel[(triton.cdiv(tokens, 16), groups)](
            x, q, s, tokens, width, x.stride(0), groups, BLOCK_T=16, GROUP_K=group,
            ROUND=x.device.type != "cuda", num_warps=4)
    return q, s


__all__ = ["quant_rows", "quant_tokens"]
