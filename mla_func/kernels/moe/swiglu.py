"""SwiGLU (Shazeer 2020), down(silu(x W_gate^T) * (x W_up^T)), with the activation fused: two
cuBLAS GEMMs around one Triton kernel. Used for the shared experts of large MoE steps, where
they run apart from the routed ones (`moe_config.FUSE_SHARED_MAX_TOKENS`).

`ops.mlp.swiglu` (the reference) applies `F.silu(gate) * up` to the two column halves of one
GEMM output: two strided elementwise launches, 73 us at 4096 V2-Lite tokens on an H100
(docs/PERF.md), where moving the bytes takes about 23 us. `_silu_mul_kernel` reads each half
once and writes `act` once, rounding as the reference does: silu in fp32 rounded to the model
dtype, then the product in fp32 rounded again.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

BLOCK = 1024  # columns of `act` per program


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _silu_mul_kernel(gu_ptr, act_ptr, n_inter, stride_gu, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_inter
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + n_inter + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(act_ptr.dtype.element_ty).to(tl.float32)
    tl.store(act_ptr + row * n_inter + cols, (s * u).to(act_ptr.dtype.element_ty), mask=ok)


def silu_mul(gu: Float[Tensor, "tokens _"]) -> Float[Tensor, "tokens inter"]:
    """silu(gu[:, :inter]) * gu[:, inter:], one launch."""
    if gu.stride(-1) != 1 or gu.shape[1] % 2:
        raise ValueError(f"silu_mul takes [tokens, 2 * inter] with unit column stride, "
                         f"got shape {tuple(gu.shape)} strides {gu.stride()}")
    tokens, inter = gu.shape[0], gu.shape[1] // 2
    act = torch.empty(tokens, inter, dtype=gu.dtype, device=gu.device)
    if tokens:
        _silu_mul_kernel[(tokens, triton.cdiv(inter, BLOCK))](
            gu, act, inter, gu.stride(0), BLOCK=BLOCK, num_warps=4)
    return act


def swiglu(
    x: Float[Tensor, "tokens hidden"],
    gate_up: Float[Tensor, "2 inter hidden"],
    down: Float[Tensor, "hidden inter"],
    out: Float[Tensor, "tokens hidden"] | None = None,
) -> Float[Tensor, "tokens hidden"]:
    """`ops.mlp.swiglu` with the activation in one kernel; into `out` when given (the same
    GEMMs, the same bits)."""
    return torch.mm(silu_mul(x @ gate_up.flatten(0, 1).T), down.T, out=out)
