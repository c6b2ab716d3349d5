"""The experts' block-FP8 GEMMs in torch: the numerics of the Triton experts' FP8 form
(`kernels/moe/fp8_gemm.py`), the reference its tests compare with.

DeepSeek-V3's fine-grained quantisation (arXiv:2412.19437, 3.3), as its inference code runs it:
the weights in e4m3 with a float32 scale a block of rows x 128 columns (`fp8.Fp8Weight`), the
activations quantised per token in groups of 128 columns (`fp8.quantize_activations`: scale
amax / 448), each group's product of e4m3 values in fp32, scaled by the token's scale times the
weight row's and summed over the groups (`fp8_linear`). An expert (`expert_fp8`) rounds its
SwiGLU activation to x's dtype and quantises it again for the down product; each pair's result
is rounded to x's dtype, weighted in fp32 and rounded again, and a token's pairs add up in fp32
(the shared experts' output first where they run apart, their pairs last where folded in): the
kernels' order, so that the two differ only in the order of each group's fp32 sum.
"""

import torch
from jaxtyping import Float, Float8e4m3fn, Float32, Int
from torch import Tensor

from mla_func.fp8 import Fp8Weight, quantize_activations
from mla_func.params import DenseMLP

GROUP = 128  # columns a scale covers along K (`kernels.moe.config.FP8_BLOCK_K`)


def row_scales(w: Fp8Weight) -> Float32[Tensor, "stack width_out groups"]:
    """w's scales a row of its matrices and a group of GROUP columns (its blocks span GROUP
    columns, or one block all of them)."""
    _, rows, cols = w.data.shape
    if w.block[1] != GROUP and cols > min(w.block[1], GROUP):
        raise ValueError(f"blocks of {w.block[1]} columns: the FP8 GEMMs take {GROUP}")
    return w.scales.repeat_interleave(w.block[0], 1)[:, :rows]


def fp8_linear(x: Float[Tensor, "rows width_in"], w: Float8e4m3fn[Tensor, "width_out width_in"],
               scales: Float32[Tensor, "width_out groups"]) -> Float32[Tensor, "rows width_out"]:
    """x w^T in fp32: x quantised per token group, one scaled product a group."""
    q, s = quantize_activations(x, GROUP)
    acc = x.new_zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for g in range(s.shape[1]):
        cols = slice(g * GROUP, (g + 1) * GROUP)
        acc += (q[:, cols].float() @ w[:, cols].float().T) * (s[:, g, None] * scales[None, :, g])
    return acc


def expert_fp8(x: Float[Tensor, "rows hidden"],
               gate_up: Float8e4m3fn[Tensor, "2 inter hidden"],
               gate_up_scales: Float32[Tensor, "2 inter _blocks_in"],
               down: Float8e4m3fn[Tensor, "hidden inter"],
               down_scales: Float32[Tensor, "hidden _blocks_in"]
               ) -> Float32[Tensor, "rows hidden"]:
    """One expert's SwiGLU in block FP8, fp32 (its activation rounded to x's dtype)."""
    gate = fp8_linear(x, gate_up[0], gate_up_scales[0])
    up = fp8_linear(x, gate_up[1], gate_up_scales[1])
    act = (gate * torch.sigmoid(gate) * up).to(x.dtype)
    return fp8_linear(act, down, down_scales)


def experts_fp8(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Fp8Weight,
    down: Fp8Weight,
    shared: DenseMLP | None = None,
    fold: bool = True,
) -> Float[Tensor, "tokens hidden"]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) (+ the shared MLP, block FP8 too), with
    the Triton kernels' FP8 numerics (the module docstring). `fold`: the shared MLP as
    width / moe_inter experts of weight 1 (`kernels.moe.config.fold_shared`), else as one
    apart."""
    tokens, topk = ids.shape
    n_exp, _, inter, hidden = gate_up.shape
    gu, gu_s = gate_up.data.view(gate_up.shape), row_scales(gate_up).view(n_exp, 2, inter, -1)
    dn, dn_s = down.data, row_scales(down)
    pieces, extra = [], None  # the shared experts' pairs, or their output apart
    if shared is not None:
        s_gu, s_dn = shared.gate_up.data, shared.down.data[0]
        s_gu_s, s_dn_s = row_scales(shared.gate_up), row_scales(shared.down)[0]
        if not fold:
            extra = expert_fp8(x, s_gu, s_gu_s, s_dn, s_dn_s).to(x.dtype)
        elif inter % GROUP or s_dn.shape[1] % inter:
            raise ValueError(f"a shared MLP of {s_dn.shape[1]} columns folds into experts of "
                             f"{inter} only where they are whole groups of {GROUP}")
        else:
            for s in range(s_dn.shape[1] // inter):
                r, g = slice(s * inter, (s + 1) * inter), slice(s * inter // GROUP,
                                                                (s + 1) * inter // GROUP)
                pieces.append(expert_fp8(x, s_gu[:, r], s_gu_s[:, r], s_dn[:, r],
                                         s_dn_s[:, g]).to(x.dtype))
    pairs = x.new_zeros(tokens, topk, hidden)
    for e in range(n_exp):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            y = expert_fp8(x[t], gu[e], gu_s[e], dn[e], dn_s[e]).to(x.dtype)
            pairs[t, j] = (y.float() * weights[t, j, None]).to(x.dtype)
    acc = x.new_zeros(tokens, hidden, dtype=torch.float32)
    if extra is not None:
        acc += extra.float()
    for row in [pairs[:, j] for j in range(topk)] + pieces:
        acc += row.float()
    return acc.to(x.dtype)


__all__ = ["GROUP", "expert_fp8", "experts_fp8", "fp8_linear", "row_scales"]
