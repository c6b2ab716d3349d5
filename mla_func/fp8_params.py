"""Params' projection weights as one map: which fields are projections, and what precision
each kind of weight is in.

The projections (the weights a block-FP8 checkpoint stores in FP8, DeepSeek-V3's linear
layers) are `PROJECTIONS`; the router, the score bias, the norms, the embedding and lm_head are
not, and stay in the float dtype. Of the projections, block-FP8 params (`quantize_fp8`,
`load_hf(weights="fp8")`) hold the absorbed attention weights W_UK / W_UV (`ABSORBED`,
kv_b_proj's) in the float dtype too, as vLLM and SGLang do after loading: their products read
them as they are, where in FP8 every step dequantised or rescaled them (docs/DECISIONS.md,
`fp8_params.ABSORBED`); params built with them in FP8 still run. `map_projections` rebuilds
params with each projection replaced (quantized, dequantized, or a layout view for the
checkpoint writer); `weight_precisions` says per kind what the params hold, for plans and
artifacts.
"""

from collections.abc import Callable
from dataclasses import replace

from mla_func.fp8 import Fp8Weight, Weight
from mla_func.params import Attention, DenseMLP, MoE, Params

# Kind -> the fields of that kind's dataclass (`Attention`, a dense MLP, the routed experts
# of `MoE`, its shared experts' MLP).
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "attn": ("qkv_a_proj", "q_b_proj", "w_uk", "w_uv", "o_proj"),
    "mlp": ("gate_up", "down"),
    "experts": ("gate_up", "down"),
    "shared": ("gate_up", "down"),
}

# The projections block-FP8 params hold in the float dtype (kv_b_proj's W_UK / W_UV).
ABSORBED = ("attn.w_uk", "attn.w_uv")

WeightFn = Callable[[Weight, str], Weight]  # (weight, "kind.field") -> its replacement


def _map(obj: Attention | DenseMLP | MoE, kind: str, fn: WeightFn):
    changes = {f: fn(getattr(obj, f), f"{kind}.{f}") for f in PROJECTIONS[kind]
               if getattr(obj, f) is not None}
    return replace(obj, **changes)


def map_projections(params: Params, fn: WeightFn) -> Params:
    """`params` with each projection weight w replaced by fn(w, "kind.field"), e.g.
    fn(w, "attn.w_uk"); everything else is the same tensors."""
    layers = []
    for layer in params.layers:
        mlp = layer.mlp
        if isinstance(mlp, MoE):
            shared = None if mlp.shared is None else _map(mlp.shared, "shared", fn)
            mlp = replace(_map(mlp, "experts", fn), shared=shared)
        else:
            mlp = _map(mlp, "mlp", fn)
        layers.append(replace(layer, attn=_map(layer.attn, "attn", fn), mlp=mlp))
    return replace(params, layers=tuple(layers))


def precision(w: Weight) -> str:
    """"fp8 e4m3, block 128" or the float dtype's name ("bfloat16")."""
    if isinstance(w, Fp8Weight):
        return w.describe()
    return str(w.dtype).removeprefix("torch.")


def weight_precisions(params: Params) -> dict[str, str]:
    """Kind of weight -> its precision, e.g. {"attn.w_uk": "fp8 e4m3, block 128", ...,
    "router": "bfloat16"}; a kind whose layers differ lists each distinct one."""
    seen: dict[str, list[str]] = {}

    def note(w: Weight, kind: str) -> Weight:
        p = precision(w)
        if p not in seen.setdefault(kind, []):
            seen[kind].append(p)
        return w

    map_projections(params, note)
    for layer in params.layers:
        if isinstance(layer.mlp, MoE):
            note(layer.mlp.router, "router")
            if layer.mlp.score_bias is not None:
                note(layer.mlp.score_bias, "score_bias")
        note(layer.input_norm, "norms")
    note(params.embed, "embed")
    note(params.lm_head, "lm_head")
    return {kind: " | ".join(ps) for kind, ps in seen.items()}


def is_fp8(params: Params) -> bool:
    """Whether any projection is block FP8."""
    found: list[bool] = []

    def note(w: Weight, _: str) -> Weight:
        found.append(isinstance(w, Fp8Weight))
        return w

    map_projections(params, note)
    return any(found)


__all__ = ["PROJECTIONS", "is_fp8", "map_projections", "precision", "weight_precisions"]
