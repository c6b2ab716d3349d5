"""`shard_params(params, mesh)`: this rank's parameters, as a pure function of the whole ones.

The split (Megatron-LM's, Shoeybi et al. 2019, with DeepSeek's experts spread over ranks):
- attention by heads: the query's projection (q_proj, or q_b_proj with q_lora), W_UK, W_UV
  and o_proj's input columns; the latent path (kv_a, its norm, q_a with q_lora) is every
  rank's, so the latent cache is whole on every rank. o_proj's partial sums meet in one
  all-reduce.
- routed experts spread evenly: rank r holds experts [r * E/tp, (r+1) * E/tp); the router is
  every rank's, so every rank routes every token and sums its own experts' share.
- dense MLPs and the shared experts by their intermediate width (gate/up rows, down columns);
  their sums and the experts' meet in one all-reduce.
- embedding and lm_head by vocabulary rows: each rank looks up the ids it holds (an
  all-reduce makes the rows whole) and computes its share of the logits (gathered).
Norms, the router and the rope frequencies are every rank's. Block-FP8 weights are cut the
same way, their scales with their values (`fp8.take`: exact, a finer scale grid where a cut
falls inside a block).

The annotations stay true: a sharded axis binds its name to the local size (`heads`, `inter`,
`moe_inter` of a shared MLP), and the axes a shard holds part of while another tensor holds
them whole are `local_experts` and `local_vocab` (`dims.py`).
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.fp8 import Fp8Weight, Weight, take
from mla_func.parallel.group import ParallelError, TensorParallel, tensor_parallel
from mla_func.params import Attention, DenseMLP, Layer, MoE, Params


def check_shardable(cfg: MLAConfig, tp: TensorParallel) -> None:
    """ParallelError naming every size that `tp.size` ranks cannot split evenly."""
    n = tp.size
    sizes = {"num_attention_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size,
             "intermediate_size": cfg.intermediate_size}
    if cfg.n_routed_experts:
        sizes["n_routed_experts"] = cfg.n_routed_experts
        if cfg.n_shared_experts:
            sizes["n_shared_experts * moe_intermediate_size"] = (
                cfg.n_shared_experts * cfg.moe_intermediate_size)
    bad = [f"{k} = {v}" for k, v in sizes.items() if v % n]
    if bad:
        raise ParallelError(f"{n} ranks cannot split the model evenly: {', '.join(bad)} "
                            f"not divisible by {n}")


def _take(w: Weight, index: Callable[[Tensor], Tensor]) -> Weight:
    """index(w) as a contiguous copy (so that the whole weight can be freed once every shard
    is taken); of a block-FP8 weight, its values and scales alike (`fp8.take`, exact)."""
    if isinstance(w, Fp8Weight):
        return take(w, index)
    return index(w).clone(memory_format=torch.contiguous_format)


def shard_attention(a: Attention, cfg: MLAConfig, tp: TensorParallel) -> Attention:
    heads = tp.part(cfg.num_attention_heads)
    qkv = a.qkv_a_proj
    if a.q_b_proj is None:  # q_proj's rows are heads x qk_head, then kv_a's
        q_rows = cfg.num_attention_heads * cfg.qk_head_dim

        def own_queries(t: Tensor) -> Tensor:
            q = t[:q_rows].unflatten(0, (cfg.num_attention_heads, cfg.qk_head_dim))[heads]
            return torch.cat((q.flatten(0, 1), t[q_rows:]))

        qkv = _take(qkv, own_queries)
    return Attention(
        kv_a_norm=a.kv_a_norm, w_uk=_take(a.w_uk, lambda t: t[heads]),
        w_uv=_take(a.w_uv, lambda t: t[heads]), qkv_a_proj=qkv,
        o_proj=_take(a.o_proj, lambda t: t[:, heads]), q_a_norm=a.q_a_norm,
        q_b_proj=None if a.q_b_proj is None else _take(a.q_b_proj, lambda t: t[heads]))


def shard_dense(m: DenseMLP, tp: TensorParallel) -> DenseMLP:
    inter = tp.part(m.gate_up.shape[1])
    return DenseMLP(gate_up=_take(m.gate_up, lambda t: t[:, inter]),
                    down=_take(m.down, lambda t: t[:, inter]))


def shard_moe(m: MoE, tp: TensorParallel) -> MoE:
    experts = tp.part(m.gate_up.shape[0])
    return replace(m, gate_up=_take(m.gate_up, lambda t: t[experts]),
                   down=_take(m.down, lambda t: t[experts]),
                   shared=None if m.shared is None else shard_dense(m.shared, tp))


def shard_layer(layer: Layer, cfg: MLAConfig, tp: TensorParallel) -> Layer:
    """This rank's share of one decoder layer (its norms every rank's)."""
    mlp = layer.mlp
    return Layer(input_norm=layer.input_norm, attn=shard_attention(layer.attn, cfg, tp),
                 post_attn_norm=layer.post_attn_norm,
                 mlp=shard_moe(mlp, tp) if isinstance(mlp, MoE) else shard_dense(mlp, tp))


def _shard_vocab(params: Params, tp: TensorParallel) -> Params:
    """`params` with this rank's vocabulary rows of the embedding and lm_head, on `tp`."""
    vocab = tp.part(params.cfg.vocab_size)
    embed = _take(params.embed, lambda t: t[vocab])
    tied = params.lm_head is params.embed
    return replace(params, embed=embed, tp=tp,
                   lm_head=embed if tied else _take(params.lm_head, lambda t: t[vocab]))


def shard_params(params: Params, mesh: Any) -> Params:
    """This rank's share of `params` (whole, `params.tp` SINGLE) on `mesh`: a 1-D DeviceMesh,
    a ProcessGroup, or a `TensorParallel` (without a group: shards to inspect or compare, not
    to run). The result's `tp` names the group; `forward` then sums the shards."""
    tp = tensor_parallel(mesh)
    if params.tp.sharded:
        raise ParallelError(f"these parameters are already rank {params.tp.rank}'s shard of "
                            f"{params.tp.size}; shard the whole parameters")
    cfg = params.cfg
    check_shardable(cfg, tp)
    if not tp.sharded:
        return replace(params, tp=tp)
    layers = tuple(shard_layer(layer, cfg, tp) for layer in params.layers)
    return _shard_vocab(replace(params, layers=layers), tp)


def random_shard(cfg: MLAConfig, mesh: Any, seed: int = 0, device: "str | torch.device" = "cpu",
                 dtype: "torch.dtype | str" = torch.float32, weights: str = "bf16") -> Params:
    """This rank's share of random weights, exactly `shard_params(init_params(cfg, seed,
    device, dtype), mesh)` (of `quantize_fp8(...)` where `weights` is "fp8"), without the
    whole model on any rank: each layer is drawn whole (every rank draws the same numbers),
    quantised, cut to this rank's share, and freed before the next one (V3: 1.34 TB in bf16,
    its largest layer 22.5 GB)."""
    from mla_func.params import init_params
    from mla_func.quantize import quantize_fp8

    if weights not in ("bf16", "fp8"):
        raise ValueError(f"weights must be 'bf16' or 'fp8'; got {weights!r}")
    tp = tensor_parallel(mesh)
    check_shardable(cfg, tp)
    skeleton = init_params(cfg, device="meta", dtype=dtype)

    def own(i: int, layer: Layer) -> Layer:
        if weights == "fp8":  # quantised as the whole model's layer i would be
            # The params' device, read from the embedding: one element, viewed at its shape.
            here = layer.input_norm.new_empty(()).expand(skeleton.embed.shape)
            layer = quantize_fp8(replace(skeleton, embed=here, layers=(layer,))).layers[0]
        return shard_layer(layer, cfg, tp)

    return _shard_vocab(init_params(cfg, seed, device, dtype, layer_fn=own), tp)


def on_mesh(params: Params, mesh: Any) -> Params:
    """`params` to run on `mesh` (None: as they are): whole ones sharded for it, shards of
    the same group as they are; shards of another group raise."""
    if mesh is None:
        return params
    tp = tensor_parallel(mesh)
    if not params.tp.sharded:
        return shard_params(params, tp)
    if params.tp != tp:
        raise ParallelError(f"these parameters are rank {params.tp.rank} of {params.tp.size} "
                            f"in group {params.tp.group!r}, not of the mesh given (rank "
                            f"{tp.rank} of {tp.size}, group {tp.group!r})")
    return params
