"""The step function: `forward(params, state, batch) -> (logits, state)`.

DeepSeek-V2/V3 decoder (arXiv:2405.04434, arXiv:2412.19437): per layer x + attn(rmsnorm(x)),
then h + ffn(rmsnorm(h)), the FFN dense for the first `first_k_dense_replace` layers and MoE
after. Numerics follow HF transformers' DeepseekV2/V3ForCausalLM. The attention itself is one
custom op (`mla_func::mla_attention`), which also applies the rope and the latent norm to the
new rows, and so is the logits projection of each sequence's last row (`mla_func::logits`);
everything else is static-shape torch. On CUDA the small steps (residual add +
RMSNorm, the MoE router) run as fused Triton kernels (`kernels/linear/norm.py`, `router.py`) with the
reference numerics; after an MoE the residual add and the next norm ride in the experts' final
reduction (`moe.experts_add_norm`), and after the attention in its output projection
(`project_add_norm`; at a few rows one launch, `kernels/linear/proj_norm.py`). Projections of a few
rows may run as matrix-vector kernels that load their weights early (`kernels/linear/small_linear.py`):
their rounding of the bf16 product can differ from cuBLAS's. A layer's first projection takes
the residual stream too (`norm_linear`, `kernels/linear/norm_linear.py`): at one row it normalises h
itself, and the MoE before it leaves its norm out (`defer_norm`).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.attention import attend
from mla_func.batch import Batch, BatchError
from mla_func.config import MLAConfig
from mla_func.custom_op import custom_op
from mla_func.kernels.linear import norm as fused_norm
from mla_func.kernels.linear import norm_linear as fused_norm_linear
from mla_func.kernels.linear import proj_norm
from mla_func.kernels.router.route import route_fused
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import route
from mla_func.ops.norm import rmsnorm
from mla_func.params import Attention, DenseMLP, MoE, Params, rope_attention_factor
from mla_func.state import KVState, LatentCache

# Tests set this to run the fused Triton kernels on the CPU (TRITON_INTERPRET=1).
FORCE_FUSED = False


def _fused(x: Tensor) -> bool:
    """CUDA runs the fused kernels; so does `meta`, so that shape-only runs there (planning,
    shape checks) see the ops a GPU runs (the custom ops' fake implementations run on meta)."""
    return x.device.type in ("cuda", "meta") or FORCE_FUSED


def add_norm(
    h: Float[Tensor, "tokens hidden"], r: Float[Tensor, "tokens hidden"],
    weight: Float[Tensor, " hidden"], eps: float,
) -> tuple[Float[Tensor, "tokens hidden"], Float[Tensor, "tokens hidden"]]:
    """(h + r, rmsnorm(h + r)): the residual stream and the next sub-layer's input."""
    if _fused(h):
        return fused_norm.add_rmsnorm(h, r, weight, eps)
    h = h + r
    return h, rmsnorm(h, weight, eps)


def project_add_norm(
    o: Float[Tensor, "tokens width_in"], w: Float[Tensor, "hidden width_in"],
    h: Float[Tensor, "tokens hidden"], weight: Float[Tensor, " hidden"], eps: float,
) -> tuple[Float[Tensor, "tokens hidden"], Float[Tensor, "tokens hidden"]]:
    """(h + o w^T, rmsnorm(h + o w^T)): the attention's output projection, the residual add
    and the FFN's input norm (one launch at a few rows, `kernels/linear/proj_norm.py`)."""
    if _fused(h):
        return proj_norm.proj_add_rmsnorm(o, w, h, weight, eps)
    return add_norm(h, o @ w.T, weight, eps)


def norm(x: Float[Tensor, "tokens width"], weight: Float[Tensor, " width"], eps: float
         ) -> Float[Tensor, "tokens width"]:
    if _fused(x):
        return fused_norm.rmsnorm(x, weight, eps)
    return rmsnorm(x, weight, eps)


def norm_linear(
    x: Float[Tensor, "tokens width_in"], h: Float[Tensor, "tokens width_in"],
    weight: Float[Tensor, " width_in"], eps: float, w: Float[Tensor, "width_out width_in"],
) -> Float[Tensor, "tokens width_out"]:
    """x w^T, x being rmsnorm(h) * weight. On the fused path at one row the kernel normalises
    h itself and x is not read (`kernels/linear/norm_linear.py`; the op that made h may leave x
    unwritten)."""
    if _fused(x):
        return fused_norm_linear.norm_linear(x, h, weight, eps, w)
    return x @ w.T


def project_qkv_a(
    attn: Attention, x: Float[Tensor, "tokens hidden"], h: Float[Tensor, "tokens hidden"],
    input_norm: Float[Tensor, " hidden"], cfg: MLAConfig,
) -> tuple[Float[Tensor, "tokens heads qk_head"], Float[Tensor, "tokens latent"]]:
    """(q, kv_a_proj(x)): both projections of x = rmsnorm(h) * input_norm in one GEMM
    (`Attention.qkv_a_proj`; `norm_linear`)."""
    qkv = norm_linear(x, h, input_norm, cfg.rms_norm_eps, attn.qkv_a_proj)
    q, kv = qkv.split((qkv.shape[1] - cfg.latent_dim, cfg.latent_dim), dim=1)
    if attn.q_b_proj is not None:
        q = norm(q, attn.q_a_norm, cfg.rms_norm_eps) @ attn.q_b_proj.flatten(0, 1).T
    return q.unflatten(-1, (cfg.num_attention_heads, cfg.qk_head_dim)), kv


def attention_block(
    attn: Attention,
    x: Float[Tensor, "tokens hidden"],
    h: Float[Tensor, "tokens hidden"],
    input_norm: Float[Tensor, " hidden"],
    cache: LatentCache,
    layer: int,
    batch: Batch,
    inv_freq: Float[Tensor, " qk_rope"],
    cfg: MLAConfig,
) -> Float[Tensor, "tokens width_in"]:
    """The attention's output per head, flattened (heads x v_head), before o_proj; x is
    rmsnorm(h) * input_norm (`norm_linear`)."""
    q, kv = project_qkv_a(attn, x, h, input_norm, cfg)
    # The op applies the rope and the latent norm itself (the Triton decode path fuses them
    # with its first launch).
    nope = cfg.qk_nope_head_dim
    o = attend(
        q[..., :nope], q[..., nope:], kv, cache, layer, attn.kv_a_norm, inv_freq, attn.w_uk,
        attn.w_uv, batch.slot_mapping, batch.token_seq, batch.positions, batch.page_table,
        batch.seq_lens, batch.host, cfg.softmax_scale, rope_attention_factor(cfg),
        cfg.rms_norm_eps, batch.backend)
    return o.flatten(1, 2)


def ffn_add_norm(
    mlp: DenseMLP | MoE, x: Float[Tensor, "tokens hidden"], h: Float[Tensor, "tokens hidden"],
    weight: Float[Tensor, " hidden"], cfg: MLAConfig, defer_norm: bool = False,
) -> tuple[Float[Tensor, "tokens hidden"], Float[Tensor, "tokens hidden"]]:
    """(h + ffn(x), rmsnorm(h + ffn(x))): the FFN sub-layer, the residual add and the next
    norm. The MoE's experts do the add and the norm in their final reduction (one launch).
    `defer_norm`: the norm's only reader is `norm_linear` (the MoE may leave it unwritten)."""
    from mla_func.moe import experts_add_norm

    eps = cfg.rms_norm_eps
    if isinstance(mlp, MoE):
        route_fn = route_fused if _fused(x) else route
        weights, ids = route_fn(x, mlp.router, mlp.score_bias, cfg)
        # The experts implementation adds the shared experts itself (fused on CUDA).
        return experts_add_norm(x, weights, ids, mlp.gate_up, mlp.down, mlp.shared, h, weight,
                                eps, defer_norm=defer_norm)
    return add_norm(h, swiglu(x, mlp.gate_up, mlp.down), weight, eps)


def forward(
    params: Params, state: KVState, batch: Batch
) -> tuple[Float[Tensor, "seqs vocab"], KVState]:
    """One step over a mixed batch. Consumes `state`: the returned state is the same buffers,
    with this step's tokens written. Logits (float32) are for each sequence's last new token."""
    if batch.page_size != state.page_size:  # slots and page ids would address other rows
        raise BatchError(f"the batch was laid out for cache pages of {batch.page_size} tokens; "
                         f"this state's pages hold {state.page_size}")
    cfg, eps, layers = params.cfg, params.cfg.rms_norm_eps, params.layers
    h = params.embed[batch.token_ids]
    x = norm(h, layers[0].input_norm, eps)
    for i, layer in enumerate(layers):
        o = attention_block(layer.attn, x, h, layer.input_norm, state.cache, i, batch,
                            params.rope_inv_freq, cfg)
        h, x = project_add_norm(o, layer.attn.o_proj.flatten(1, 2), h, layer.post_attn_norm,
                                eps)
        # The next layer's input norm, read only by its `norm_linear`; after the last layer,
        # the final norm, which the logits read.
        last = i + 1 == len(layers)
        after = params.norm if last else layers[i + 1].input_norm
        h, x = ffn_add_norm(layer.mlp, x, h, after, cfg, defer_norm=not last)
    return project_logits(x, batch.logits_index, params.lm_head), state


@custom_op("mla_func::logits", mutates_args=())
def _logits_op(x: Tensor, index: Tensor, lm_head: Tensor) -> Tensor:
    rows = x[index]
    if rows.is_cuda and rows.dtype in (torch.bfloat16, torch.float16):
        # cuBLAS stores its fp32 accumulator as is: no half-precision logits written, then
        # read and widened (at B=128 and a 102400-word vocabulary, 52 MB less traffic).
        return torch.mm(rows, lm_head.T, out_dtype=torch.float32)
    return (rows @ lm_head.T).float()


@_logits_op.register_fake
def _(x, index, lm_head):
    return x.new_empty(index.shape[0], lm_head.shape[0], dtype=torch.float32)


def project_logits(
    x: Float[Tensor, "tokens hidden"], index: Int[Tensor, " seqs"],
    lm_head: Float[Tensor, "vocab hidden"],
) -> Float[Tensor, "seqs vocab"]:
    """float32 logits of the rows `index` of x (each sequence's last new token; on CUDA from
    half-precision weights, the product's fp32 accumulator unrounded). One op (a
    custom op, one node for tracers), whose rows are the sequences, not the tokens: a caller
    that runs the step in pieces padded to a token count can run it on the real sequences."""
    return _logits_op(x, index, lm_head)

