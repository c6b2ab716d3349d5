"""Params' block-FP8 projections built from DeepSeek's block-FP8 matrices.

DeepSeek-V3's checkpoints hold each linear layer as an HF matrix `[out, in]` in e4m3 with a
`weight_scale_inv` per 128 x 128 block. Params' layout (`params.py`) cuts and stacks those
matrices: `qkv_a_proj` from two matrices, gate over up, experts stacked, and a tensor-parallel
rank's slice of each. `kv_b_proj` is not among them: params hold its W_UK / W_UV, the absorbed
attention weights, in the float dtype (`fp8_params.ABSORBED`; `checkpoint._build` reads them
dequantised). Here each of those fields is built from a *source* of HF matrices, as (e4m3
data, per-element scale) pairs cut exactly as `checkpoint._build` cuts the float weights,
then packed (`fp8.pack`) on the grid the cuts allow: the checkpoint's block, or its largest
divisor that every cut lands on. Nothing is rescaled, so a field holds the checkpoint's bytes
and scales.

A source has `block` (rows, columns), `shapes` (key -> shape), `rope_perm` (None, or the
rope rows' permutation of a rope_interleave=False checkpoint) and `pair(key, rows, cols)`:
the two tensors of the matrix `key`, or of its `rows` x `cols` only. `checkpoint._Reader`
reads one from files; `quantize.quantize_fp8` quantizes params' own matrices into one.
"""

import math
from typing import Any

import torch
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.fp8 import FP8, Fp8Weight, pack
from mla_func.parallel.group import TensorParallel

Pair = tuple[Tensor, Tensor]  # (e4m3 data, its float32 scale per element), alike in shape


def _cat(*pairs: Pair) -> Pair:
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


def _rope_rows(src: Any, pair: Pair, heads: int, cfg: MLAConfig) -> Pair:
    """Each head's trailing qk_rope rows in the interleaved order (`checkpoint._build`)."""
    if src.rope_perm is None:
        return pair
    out = []
    for t in pair:
        t = t.reshape(heads, -1, t.shape[-1]).clone()
        rope = t[:, -cfg.qk_rope_head_dim:]
        rope.copy_(rope[:, src.rope_perm].clone())
        out.append(t.flatten(0, 1))
    return out[0], out[1]


def attention_fields(src: Any, a: str, cfg: MLAConfig, tp: TensorParallel,
                     device: torch.device) -> dict[str, Fp8Weight | None]:
    """`Attention`'s block-FP8 projections under the key prefix `a`, this rank's heads (all
    but W_UK / W_UV: the module docstring)."""
    c, (bo, bi) = cfg, src.block
    v, qk = c.v_head_dim, c.qk_head_dim
    mine = tp.part(c.num_attention_heads)
    heads = mine.stop - mine.start

    def per_head(width: int) -> slice:
        return slice(mine.start * width, mine.stop * width)

    lora = c.q_lora_rank is not None
    q = (src.pair(a + "q_a_proj.weight") if lora
         else _rope_rows(src, src.pair(a + "q_proj.weight", per_head(qk)), heads, c))
    kv_a = _rope_rows(src, src.pair(a + "kv_a_proj_with_mqa.weight"), 1, c)
    q_rows = q[0].shape[0]
    qkv = _cat(q, kv_a)
    qkv_a_proj = pack(*qkv, (math.gcd(bo, q_rows), bi), tuple(qkv[0].shape))
    o = src.pair(a + "o_proj.weight", None, per_head(v))
    o_proj = pack(*o, (bo, math.gcd(bi, heads * v)), (o[0].shape[0], heads, v))
    q_b_proj = None
    if lora:
        q_b = _rope_rows(src, src.pair(a + "q_b_proj.weight", per_head(qk)), heads, c)
        q_b_proj = pack(*q_b, (math.gcd(bo, heads * qk), bi), (heads, qk, q_b[0].shape[-1]))
    fields = dict(qkv_a_proj=qkv_a_proj, o_proj=o_proj, q_b_proj=q_b_proj)
    return {k: None if w is None else w.to(device) for k, w in fields.items()}


def mlp_fields(src: Any, prefix: str, tp: TensorParallel, device: torch.device
               ) -> tuple[Fp8Weight, Fp8Weight]:
    """(gate_up, down) of a dense MLP or the shared experts: this rank's share of the width."""
    (bo, bi), width = src.block, src.shapes[prefix + "gate_proj.weight"][0]
    inter = tp.part(width)
    n = inter.stop - inter.start
    gate_up = _stack(src.pair(prefix + "gate_proj.weight", inter),
                     src.pair(prefix + "up_proj.weight", inter))
    down = src.pair(prefix + "down_proj.weight", None, inter)
    return (pack(*gate_up, (math.gcd(bo, n), bi), tuple(gate_up[0].shape)).to(device),
            pack(*down, (bo, math.gcd(bi, n)), tuple(down[0].shape)).to(device))


def _stack(*pairs: Pair) -> Pair:
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def experts_fields(src: Any, m: str, cfg: MLAConfig, tp: TensorParallel, device: torch.device
                   ) -> tuple[Fp8Weight, Fp8Weight]:
    """(gate_up, down) of this rank's routed experts, filled one expert at a time (memory
    holds the result and one expert's matrices)."""
    mine, inter, h = tp.part(cfg.n_routed_experts), cfg.moe_intermediate_size, cfg.hidden_size
    e = mine.stop - mine.start
    gate_up = down = None
    for j in range(e):
        p = f"{m}experts.{mine.start + j}."
        parts = (pack(*_stack(src.pair(p + "gate_proj.weight"), src.pair(p + "up_proj.weight")),
                      src.block, (2, inter, h)),
                 pack(*src.pair(p + "down_proj.weight"), src.block, (h, inter)))
        if gate_up is None:
            gate_up, down = (_empty(w, e, device) for w in parts)
        for out, w in zip((gate_up, down), parts, strict=True):
            if w.block != out.block:  # a grid other than the first expert's: not stackable
                raise ValueError(f"{p}: its block-FP8 grid {w.block} differs from expert "
                                 f"{mine.start}'s {out.block}")
            n = w.data.shape[0]
            out.data[j * n:(j + 1) * n].copy_(w.data)
            out.scales[j * n:(j + 1) * n].copy_(w.scales)
    return gate_up, down


def _empty(w: Fp8Weight, experts: int, device: torch.device) -> Fp8Weight:
    """A weight of `experts` stacked copies of w's layout, unwritten."""
    n, rows, cols = w.data.shape
    return Fp8Weight(torch.empty(experts * n, rows, cols, dtype=FP8, device=device),
                     w.scales.new_empty(experts * n, *w.scales.shape[1:], device=device),
                     w.block, (experts, *w.shape))


__all__ = ["Pair", "attention_fields", "experts_fields", "mlp_fields"]
