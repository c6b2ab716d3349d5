"""The attention op's operands as two pytrees: a layer's weights and a step's metadata.

`mla_func::mla_attention` takes flat arguments (a custom op's schema is a list of tensors and
numbers): they are flattened once, where the op is called (`flat`), and rebuilt once inside it
(`from_flat`), so every backend takes (q_nope, q_pe, kv, cache, layer, weights, meta).
"""

from dataclasses import dataclass, fields

import torch
from jaxtyping import Float, Float32, Int
from torch import Tensor

from mla_func.fp8 import Fp8Weight, dense


@dataclass(frozen=True)
class AttnWeights:
    """One layer's attention weights and numbers: the latent norm, the rope frequencies, the
    absorbed W_UK / W_UV, the softmax and rope scales and the norm's eps. W_UK / W_UV are
    float, or block FP8 as stored: e4m3 values with their scales per block of `block_rows` x
    `block_cols` (one grid for both; float weights: no scales, a 0 x 0 block)."""

    kv_norm: Float[Tensor, " kv_lora"]
    inv_freq: Float[Tensor, " qk_rope"]
    w_uk: Float[Tensor, "heads qk_nope kv_lora"]
    w_uv: Float[Tensor, "heads v_head kv_lora"]
    scale: float
    rope_scale: float
    eps: float
    uk_scales: Float32[Tensor, "heads _ _"] | None = None
    uv_scales: Float32[Tensor, "heads _ _"] | None = None
    block_rows: int = 0
    block_cols: int = 0

    def absorbed(self) -> tuple[Tensor | Fp8Weight, Tensor | Fp8Weight]:
        """(W_UK, W_UV): float tensors, or block-FP8 weights (`fp8.Fp8Weight`)."""
        if self.uk_scales is None or self.uv_scales is None:
            return self.w_uk, self.w_uv
        block = (self.block_rows, self.block_cols)
        return (Fp8Weight(self.w_uk, self.uk_scales, block, tuple(self.w_uk.shape)),
                Fp8Weight(self.w_uv, self.uv_scales, block, tuple(self.w_uv.shape)))

    def dense(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(W_UK, W_UV) as float tensors, block-FP8 ones dequantised to `dtype` in torch (the
        reference's `fp8.dequantize`)."""
        uk, uv = self.absorbed()
        return dense(uk, dtype), dense(uv, dtype)


@dataclass(frozen=True)
class AttnMeta:
    """A step's metadata (`Batch`'s fields the attention reads); `host` is the CPU copy of
    the counts (`batch.HOST_FIELDS`) that grids and forms are chosen from; a sequence of
    `mha_min_query` new tokens or more runs in the MHA form (`KernelOptions`)."""

    slot_mapping: Int[Tensor, " tokens"]
    token_seq: Int[Tensor, " tokens"]
    positions: Int[Tensor, " tokens"]
    page_table: Int[Tensor, "seqs max_pages"]
    seq_lens: Int[Tensor, " seqs"]
    host: Int[Tensor, " 5"]
    mha_min_query: int


def flat(obj: AttnWeights | AttnMeta) -> tuple:
    """The fields in order (no copies, unlike dataclasses.astuple; a dataclass's instance
    dict holds its fields in declaration order, and reading it is one call a layer, not one a
    field)."""
    return tuple(obj.__dict__.values())


WEIGHT_ARGS = len(fields(AttnWeights))
META_ARGS = len(fields(AttnMeta))


def from_flat(args: tuple) -> tuple[AttnWeights, AttnMeta]:
    """(weights, meta) from the op's arguments after (q_nope, q_pe, kv, cache, layer)."""
    return (AttnWeights(*args[:WEIGHT_ARGS]),
            AttnMeta(*args[WEIGHT_ARGS:WEIGHT_ARGS + META_ARGS]))
