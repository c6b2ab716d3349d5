import json

import jaxtyping
import pytest
import torch

import mla_func as mf
from mla_func.config import SHAPE_FIELDS, ConfigError


def test_presets_have_the_published_shapes():
    lite = mf.MLAConfig.preset("v2-lite")
    assert (lite.num_hidden_layers, lite.hidden_size, lite.num_attention_heads) == (27, 2048, 16)
    assert (lite.kv_lora_rank, lite.qk_rope_head_dim, lite.qk_nope_head_dim) == (512, 64, 128)
    assert lite.q_lora_rank is None and lite.latent_dim == 576
    assert (lite.n_routed_experts, lite.num_experts_per_tok, lite.n_shared_experts) == (64, 6, 2)
    assert (lite.moe_intermediate_size, lite.intermediate_size, lite.vocab_size) == (
        1408, 10944, 102400)
    assert lite.softmax_scale == pytest.approx(0.11472, abs=1e-5)
    v3 = mf.MLAConfig.preset("v3")
    assert (v3.num_hidden_layers, v3.hidden_size, v3.num_attention_heads) == (61, 7168, 128)
    assert (v3.q_lora_rank, v3.n_routed_experts, v3.num_experts_per_tok) == (1536, 256, 8)
    assert (v3.topk_method, v3.n_group, v3.topk_group) == ("noaux_tc", 8, 4)
    assert v3.routed_scaling_factor == 2.5 and v3.vocab_size == 129280
    with pytest.raises(ConfigError, match="unknown preset"):
        mf.MLAConfig.preset("v4")


def test_from_hf_reads_both_rope_layouts(tmp_path):
    base = mf.MLAConfig.preset("v2-lite").to_hf_dict()
    assert mf.MLAConfig.from_hf(base) == mf.MLAConfig.preset("v2-lite")
    tf5 = dict(base)
    scaling = dict(tf5.pop("rope_scaling"))
    scaling["rope_type"] = scaling.pop("type")
    tf5["rope_parameters"] = {**scaling, "rope_theta": tf5.pop("rope_theta")}
    cfg = mf.MLAConfig.from_hf(tf5)
    assert cfg.rope_theta == 10000.0
    assert cfg.softmax_scale == pytest.approx(mf.MLAConfig.preset("v2-lite").softmax_scale)
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert mf.MLAConfig.from_hf(tmp_path) == mf.MLAConfig.from_hf(tmp_path / "config.json")


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 100}, "exceeds n_routed_experts"),
    ({"topk_method": "best"}, "topk_method"),
    ({"qk_rope_head_dim": 7}, "even"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"topk_method": "group_limited_greedy", "n_group": 3}, "divisible"),
])
def test_invalid_configs_name_the_problem(change, message):
    with pytest.raises(ConfigError, match=message):
        mf.MLAConfig.preset("v2-lite").with_(**change)


def test_from_hf_rejects_other_models():
    with pytest.raises(ConfigError, match="llama"):
        mf.MLAConfig.from_hf({"model_type": "llama"})


def test_from_hf_fills_absent_fields_with_transformers_defaults():
    shapes = {k: v for k, v in mf.MLAConfig.preset("v3").to_hf_dict().items()
              if k in SHAPE_FIELDS}
    v3 = mf.MLAConfig.from_hf({"model_type": "deepseek_v3", **shapes, "num_hidden_layers": 4})
    assert (v3.n_group, v3.topk_group, v3.routed_scaling_factor) == (8, 4, 2.5)
    assert (v3.n_shared_experts, v3.first_k_dense_replace, v3.topk_method) == (1, 3, "noaux_tc")
    base = mf.MLAConfig.preset("v2-lite").to_hf_dict()
    del base["first_k_dense_replace"]
    assert mf.MLAConfig.from_hf(base).first_k_dense_replace == 0


def test_from_hf_refuses_absent_shape_fields():
    """A shape field left out would take transformers' default and mismatch every weight:
    refused, naming each (the MoE's sizes too where the config has routed experts)."""
    raw = mf.MLAConfig.preset("v2-lite").to_hf_dict()
    for gone in (("hidden_size",), ("hidden_size", "kv_lora_rank"), ("moe_intermediate_size",)):
        with pytest.raises(ConfigError, match="lacks the shape field[(]s[)] " + ", ".join(gone)):
            mf.MLAConfig.from_hf({k: v for k, v in raw.items() if k not in gone})


# The published config.json files (weights never downloaded), as the hub ships them: ints where
# a float would do (rope_theta 10000, factor 40), fields we do not read (aux_loss_alpha, ...).
V2_LITE_JSON = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 1.0,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "scoring_func": "softmax", "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1,
    "topk_method": "greedy", "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128,
    "vocab_size": 102400,
}
V3_JSON = {
    **V2_LITE_JSON, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4,
    "topk_method": "noaux_tc", "vocab_size": 129280,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
}


def test_published_configs_pass():
    assert mf.MLAConfig.from_hf(V2_LITE_JSON) == mf.MLAConfig.preset("v2-lite")
    assert mf.MLAConfig.from_hf(V3_JSON) == mf.MLAConfig.preset("v3")
    assert mf.MLAConfig.from_hf({**V2_LITE_JSON, "n_shared_experts": None}).n_shared_experts is None


YARN = mf.MLAConfig.preset("tiny").rope_scaling


@pytest.mark.parametrize("change, message", [
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be a number >= 0, got '1e-6'"),
    ({"rms_norm_eps": True}, "rms_norm_eps must be a number >= 0, got True"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a number >= 0, got -1e-06"),
    ({"rope_theta": 0.0}, "rope_theta must be a number > 0, got 0.0"),
    ({"rope_theta": float("nan")}, "rope_theta must be a number > 0, got nan"),
    ({"rope_scaling": "yarn"}, "rope_scaling must be a mapping or None, got 'yarn'"),
    ({"rope_scaling": {**YARN, "factor": 0}}, "rope_scaling factor must be a number > 0, got 0"),
    ({"rope_scaling": {**YARN, "factor": "4"}}, "factor must be a number > 0, got '4'"),
    ({"rope_scaling": {**YARN, "mscale": "big"}}, "rope_scaling mscale must be a number"),
    ({"routed_scaling_factor": 0}, "routed_scaling_factor must be a number > 0, got 0"),
    ({"n_shared_experts": -1}, "n_shared_experts must be an int >= 0, got -1"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace must be an int >= 0, got -1"),
    ({"first_k_dense_replace": "1"}, "first_k_dense_replace must be an int >= 0, got '1'"),
    ({"n_routed_experts": "8"}, "n_routed_experts must be a positive int, got '8'"),
    ({"bos_token_id": -1}, r"bos_token_id must be None or an int in \[0, vocab_size=256\)"),
    ({"eos_token_id": 256}, r"eos_token_id must be .* got 256"),
    ({"eos_token_id": 1.0}, r"eos_token_id must be .* got 1.0"),
    ({"extra_eos_token_ids": (2, 300)}, r"extra_eos_token_ids must be .* got 300"),
    ({"extra_eos_token_ids": [2]}, "extra_eos_token_ids must be a tuple of ints"),
    ({"eos_token_id": None, "extra_eos_token_ids": (2,)}, "needs an eos_token_id"),
    ({"norm_topk_prob": "false"}, "norm_topk_prob must be true or false, got 'false'"),
    ({"rope_interleave": 1}, "rope_interleave must be true or false, got 1"),
    ({"tie_word_embeddings": None}, "tie_word_embeddings must be true or false, got None"),
])
def test_invalid_number_fields_name_the_field_and_value(change, message, monkeypatch):
    # Outside tests nothing checks annotations: validate itself must catch a wrong type.
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)
    with pytest.raises(ConfigError, match=message):
        mf.MLAConfig.preset("tiny").with_(**change)


def test_dense_model_ignores_routing_numbers():
    dense = mf.MLAConfig.preset("tiny").with_(n_routed_experts=None, routed_scaling_factor=0.0)
    assert dense.num_moe_layers == 0


def test_eos_list_keeps_every_id(tmp_path):
    raw = {**mf.MLAConfig.preset("tiny").to_hf_dict(), "eos_token_id": [1, 7, 9]}
    cfg = mf.MLAConfig.from_hf(raw)
    assert cfg.eos_token_id == 1 and cfg.eos_token_ids == (1, 7, 9)
    assert cfg.to_hf_dict()["eos_token_id"] == [1, 7, 9]
    assert mf.MLAConfig.from_hf(cfg.to_hf_dict()) == cfg == mf.MLAConfig.from_hf(cfg.to_dict())
    assert cfg.digest() != mf.MLAConfig.preset("tiny").digest()
    one = mf.MLAConfig.from_hf({**raw, "eos_token_id": 1})
    assert one == mf.MLAConfig.preset("tiny") and one.eos_token_ids == (1,)
    assert mf.MLAConfig.from_hf({**raw, "eos_token_id": []}).eos_token_ids == ()


def test_bad_config_json_names_the_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{oops")
    with pytest.raises(ConfigError, match=f"{path} is not valid JSON"):
        mf.MLAConfig.from_hf(tmp_path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a JSON list"):
        mf.MLAConfig.from_hf(path)
    path.write_text(json.dumps({**V2_LITE_JSON, "rope_theta": -1}))
    with pytest.raises(ConfigError, match=f"{path}: .*rope_theta must be a number > 0"):
        mf.MLAConfig.from_hf(path)
    with pytest.raises(ConfigError, match="rope_parameters must be a mapping"):
        mf.MLAConfig.from_hf({**V2_LITE_JSON, "rope_parameters": 5})


def test_yarn_without_original_context_uses_the_model_context():
    """`original_max_position_embeddings` absent or null in a yarn rope_scaling (HF takes
    max_position_embeddings then): the frequencies are the same either way, and differ from
    those of a shorter original context (so the field is read at all)."""
    from dataclasses import replace

    from mla_func.params import yarn_inv_freq

    base = mf.MLAConfig.preset("tiny")
    rs = {"type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
          "mscale_all_dim": 1.0}
    explicit = replace(base, rope_scaling={**rs, "original_max_position_embeddings":
                                           base.max_position_embeddings})
    got = [yarn_inv_freq(replace(base, rope_scaling=r)) for r in
           ({**rs, "original_max_position_embeddings": None}, rs)]
    want = yarn_inv_freq(explicit)
    for g in got:
        torch.testing.assert_close(g, want, rtol=0, atol=0)
    shorter = replace(base, rope_scaling={**rs, "original_max_position_embeddings":
                                          base.max_position_embeddings // 4})
    assert not torch.equal(yarn_inv_freq(shorter), want)
