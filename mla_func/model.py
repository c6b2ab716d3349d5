"""The step function: `forward(params, state, batch) -> (logits, state)`.

DeepSeek-V2/V3 decoder (arXiv:2405.04434, arXiv:2412.19437): per layer x + attn(rmsnorm(x)),
then h + ffn(rmsnorm(h)), the FFN dense for the first `first_k_dense_replace` layers and MoE
after. Numerics follow HF transformers' DeepseekV2/V3ForCausalLM.

The step is written as that math over `mla_func.kernel_ops`, which runs each op as the batch's
`KernelOptions` say (the torch reference or fused kernels); the residual add rides with the
next norm (`add_norm`), the attention's output projection with both (`project_add_norm`), and
a layer's first projection takes the residual too (`norm_linear`), so that a fused path may
normalise there (the deferred norm: `kernel_ops`). The attention is one custom op
(`attention.attend`) that also applies the rope and the latent norm to the new rows; the
logits of each sequence's last row are another (`kernel_ops.logits`).

On several GPUs (`params.tp`, `mla_func.parallel`) each rank runs this same step on its
shard: its heads, its experts, its share of the MLPs' width and of the vocabulary; the
sub-layers' sums over ranks (`K.all_reduce`, and inside `project_add_norm` and
`experts_add_norm`) come before each residual add.
"""

from typing import Annotated

from jaxtyping import Float, Int
from torch import Tensor

import mla_func.kernel_ops as K
from mla_func.attention import attend
from mla_func.batch import Batch, BatchError, KernelOptions, check_vocab
from mla_func.config import MLAConfig
from mla_func.donation import Donated, donating
from mla_func.ops.attention_args import AttnMeta, AttnWeights
from mla_func.params import Attention, Layer, MoE, Params, rope_attention_factor
from mla_func.state import KVState

Rows = Float[Tensor, "tokens hidden"]


def project_qkv_a(
    attn: Attention, x: Rows, h: Rows, input_norm: Float[Tensor, " hidden"], cfg: MLAConfig,
    opts: KernelOptions, counters: Int[Tensor, " counters"],
) -> tuple[Float[Tensor, "tokens heads qk_head"], Float[Tensor, "tokens latent"]]:
    """(q, kv_a_proj(x)): both projections of x = rmsnorm(h) * input_norm in one GEMM
    (`Attention.qkv_a_proj`), the query through its low-rank pair where q_lora is set."""
    eps = cfg.rms_norm_eps
    qkv = K.norm_linear(x, h, input_norm, eps, attn.qkv_a_proj, opts, counters)
    q, kv = qkv.split((qkv.shape[1] - cfg.latent_dim, cfg.latent_dim), dim=1)
    if attn.q_b_proj is not None:
        q = K.linear(K.norm(q, attn.q_a_norm, eps, opts), attn.q_b_proj, opts, counters)
    return q.unflatten(-1, (-1, cfg.qk_head_dim)), kv  # this rank's heads


def attention_weights(attn: Attention, params: Params, opts: KernelOptions) -> AttnWeights:
    """The attention op's weights; W_UK and W_UV as `K.absorbed` passes them."""
    cfg = params.cfg
    w_uk, w_uv, uk_scales, uv_scales, rows, cols = K.absorbed(attn.w_uk, attn.w_uv,
                                                              params.dtype, opts)
    return AttnWeights(attn.kv_a_norm, params.rope_inv_freq, w_uk, w_uv, cfg.softmax_scale,
                       rope_attention_factor(cfg), cfg.rms_norm_eps, uk_scales, uv_scales, rows,
                       cols)


def attention_meta(batch: Batch) -> AttnMeta:
    return AttnMeta(batch.slot_mapping, batch.token_seq, batch.positions, batch.page_table,
                    batch.seq_lens, batch.host, batch.kernels.mha_min_query)


def layer_step(
    layer: Layer, i: int, x: Rows, h: Rows, next_norm: Float[Tensor, " hidden"],
    defer_norm: bool, params: Params, state: KVState, batch: Batch, meta: AttnMeta,
) -> tuple[Rows, Rows]:
    """One decoder layer: (h, x) in, (h, rmsnorm(h) * next_norm) out, x being this layer's
    normalised input; `meta`: the step's metadata as the attention reads it."""
    cfg, opts, eps, tp = params.cfg, batch.kernels, params.cfg.rms_norm_eps, params.tp
    attn = layer.attn
    q, kv = project_qkv_a(attn, x, h, layer.input_norm, cfg, opts, state.counters)
    nope = cfg.qk_nope_head_dim
    o = attend(q[..., :nope], q[..., nope:], kv, state.cache, i,
               attention_weights(attn, params, opts), meta, opts.attention, opts.eager_direct)
    h, x = K.project_add_norm(o.flatten(1, 2), attn.o_proj, h,
                              layer.post_attn_norm, eps, opts, state.counters, tp)
    mlp = layer.mlp
    if isinstance(mlp, MoE):
        weights, ids = K.route(x, mlp, cfg, opts, state.counters)
        return K.experts_add_norm(x, weights, ids, mlp, h, next_norm, eps, opts,
                                  state.counters, defer_norm, tp)
    y = K.all_reduce(K.mlp(x, mlp.gate_up, mlp.down, opts, state.counters), tp, opts,
                     state.counters)
    return K.add_norm(h, y, next_norm, eps, opts)


@donating
def forward(
    params: Params, state: Annotated[KVState, Donated], batch: Batch
) -> tuple[Float[Tensor, "seqs vocab"], KVState]:
    """One step over a mixed batch. Consumes `state` (`donation`): the returned state is the
    same buffers, with this step's tokens written, and the one passed is spent. Logits
    (float32) are for each sequence's last new token."""
    if batch.page_size != state.page_size:  # slots and page ids would address other rows
        raise BatchError(f"the batch was laid out for cache pages of {batch.page_size} tokens; "
                         f"this state's pages hold {state.page_size}")
    check_vocab(batch, params.cfg.vocab_size)  # a CPU batch's ids (a GPU's: make_batch's)
    layers, opts, meta = params.layers, batch.kernels, attention_meta(batch)
    h = K.embed(batch.token_ids, params.embed, params.tp, opts, state.counters)
    x = K.norm(h, layers[0].input_norm, params.cfg.rms_norm_eps, opts)
    for i, layer in enumerate(layers):
        last = i + 1 == len(layers)
        # Each layer ends with the next one's input norm (read only by its `norm_linear`, so
        # it may be deferred); the last with the final norm, which the logits read.
        next_norm = params.norm if last else layers[i + 1].input_norm
        h, x = layer_step(layer, i, x, h, next_norm, not last, params, state, batch, meta)
    return K.logits(x, batch.logits_index, params.lm_head, opts, params.tp), state
