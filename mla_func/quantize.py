"""`quantize_fp8(params, block=128)`: params' projections in DeepSeek-V3's block FP8, and
`dequantize` back.

Quantizing is done on DeepSeek's layout: each HF matrix (`checkpoint_write.hf_tensors`:
q_proj or q_a_proj, kv_a_proj_with_mqa, q_b_proj, o_proj, each MLP's and expert's gate, up and
down) gets one float32 scale per block x block block (amax / 448, e4m3's largest value;
arXiv:2412.19437, 3.3), and params' fields are then cut from those matrices exactly as
`load_hf(weights="fp8")` cuts a checkpoint's (`checkpoint_fp8`). kv_b_proj's W_UK / W_UV stay
in the float dtype (`fp8_params.ABSORBED`). So the result is what `load_hf(weights="fp8")`
gives for the same weights saved as floats, and `save_hf` writes it as DeepSeek's FP8 layout
with kv_b_proj in the float dtype (`modules_to_not_convert`), which loads back bit for bit.
"""

from dataclasses import replace

import torch
from torch import Tensor

from mla_func.checkpoint_fp8 import Pair, attention_fields, experts_fields, mlp_fields
from mla_func.checkpoint_write import hf_tensors
from mla_func.fp8 import Fp8Weight, Weight, dense, expand_scales, quantize_matrix
from mla_func.fp8_params import is_fp8, map_projections
from mla_func.params import DenseMLP, MoE, Params


class _Quantizing:
    """A `checkpoint_fp8` source over params' own HF matrices, quantized as read."""

    def __init__(self, params: Params, block: int) -> None:
        self.tensors = dict(hf_tensors(params))
        self.shapes = {k: tuple(t.shape) for k, t in self.tensors.items()}
        self.block, self.rope_perm = (block, block), None

    def pair(self, key: str, rows: slice | None = None, cols: slice | None = None) -> Pair:
        w = self.tensors[key]
        data, scales = quantize_matrix(w[None], self.block)
        full = expand_scales(scales, self.block, *w.shape)[0]
        cut = (rows or slice(None), cols or slice(None))
        return data[0][cut], full[cut]


def quantize_fp8(params: Params, block: int = 128) -> Params:
    """`params` with every projection (`fp8_params.PROJECTIONS`) but W_UK / W_UV
    (`fp8_params.ABSORBED`) in block FP8 (e4m3, one float32 scale per `block` x `block`
    block of DeepSeek's matrices; shapes need not divide it); W_UK / W_UV, the router, score
    bias, norms, embedding and lm_head unchanged. Whole params only (shard after, or load a
    shard with `load_hf(weights="fp8", mesh=...)`)."""
    if block < 1:
        raise ValueError(f"block must be positive; got {block}")
    if params.tp.sharded:
        raise ValueError("quantize_fp8 takes whole params, not a tensor-parallel shard")
    if is_fp8(params):
        raise ValueError("these params are already block FP8 (dequantize them first)")
    src, cfg, tp, device = _Quantizing(params, block), params.cfg, params.tp, params.device
    layers = []
    for i, layer in enumerate(params.layers):
        p, mlp = f"model.layers.{i}.", layer.mlp
        attn = replace(layer.attn, **attention_fields(src, p + "self_attn.", cfg, tp, device))
        if isinstance(mlp, MoE):
            gate_up, down = experts_fields(src, p + "mlp.", cfg, tp, device)
            shared = mlp.shared and DenseMLP(*mlp_fields(src, p + "mlp.shared_experts.", tp,
                                                         device))
            mlp = replace(mlp, gate_up=gate_up, down=down, shared=shared)
        else:
            mlp = DenseMLP(*mlp_fields(src, p + "mlp.", tp, device))
        layers.append(replace(layer, attn=attn, mlp=mlp))
    return replace(params, layers=tuple(layers))


def dequantize(params: Params, dtype: torch.dtype | None = None) -> Params:
    """`params` with every block-FP8 weight dequantized to `dtype` (default: the params'
    float dtype, `params.dtype`); float weights are left as they are."""
    dtype = dtype or params.dtype

    def to_float(w: Weight, _: str) -> Tensor:
        return dense(w, dtype) if isinstance(w, Fp8Weight) else w

    return map_projections(params, to_float)


__all__ = ["dequantize", "quantize_fp8"]
