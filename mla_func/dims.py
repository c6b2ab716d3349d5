"""The dimension-name vocabulary.

One name, one meaning, everywhere: jaxtyping signatures, dataclass fields, docs and capture
artifacts. Static names bind to a config field; dynamic names carry a range and a bucket policy
that the capture compiler reads (`mla_func.capture` never hard-codes them: it asks this table, or
a table the caller passes).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mla_func.cache_fp8 import Fp8Layout
from mla_func.config import MLAConfig

Kind = Literal["static", "dynamic", "capacity", "weight"]


@dataclass(frozen=True)
class DimSpec:
    name: str
    kind: Kind
    doc: str
    # Dynamic dims: the largest size captured and the bucket policy's name.
    max_size: int | None = None
    policy: str | None = None


# On one device; a rank of a tensor-parallel group of n holds 1/n of the sharded axes
# (`static_sizes`, `mla_func.parallel.shard`).
STATIC_BINDINGS: dict[str, Callable[[MLAConfig], int]] = {
    "hidden": lambda c: c.hidden_size,
    "heads": lambda c: c.num_attention_heads,
    "qk_nope": lambda c: c.qk_nope_head_dim,
    "qk_rope": lambda c: c.qk_rope_head_dim,
    "qk_head": lambda c: c.qk_head_dim,
    "v_head": lambda c: c.v_head_dim,
    "kv_lora": lambda c: c.kv_lora_rank,
    "q_lora": lambda c: c.q_lora_rank or 0,
    "latent": lambda c: c.latent_dim,
    "cache_row": lambda c: Fp8Layout(c.kv_lora_rank, c.qk_rope_head_dim).row_bytes,
    "qkv_a": lambda c: (c.q_lora_rank or c.num_attention_heads * c.qk_head_dim) + c.latent_dim,
    "experts": lambda c: c.n_routed_experts or 0,
    "local_experts": lambda c: c.n_routed_experts or 0,
    "topk": lambda c: c.num_experts_per_tok or 0,
    "moe_inter": lambda c: c.moe_intermediate_size,
    "inter": lambda c: c.intermediate_size,
    "vocab": lambda c: c.vocab_size,
    "local_vocab": lambda c: c.vocab_size,
    "layers": lambda c: c.num_hidden_layers,
}

# Piecewise graphs stop at TOKENS_MAX_CAPTURED tokens; a larger step runs eagerly (the same
# results). Past it a graph saves the eager V2-Lite step nothing where the GPU bounds it, while
# padding to the next bucket (up to 12.5%) costs it; below it the eager step is bound by the
# host (docs/DECISIONS.md, `dims.TOKENS_MAX_CAPTURED`).
TOKENS_MAX_CAPTURED = 2560

VOCABULARY: dict[str, DimSpec] = {
    "tokens": DimSpec("tokens", "dynamic", "flattened tokens of one step", TOKENS_MAX_CAPTURED,
                      "bounded"),
    "seqs": DimSpec("seqs", "dynamic", "sequences in one step", 512, "bounded"),
    "pages": DimSpec("pages", "capacity", "cache pages, fixed at allocation"),
    "page_size": DimSpec("page_size", "capacity", "tokens per cache page"),
    "max_pages": DimSpec("max_pages", "capacity", "page-table width per sequence"),
    "counters": DimSpec("counters", "capacity", "the kernels' arrival-counter slots"),
    "hidden": DimSpec("hidden", "static", "model width (hidden_size)"),
    "heads": DimSpec("heads", "static", "attention heads (this rank's: heads / ranks)"),
    "qk_nope": DimSpec("qk_nope", "static", "per-head query/key width without rope"),
    "qk_rope": DimSpec("qk_rope", "static", "per-head rope width (shared key part)"),
    "qk_head": DimSpec("qk_head", "static", "per-head query/key width: qk_nope + qk_rope"),
    "v_head": DimSpec("v_head", "static", "per-head value width"),
    "kv_lora": DimSpec("kv_lora", "static", "compressed KV width (c_kv)"),
    "q_lora": DimSpec("q_lora", "static", "compressed query width"),
    "latent": DimSpec("latent", "static", "cached values per token per layer: kv_lora + qk_rope"),
    "cache_row": DimSpec("cache_row", "static",
                         "bytes of a token's row in the FP8 latent cache: kv_lora e4m3 values, "
                         "their float32 scales, qk_rope bf16 values (656 in V2/V3)"),
    "qkv_a": DimSpec("qkv_a", "static",
                     "rows of the fused input projection: the query's (heads x qk_head, or "
                     "q_lora) then latent"),
    "experts": DimSpec("experts", "static", "routed experts (the router's, all of them)"),
    "local_experts": DimSpec("local_experts", "static",
                             "routed experts this rank holds (experts / ranks)"),
    "topk": DimSpec("topk", "static", "experts per token"),
    "moe_inter": DimSpec("moe_inter", "static", "expert MLP width"),
    "inter": DimSpec("inter", "static", "dense MLP width (this rank's: inter / ranks)"),
    "vocab": DimSpec("vocab", "static", "vocabulary size"),
    "local_vocab": DimSpec("local_vocab", "static",
                           "vocabulary rows this rank holds (vocab / ranks)"),
    "layers": DimSpec("layers", "static", "decoder layers"),
    # A block-FP8 weight's layout (`fp8.Fp8Weight`): each weight binds its own sizes.
    "stack": DimSpec("stack", "weight", "matrices of one weight that share its layout "
                     "(experts, gate/up, heads)"),
    "width_out": DimSpec("width_out", "weight",
                         "a projection's output width (a linear layer's out_features)"),
    "width_in": DimSpec("width_in", "weight",
                        "a projection's input width (a linear layer's in_features)"),
    "blocks_out": DimSpec("blocks_out", "weight", "a block-FP8 weight's scales along width_out"),
    "blocks_in": DimSpec("blocks_in", "weight", "a block-FP8 weight's scales along width_in"),
}

DYNAMIC_DIMS: tuple[str, ...] = tuple(n for n, s in VOCABULARY.items() if s.kind == "dynamic")

# Axis names that only generic helpers and kernel internals use (no argument of `forward`, the
# function the capture compiler reads, has them), each with its one meaning; tests/test_dims.py
# checks that every annotation in the package uses these or the vocabulary, so that a synonym of
# a vocabulary name cannot creep in.
LOCAL_DIMS: dict[str, str] = {
    "width": "the last axis of a helper generic over it (a norm's: hidden, kv_lora or q_lora)",
    "rows": "leading axes a helper treats alike (*rows)",
    "pairs": "token-expert pairs of a MoE step: tokens x (topk + shared experts)",
    "aligned": "rows of the MoE's aligned layout: each expert's pairs padded to its M-tiles",
    "blocks": "M-tiles of the MoE's aligned layout",
    "groups": "expert groups of group-limited routing (n_group)",
    "shared": "shared experts seen as experts of width moe_inter",
    "act_groups": "runs of 128 columns of a block-FP8 GEMM's activations, a scale each",
}


# The axes a rank of a tensor-parallel group holds 1/ranks of (`mla_func.parallel.shard`).
SHARDED_DIMS = ("heads", "inter", "local_experts", "local_vocab")


def static_sizes(cfg: MLAConfig, ranks: int = 1) -> dict[str, int]:
    """Every static dim name bound to its size under `cfg`, on one rank of `ranks` (the
    sharded axes divided; `qkv_a` holds this rank's query rows)."""
    sizes = {name: bind(cfg) for name, bind in STATIC_BINDINGS.items()}
    for name in SHARDED_DIMS:
        sizes[name] //= ranks
    if not cfg.q_lora_rank:
        sizes["qkv_a"] = sizes["heads"] * cfg.qk_head_dim + cfg.latent_dim
    return sizes
