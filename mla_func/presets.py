"""Named configurations: `tiny` (CPU tests), `v2-lite` (DeepSeek-V2-Lite), `v3` (DeepSeek-V3 shape).

Shapes from the models' published config.json files (deepseek-ai/DeepSeek-V2-Lite,
deepseek-ai/DeepSeek-V3); weights are never downloaded.

This module owns tables of `MLAConfig` field values, as plain data (it imports nothing from the
package): the presets, which `MLAConfig.preset(name)` in `mla_func.config` builds and validates,
and transformers' defaults per model type, which `MLAConfig.from_hf` fills absent fields with.
"""

from typing import Any

_V2_LITE_YARN = {
    "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707,
}

# name -> MLAConfig field values
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model_type="deepseek_v2", vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        topk_method="greedy", n_group=1, topk_group=1, max_position_embeddings=4096,
        rope_scaling={**_V2_LITE_YARN, "factor": 4.0, "original_max_position_embeddings": 512},
        bos_token_id=0, eos_token_id=1,
    ),
    "v2-lite": dict(
        model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
        moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
        kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
        first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1,
        norm_topk_prob=False, routed_scaling_factor=1.0, max_position_embeddings=163840,
        rope_theta=10000.0, rope_scaling=_V2_LITE_YARN, bos_token_id=100000,
        eos_token_id=100001,
    ),
    "v3": dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
        kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
        first_k_dense_replace=3, topk_method="noaux_tc", n_group=8, topk_group=4,
        norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=163840,
        rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                      "mscale_all_dim": 1.0},
        bos_token_id=0, eos_token_id=1,
    ),
}

# transformers' DeepseekV2Config / DeepseekV3Config defaults (5.x) for architecture fields:
# what `MLAConfig.from_hf` fills a config.json's absent fields with, per model type.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
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
