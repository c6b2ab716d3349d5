"""Model configuration: `MLAConfig`, a frozen dataclass with HF `config.json` field names.

References: DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437) technical reports;
the field names and defaults follow HF transformers' `DeepseekV2Config` / `DeepseekV3Config`.
This module owns the configuration, its validation, `from_hf()`, and the lookup of the
presets by name (`MLAConfig.preset`; their values live in `mla_func.presets`).
"""

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from numbers import Real
from pathlib import Path
from typing import Any

from mla_func.presets import HF_DEFAULTS, PRESETS

ROUTING_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
# Numeric YaRN fields; each may be absent or null (HF falls back to a default).
_YARN_NUMBERS = ("mscale", "mscale_all_dim", "beta_fast", "beta_slow",
                 "original_max_position_embeddings")


class ConfigError(ValueError):
    """A configuration that cannot describe a valid MLA model."""


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN magnitude scale: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    # bool is an int to Python, but `rope_theta: true` in a config.json is a mistake, not 1.
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def read_config_json(source: "str | Path") -> dict[str, Any]:
    """The dict in a config.json, given the file or its directory; ConfigError naming the path
    if it is absent, not JSON, or not a JSON object."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json at {path}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} holds a JSON {type(raw).__name__}, not an object")
    return raw


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
    # A config.json may give eos_token_id as a list; generation stops at any of them. The first
    # stays in eos_token_id (what single-id code reads), the rest live here; see eos_token_ids.
    extra_eos_token_ids: tuple[int, ...] = ()

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

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: eos_token_id, then extra_eos_token_ids."""
        if self.eos_token_id is None:
            return ()
        return (self.eos_token_id, *self.extra_eos_token_ids)

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
        if _is_int(self.qk_rope_head_dim) and self.qk_rope_head_dim % 2:
            errors.append(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None:
            positive("q_lora_rank")
        if self.model_type not in ("deepseek_v2", "deepseek_v3"):
            errors.append(f"model_type must be deepseek_v2 or deepseek_v3, got {self.model_type!r}")
        if self.n_routed_experts:
            grouped = self.topk_method != "greedy"
            for name in ("n_routed_experts", "moe_intermediate_size", "num_experts_per_tok") + (
                    ("n_group", "topk_group") if grouped else ()):
                positive(name)
            if self.topk_method not in ROUTING_METHODS:
                errors.append(f"topk_method must be one of {ROUTING_METHODS}, "
                              f"got {self.topk_method!r}")
            if not _is_real(self.routed_scaling_factor) or self.routed_scaling_factor <= 0:
                errors.append(f"routed_scaling_factor must be a number > 0, "
                              f"got {self.routed_scaling_factor!r}")
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
            k = self.first_k_dense_replace
            if not errors and _is_int(k) and k > self.num_hidden_layers:
                errors.append(f"first_k_dense_replace={self.first_k_dense_replace} outside "
                              f"0..num_hidden_layers")
        self._validate_numbers(errors)
        # A string "false" in a hand-edited config.json is truthy: it would flip the routing's
        # normalisation or the rope layout without a word.
        errors += [f"{name} must be true or false, got {getattr(self, name)!r}" for name in
                   ("norm_topk_prob", "rope_interleave", "tie_word_embeddings")
                   if not isinstance(getattr(self, name), bool)]
        if errors:
            raise ConfigError("invalid MLAConfig: " + "; ".join(errors))

    def _validate_numbers(self, errors: list[str]) -> None:
        """Norm, rope, expert-count and token-id fields: appends one message per bad field."""
        if not _is_real(self.rms_norm_eps) or self.rms_norm_eps < 0:
            errors.append(f"rms_norm_eps must be a number >= 0, got {self.rms_norm_eps!r}")
        if not _is_real(self.rope_theta) or self.rope_theta <= 0:
            errors.append(f"rope_theta must be a number > 0, got {self.rope_theta!r}")
        # HF's DeepseekV2Config allows n_shared_experts=None (no shared experts).
        for name, value in (("first_k_dense_replace", self.first_k_dense_replace),
                            ("n_shared_experts", 0 if self.n_shared_experts is None
                             else self.n_shared_experts)):
            if not _is_int(value) or value < 0:
                errors.append(f"{name} must be an int >= 0, got {getattr(self, name)!r}")
        rs = self.rope_scaling
        if rs is not None and not isinstance(rs, Mapping):
            errors.append(f"rope_scaling must be a mapping or None, got {rs!r}")
        elif rs is not None:
            kind = rs.get("type", rs.get("rope_type", "default"))
            if kind not in ("yarn", "default"):
                errors.append(f"rope_scaling type {kind!r} is not supported (yarn or default)")
            if kind == "yarn" and "factor" not in rs:
                errors.append("yarn rope_scaling needs a 'factor'")
            elif kind == "yarn" and (not _is_real(rs["factor"]) or rs["factor"] <= 0):
                errors.append(f"rope_scaling factor must be a number > 0, got {rs['factor']!r}")
            errors += [f"rope_scaling {k} must be a number, got {rs[k]!r}" for k in
                       _YARN_NUMBERS if kind == "yarn" and rs.get(k) is not None
                       and not _is_real(rs[k])]
        vocab = self.vocab_size if _is_int(self.vocab_size) else None
        extra = self.extra_eos_token_ids
        if not isinstance(extra, tuple):
            errors.append(f"extra_eos_token_ids must be a tuple of ints, got {extra!r}")
            extra = ()
        elif extra and self.eos_token_id is None:
            errors.append("extra_eos_token_ids needs an eos_token_id (the first eos id)")
        ids = [("bos_token_id", self.bos_token_id), ("eos_token_id", self.eos_token_id)]
        for name, value in ids + [("extra_eos_token_ids", i) for i in extra]:
            if value is not None and not (
                    _is_int(value) and (vocab is None or 0 <= value < vocab)):
                errors.append(f"{name} must be None or an int in [0, vocab_size={vocab}), "
                              f"got {value!r}")

    def digest(self) -> str:
        """A short stable hash of every field (for artifacts)."""
        import hashlib

        out = self.to_dict()
        if not out["extra_eos_token_ids"]:
            # Absent before the field existed: configs without extra ids keep their digest.
            del out["extra_eos_token_ids"]
        text = json.dumps(out, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rope_scaling"] = dict(self.rope_scaling) if self.rope_scaling else None
        out["extra_eos_token_ids"] = list(self.extra_eos_token_ids)
        return out

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict that transformers' DeepseekV2/V3 configs accept."""
        out = self.to_dict()
        # HF spells several stop ids as one eos_token_id list.
        if out.pop("extra_eos_token_ids"):
            out["eos_token_id"] = list(self.eos_token_ids)
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
    @cache  # one object per name, as a table of configurations would hold
    def preset(name: str) -> "MLAConfig":
        """A named configuration (`mla_func.presets`: the field values)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
        return MLAConfig(**PRESETS[name])

    @staticmethod
    def from_hf(source: "str | Path | Mapping[str, Any]") -> "MLAConfig":
        """From a config.json path, its directory, or a dict (hub or transformers-5 layout).
        ConfigError if the file is absent or not JSON, or the config is invalid (naming the
        path where there is one)."""
        if isinstance(source, Mapping):
            return _from_hf_dict(dict(source))
        raw = read_config_json(source)
        try:
            return _from_hf_dict(raw)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from e


# The sizes of the weights: a config.json without one would take transformers' default (V3's
# hidden_size 7168, say) and then fail on every weight; it is refused, naming each.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim")
MOE_SHAPE_FIELDS = ("moe_intermediate_size", "num_experts_per_tok")


def _from_hf_dict(raw: dict[str, Any]) -> MLAConfig:
    model_type = raw.get("model_type", "deepseek_v2")
    if model_type not in ("deepseek_v2", "deepseek_v3"):
        raise ConfigError(f"model_type {model_type!r} is not a DeepSeek-V2/V3 model")
    required = SHAPE_FIELDS + (MOE_SHAPE_FIELDS if raw.get("n_routed_experts") else ())
    missing = [f for f in required if f not in raw]
    if missing:
        raise ConfigError(f"the config lacks the shape field(s) {', '.join(missing)}: each "
                          "sizes weights, so none takes a default")
    known = {f.name for f in fields(MLAConfig)}
    # Absent fields take transformers' defaults for the model type, not MLAConfig's.
    kwargs = {**HF_DEFAULTS[model_type], **{k: v for k, v in raw.items() if k in known}}
    kwargs["model_type"] = model_type
    if raw.get("num_key_value_heads") not in (None, raw.get("num_attention_heads")):
        raise ConfigError("MLA needs num_key_value_heads == num_attention_heads")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {raw['hidden_act']!r} is not supported (silu)")
    # transformers 5 folds rope_theta and the scaling into rope_parameters.
    params = raw.get("rope_parameters")
    if params and not isinstance(params, Mapping):
        raise ConfigError(f"rope_parameters must be a mapping, got {params!r}")
    if params:
        params = dict(params)
        kwargs["rope_theta"] = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default"))
        kwargs["rope_scaling"] = None if kind == "default" else params
    elif isinstance(raw.get("rope_scaling"), Mapping):
        kwargs["rope_scaling"] = dict(raw["rope_scaling"])
    elif not raw.get("rope_scaling"):
        kwargs["rope_scaling"] = None
    if model_type == "deepseek_v3":
        kwargs["topk_method"] = "noaux_tc"
    # JSON writes 10000.0 as 10000: float fields take ints as floats (other values are left
    # for validate to name).
    for f in fields(MLAConfig):
        if f.type is float and _is_int(kwargs.get(f.name)):
            kwargs[f.name] = float(kwargs[f.name])
    eos = kwargs.get("eos_token_id")
    if isinstance(eos, list | tuple):
        kwargs["eos_token_id"] = eos[0] if eos else None
        kwargs["extra_eos_token_ids"] = tuple(eos[1:])
    elif isinstance(kwargs.get("extra_eos_token_ids"), list):  # a to_dict() round trip
        kwargs["extra_eos_token_ids"] = tuple(kwargs["extra_eos_token_ids"])
    return MLAConfig(**kwargs)
