"""Model configuration: `MLAConfig`, a frozen dataclass with HF `config.json` field names.

References: DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437) technical reports;
the field names and defaults follow HF transformers' `DeepseekV2Config` / `DeepseekV3Config`.
This module owns the configuration, its validation, the presets, and `from_hf()`.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ROUTING_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


class ConfigError(ValueError):
    """A configuration that cannot describe a valid MLA model."""


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN magnitude scale: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class MLAConfig:
    model_type: str = "deepseek_v2"
    vocab_size: int = 102400
    hidden_size: int = 2048
    intermediate_size: int = 10944
    moe_intermediate_size: int = 1408
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    kv_lora_rank: int = 512
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    n_routed_experts: int | None = 64
    n_shared_experts: int | None = 2
    num_experts_per_tok: int | None = 6
    first_k_dense_replace: int = 1
    topk_method: str = "greedy"
    n_group: int | None = 1
    topk_group: int | None = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 163840
    rope_theta: float = 10000.0
    # HF's rope_scaling dict (type "yarn", factor, mscale, mscale_all_dim, ...) or None.
    rope_scaling: Mapping[str, Any] | None = field(default=None, hash=False)
    # Describes a checkpoint's rope layout. The model always rotates interleaved pairs;
    # load_hf reorders a False checkpoint's rope rows and returns True.
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 100000
    eos_token_id: int | None = 100001

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived sizes (the static dims of dims.py bind to these) ----
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values stored per token per layer in the cache: [c_kv, k_pe]."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def num_moe_layers(self) -> int:
        if not self.n_routed_experts:
            return 0
        return self.num_hidden_layers - self.first_k_dense_replace

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.n_routed_experts) and layer >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (as HF does)."""
        scale = self.qk_head_dim**-0.5
        rs = self.rope_scaling or {}
        if rs.get("type", rs.get("rope_type", "default")) != "default":
            all_dim = rs.get("mscale_all_dim", 0)
            if all_dim:
                m = yarn_mscale(float(rs["factor"]), float(all_dim))
                scale *= m * m
        return scale

    def validate(self) -> None:
        errors: list[str] = []

        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                errors.append(f"{name} must be a positive int, got {value!r}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "max_position_embeddings"):
            positive(name)
        if self.qk_rope_head_dim % 2:
            errors.append(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None:
            positive("q_lora_rank")
        if self.model_type not in ("deepseek_v2", "deepseek_v3"):
            errors.append(f"model_type must be deepseek_v2 or deepseek_v3, got {self.model_type!r}")
        if self.n_routed_experts:
            grouped = self.topk_method != "greedy"
            for name in ("moe_intermediate_size", "num_experts_per_tok") + (
                    ("n_group", "topk_group") if grouped else ()):
                positive(name)
            if self.topk_method not in ROUTING_METHODS:
                errors.append(f"topk_method must be one of {ROUTING_METHODS}, "
                              f"got {self.topk_method!r}")
            if not errors:
                if self.num_experts_per_tok > self.n_routed_experts:
                    errors.append(f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                                  f"n_routed_experts={self.n_routed_experts}")
                if grouped and self.n_routed_experts % self.n_group:
                    errors.append(f"n_routed_experts={self.n_routed_experts} is not divisible "
                                  f"by n_group={self.n_group}")
                if grouped and self.topk_group > self.n_group:
                    errors.append(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
                per_group = self.n_routed_experts // (self.n_group or 1)
                if self.topk_method == "noaux_tc" and per_group < 2:
                    errors.append("noaux_tc ranks groups by their top-2 scores: "
                                  "needs at least 2 experts per group")
                if grouped and (
                        self.topk_group * per_group < self.num_experts_per_tok):
                    errors.append("topk_group groups hold fewer experts than num_experts_per_tok")
            if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
                errors.append(f"first_k_dense_replace={self.first_k_dense_replace} outside "
                              f"0..num_hidden_layers")
        rs = self.rope_scaling
        if rs is not None:
            kind = rs.get("type", rs.get("rope_type", "default"))
            if kind not in ("yarn", "default"):
                errors.append(f"rope_scaling type {kind!r} is not supported (yarn or default)")
            if kind == "yarn" and "factor" not in rs:
                errors.append("yarn rope_scaling needs a 'factor'")
        if errors:
            raise ConfigError("invalid MLAConfig: " + "; ".join(errors))

    def digest(self) -> str:
        """A short stable hash of every field (for artifacts)."""
        import hashlib

        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rope_scaling"] = dict(self.rope_scaling) if self.rope_scaling else None
        return out

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict that transformers' DeepseekV2/V3 configs accept."""
        out = self.to_dict()
        out["num_key_value_heads"] = self.num_attention_heads
        out["hidden_act"] = "silu"
        out["architectures"] = [
            "DeepseekV2ForCausalLM" if self.model_type == "deepseek_v2"
            else "DeepseekV3ForCausalLM"]
        if self.model_type == "deepseek_v3":
            out["scoring_func"] = "sigmoid"
        return out

    def with_(self, **changes: Any) -> "MLAConfig":
        return replace(self, **changes)

    @staticmethod
    def preset(name: str) -> "MLAConfig":
        from mla_func.presets import PRESETS

        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
        return PRESETS[name]

    @staticmethod
    def from_hf(source: "str | Path | Mapping[str, Any]") -> "MLAConfig":
        """From a config.json path, its directory, or a dict (hub or transformers-5 layout)."""
        if isinstance(source, Mapping):
            raw = dict(source)
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ConfigError(f"no config.json at {path}")
            raw = json.loads(path.read_text())
        return _from_hf_dict(raw)


# transformers' DeepseekV2Config / DeepseekV3Config defaults (5.x) for architecture fields.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": dict(
        vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
        first_k_dense_replace=0, kv_lora_rank=512, q_lora_rank=1536, n_group=None,
        n_routed_experts=64, n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64,
        routed_scaling_factor=1.0, topk_group=None, topk_method="greedy", norm_topk_prob=False,
        v_head_dim=128, num_experts_per_tok=None, moe_intermediate_size=1407,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, rope_scaling=None),
    "deepseek_v3": dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, n_shared_experts=1, n_routed_experts=256,
        routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
        first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
        rope_interleave=True, rope_scaling=None),
}


def _from_hf_dict(raw: dict[str, Any]) -> MLAConfig:
    model_type = raw.get("model_type", "deepseek_v2")
    if model_type not in ("deepseek_v2", "deepseek_v3"):
        raise ConfigError(f"model_type {model_type!r} is not a DeepSeek-V2/V3 model")
    known = {f.name for f in fields(MLAConfig)}
    # Absent fields take transformers' defaults for the model type, not MLAConfig's.
    kwargs = {**_HF_DEFAULTS[model_type], **{k: v for k, v in raw.items() if k in known}}
    kwargs["model_type"] = model_type
    if raw.get("num_key_value_heads") not in (None, raw.get("num_attention_heads")):
        raise ConfigError("MLA needs num_key_value_heads == num_attention_heads")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {raw['hidden_act']!r} is not supported (silu)")
    # transformers 5 folds rope_theta and the scaling into rope_parameters.
    params = raw.get("rope_parameters")
    if params:
        params = dict(params)
        kwargs["rope_theta"] = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
        kind = params.get("rope_type", params.get("type", "default"))
        kwargs["rope_scaling"] = None if kind == "default" else params
    elif raw.get("rope_scaling"):
        kwargs["rope_scaling"] = dict(raw["rope_scaling"])
    if model_type == "deepseek_v3":
        kwargs["topk_method"] = "noaux_tc"
        kwargs.setdefault("norm_topk_prob", True)
    if isinstance(kwargs.get("eos_token_id"), list):
        kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
    return MLAConfig(**kwargs)
