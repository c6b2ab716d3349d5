"""The step function: `forward(params, state, batch) -> (logits, state)`.

DeepSeek-V2/V3 decoder (arXiv:2405.04434, arXiv:2412.19437): per layer x + attn(rmsnorm(x)),
then h + ffn(rmsnorm(h)), the FFN dense for the first `first_k_dense_replace` layers and MoE
after. Numerics follow HF transformers' DeepseekV2/V3ForCausalLM. The attention itself is one
custom op (`mla_func::mla_attention`); everything else is plain static-shape torch.
"""

import torch
from jaxtyping import Float
from torch import Tensor

import mla_func.attention  # noqa: F401  (registers the mla_attention op)
from mla_func.batch import Batch
from mla_func.config import MLAConfig
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import route
from mla_func.ops.norm import rmsnorm
from mla_func.ops.rope import apply_rope, rope_cos_sin
from mla_func.params import Attention, DenseMLP, MoE, Params, rope_attention_factor
from mla_func.state import KVState


def project_q(
    attn: Attention, x: Float[Tensor, "tokens hidden"], cfg: MLAConfig
) -> tuple[Float[Tensor, "tokens heads qk_nope"], Float[Tensor, "tokens heads qk_rope"]]:
    if attn.q_proj is not None:
        q = x @ attn.q_proj.flatten(0, 1).T
    else:
        q_a = rmsnorm(x @ attn.q_a_proj.T, attn.q_a_norm, cfg.rms_norm_eps)
        q = q_a @ attn.q_b_proj.flatten(0, 1).T
    q = q.unflatten(-1, (cfg.num_attention_heads, cfg.qk_head_dim))
    return q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]


def compress_kv(
    attn: Attention, x: Float[Tensor, "tokens hidden"], cfg: MLAConfig
) -> tuple[Float[Tensor, "tokens kv_lora"], Float[Tensor, "tokens qk_rope"]]:
    """c_kv (normalised) and the shared, not yet rotated k_pe."""
    kv = x @ attn.kv_a_proj.T
    c_kv = rmsnorm(kv[:, : cfg.kv_lora_rank], attn.kv_a_norm, cfg.rms_norm_eps)
    return c_kv, kv[:, cfg.kv_lora_rank :]


def attention_block(
    attn: Attention,
    x: Float[Tensor, "tokens hidden"],
    cache: Float[Tensor, "layers pages page_size latent"],
    layer: int,
    batch: Batch,
    rope: tuple[Float[Tensor, "tokens qk_rope"], Float[Tensor, "tokens qk_rope"]],
    cfg: MLAConfig,
) -> Float[Tensor, "tokens hidden"]:
    q_nope, q_pe = project_q(attn, x, cfg)
    c_kv, k_pe = compress_kv(attn, x, cfg)
    cos, sin = rope
    q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe, cos, sin)
    kv_new = torch.cat((c_kv, k_pe), dim=-1)
    o = torch.ops.mla_func.mla_attention(
        q_nope, q_pe, kv_new, cache, layer, attn.w_uk, attn.w_uv, batch.slot_mapping,
        batch.token_seq, batch.positions, batch.page_table, batch.seq_lens, batch.host,
        cfg.softmax_scale, batch.backend)
    return o.flatten(1, 2) @ attn.o_proj.flatten(1, 2).T


def moe_block(moe: MoE, x: Float[Tensor, "tokens hidden"], cfg: MLAConfig
              ) -> Float[Tensor, "tokens hidden"]:
    from mla_func.moe import experts

    weights, ids = route(x, moe.router, moe.score_bias, cfg)
    out = experts(x, weights, ids, moe.gate_up, moe.down)
    if moe.shared is not None:
        out = out + swiglu(x, moe.shared.gate_up, moe.shared.down)
    return out


def ffn(mlp: DenseMLP | MoE, x: Float[Tensor, "tokens hidden"], cfg: MLAConfig
        ) -> Float[Tensor, "tokens hidden"]:
    if isinstance(mlp, MoE):
        return moe_block(mlp, x, cfg)
    return swiglu(x, mlp.gate_up, mlp.down)


def forward(
    params: Params, state: KVState, batch: Batch
) -> tuple[Float[Tensor, "seqs vocab"], KVState]:
    """One step over a mixed batch. Consumes `state`: the returned state is the same buffers,
    with this step's tokens written. Logits (float32) are for each sequence's last new token."""
    cfg = params.cfg
    h = params.embed[batch.token_ids]
    rope = rope_cos_sin(batch.positions, params.rope_inv_freq, rope_attention_factor(cfg))
    for i, layer in enumerate(params.layers):
        x = rmsnorm(h, layer.input_norm, cfg.rms_norm_eps)
        h = h + attention_block(layer.attn, x, state.cache, i, batch, rope, cfg)
        x = rmsnorm(h, layer.post_attn_norm, cfg.rms_norm_eps)
        h = h + ffn(layer.mlp, x, cfg)
    last = rmsnorm(h[batch.logits_index], params.norm, cfg.rms_norm_eps)
    return (last @ params.lm_head.T).float(), state

