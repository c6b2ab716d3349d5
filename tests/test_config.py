import json

import pytest

import mla_func as mf
from mla_func.config import ConfigError


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
    v3 = mf.MLAConfig.from_hf({"model_type": "deepseek_v3", "num_hidden_layers": 4})
    assert (v3.n_group, v3.topk_group, v3.routed_scaling_factor) == (8, 4, 2.5)
    assert (v3.n_shared_experts, v3.first_k_dense_replace, v3.topk_method) == (1, 3, "noaux_tc")
    base = mf.MLAConfig.preset("v2-lite").to_hf_dict()
    del base["first_k_dense_replace"]
    assert mf.MLAConfig.from_hf(base).first_k_dense_replace == 0
