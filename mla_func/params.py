"""Parameter pytrees (frozen dataclasses of tensors) and `init_params`.

Layout follows the math of DeepSeek-V2 (arXiv:2405.04434) section 2.1: `kv_b_proj` is stored
split and per head as W_UK (`heads qk_nope kv_lora`) and W_UV (`heads v_head kv_lora`), the
"absorbed" weights, so the decode path multiplies queries into the latent space and never
expands keys or values. Checkpoint loading lives in `checkpoint.py`.

A projection's weight (every one but the router and lm_head) may instead be block FP8
(`fp8.Fp8Weight`: DeepSeek-V3's format, `quantize.quantize_fp8` or `load_hf(weights="fp8")`,
which keep W_UK / W_UV in the float dtype: `fp8_params.ABSORBED`);
the reference ops read weights through `fp8.dense`, the fused path multiplies the attention's
and dense MLPs' projections in FP8 (`kernel_ops`). Norms, the router, the score bias, the
embedding and lm_head stay in the float dtype.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.dims import static_sizes
from mla_func.dtypes import resolve_dtype
from mla_func.fp8 import Fp8Weight
from mla_func.parallel.group import SINGLE, TensorParallel


@dataclass(frozen=True)
class Attention:
    """`qkv_a_proj` stacks the two projections of the layer input: the query's (HF `q_proj`,
    or `q_a_proj` with q_lora) over `kv_a_proj_with_mqa`, so that they are one GEMM (one
    launch, one read of x). `split_qkv_a` gives the two parts back."""

    kv_a_norm: Float[Tensor, " kv_lora"]
    w_uk: Float[Tensor, "heads qk_nope kv_lora"] | Fp8Weight
    w_uv: Float[Tensor, "heads v_head kv_lora"] | Fp8Weight
    qkv_a_proj: Float[Tensor, "qkv_a hidden"] | Fp8Weight
    o_proj: Float[Tensor, "hidden heads v_head"] | Fp8Weight
    # With q_lora: the query part of qkv_a_proj is q_a_proj, then q_a_norm and q_b_proj.
    q_a_norm: Float[Tensor, " q_lora"] | None
    q_b_proj: Float[Tensor, "heads qk_head q_lora"] | Fp8Weight | None


def split_qkv_a(attn: Attention, cfg: MLAConfig
                ) -> tuple[Float[Tensor, "_ hidden"], Float[Tensor, "latent hidden"]]:
    """(query part, kv_a_proj) of `qkv_a_proj`: views. The query part is HF's q_proj
    (heads x qk_head rows, per head) or q_a_proj (q_lora rows)."""
    q_rows = attn.qkv_a_proj.shape[0] - cfg.latent_dim
    return attn.qkv_a_proj[:q_rows], attn.qkv_a_proj[q_rows:]


@dataclass(frozen=True)
class DenseMLP:
    """SwiGLU: down(silu(gate x) * up x); gate and up stacked on the leading axis."""

    gate_up: Float[Tensor, "2 inter hidden"] | Fp8Weight
    down: Float[Tensor, "hidden inter"] | Fp8Weight


@dataclass(frozen=True)
class MoE:
    # In the weights' dtype, as HF holds it; the scores are computed in float32 (a bf16 or
    # fp16 product is exact in float32, so the routing is HF's).
    router: Float[Tensor, "experts hidden"]
    # noaux_tc only: added to the scores for expert selection, not to the weights.
    score_bias: Float[Tensor, " experts"] | None
    # This rank's experts (all of them on one device; `mla_func.parallel.shard`).
    gate_up: Float[Tensor, "local_experts 2 moe_inter hidden"] | Fp8Weight
    down: Float[Tensor, "local_experts hidden moe_inter"] | Fp8Weight
    shared: DenseMLP | None


@dataclass(frozen=True)
class Layer:
    input_norm: Float[Tensor, " hidden"]
    attn: Attention
    post_attn_norm: Float[Tensor, " hidden"]
    mlp: DenseMLP | MoE


@dataclass(frozen=True)
class Params:
    cfg: MLAConfig  # static: the whole model's
    embed: Float[Tensor, "local_vocab hidden"]
    layers: tuple[Layer, ...]
    norm: Float[Tensor, " hidden"]
    lm_head: Float[Tensor, "local_vocab hidden"]
    # YaRN inverse frequencies, each repeated for its (even, odd) pair; always float32.
    rope_inv_freq: Float[Tensor, " qk_rope"]
    # static: which shard of the model these are (`mla_func.parallel.shard_params`)
    tp: TensorParallel = SINGLE

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype


def tensor_leaves(tree: Any, prefix: str = "") -> list[tuple[str, Tensor]]:
    """Every tensor in a params/state/batch pytree with its dotted path."""
    if isinstance(tree, Tensor):
        return [(prefix, tree)]
    if isinstance(tree, (tuple, list)):
        out = []
        for i, item in enumerate(tree):
            out += tensor_leaves(item, f"{prefix}.{i}" if prefix else str(i))
        return out
    if hasattr(tree, "__dataclass_fields__"):
        out = []
        for f in fields(tree):
            path = f"{prefix}.{f.name}" if prefix else f.name
            out += tensor_leaves(getattr(tree, f.name), path)
        return out
    return []


def yarn_inv_freq(cfg: MLAConfig) -> Float[Tensor, " qk_rope"]:
    """YaRN-corrected inverse frequencies (as DeepSeek and HF compute them), pair-repeated."""
    import math

    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_freq = 1.0 / pos_freqs
    rs = cfg.rope_scaling or {}
    if rs.get("type", rs.get("rope_type", "default")) == "yarn":
        factor = float(rs["factor"])
        # Absent or null: HF's default, the model's own context length.
        original = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings
        beta_fast = float(rs.get("beta_fast") or 32)  # config.json has ints (32, 1)
        beta_slow = float(rs.get("beta_slow") or 1)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq.repeat_interleave(2)


def rope_attention_factor(cfg: MLAConfig) -> float:
    """YaRN's cos/sin magnitude: mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""
    from mla_func.config import yarn_mscale

    rs = cfg.rope_scaling or {}
    if rs.get("type", rs.get("rope_type", "default")) != "yarn":
        return 1.0
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    factor = float(rs["factor"])
    mscale, all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    if mscale and all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
    return yarn_mscale(factor, 1.0)


def init_params(
    cfg: MLAConfig,
    seed: int = 0,
    device: "str | torch.device" = "cpu",
    dtype: "torch.dtype | str" = torch.float32,
    layer_fn: Callable[[int, "Layer"], "Layer"] | None = None,
) -> Params:
    """Random parameters, deterministic per (seed, device); on `meta` nothing is allocated.
    `dtype`: a floating-point torch.dtype or its name (`dtypes.DTYPES`: "bf16", ...).
    `layer_fn(i, layer)` replaces each layer as soon as it is drawn, before the next one
    (the same draws: e.g. `parallel.shard.random_shard` cuts each layer to a rank's share,
    so that only one whole layer is ever held)."""
    dtype = resolve_dtype(dtype, "parameters' dtype")
    device = torch.device(device)
    meta = device.type == "meta"
    gen = None if meta else torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int, std: float) -> Tensor:
        if meta:
            return torch.empty(shape, device=device, dtype=dtype)
        return torch.randn(shape, generator=gen, device=device, dtype=dtype) * std

    def norm(n: int) -> Tensor:
        if meta:
            return torch.empty(n, device=device, dtype=dtype)
        return 1.0 + rand(n, std=0.1)

    c = cfg
    h, heads = c.hidden_size, c.num_attention_heads

    def dense(inter: int) -> DenseMLP:
        return DenseMLP(
            gate_up=rand(2, inter, h, std=h**-0.5), down=rand(h, inter, std=inter**-0.5)
        )

    layers = []
    for i in range(c.num_hidden_layers):
        lora = c.q_lora_rank
        attn = Attention(
            kv_a_norm=norm(c.kv_lora_rank),
            w_uk=rand(heads, c.qk_nope_head_dim, c.kv_lora_rank, std=c.kv_lora_rank**-0.5),
            w_uv=rand(heads, c.v_head_dim, c.kv_lora_rank, std=c.kv_lora_rank**-0.5),
            # Every row of x's projections has the same scale: one draw for the stack.
            qkv_a_proj=rand(static_sizes(c)["qkv_a"], h, std=h**-0.5),
            o_proj=rand(h, heads, c.v_head_dim, std=(heads * c.v_head_dim) ** -0.5),
            q_a_norm=norm(lora) if lora else None,
            q_b_proj=rand(heads, c.qk_head_dim, lora, std=lora**-0.5) if lora else None,
        )
        if c.is_moe_layer(i):
            e = c.n_routed_experts
            mlp: DenseMLP | MoE = MoE(
                router=rand(e, h, std=h**-0.5),
                score_bias=rand(e, std=0.1) if c.topk_method == "noaux_tc" else None,
                gate_up=rand(e, 2, c.moe_intermediate_size, h, std=h**-0.5),
                down=rand(e, h, c.moe_intermediate_size, std=c.moe_intermediate_size**-0.5),
                shared=dense(c.moe_intermediate_size * c.n_shared_experts)
                if c.n_shared_experts
                else None,
            )
        else:
            mlp = dense(c.intermediate_size)
        layer = Layer(input_norm=norm(h), attn=attn, post_attn_norm=norm(h), mlp=mlp)
        layers.append(layer if layer_fn is None else layer_fn(i, layer))
    embed = rand(c.vocab_size, h, std=1.0)
    inv_freq = (
        yarn_inv_freq(c).to(device) if not meta else torch.empty(c.qk_rope_head_dim, device=device)
    )
    return Params(
        cfg=c,
        embed=embed,
        layers=tuple(layers),
        norm=norm(h),
        lm_head=embed if c.tie_word_embeddings else rand(c.vocab_size, h, std=h**-0.5),
        rope_inv_freq=inv_freq,
    )
