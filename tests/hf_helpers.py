"""Helpers for the HF-transformers parity tests: tiny random DeepseekV2/V3ForCausalLM models
saved as checkpoints, and a small driver that runs our step function over a schedule of mixed
batches (decodes first, prefills and prefill chunks after) on a paged cache."""

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import mla_func as mf
from mla_func.kernels.plan import KernelOptions

YARN = {"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}


def hf_model(version: int, rope_style: str = "tf5", yarn: dict | None = None, seed: int = 0,
             **overrides: Any) -> torch.nn.Module:
    """A tiny float32 DeepseekV{2,3}ForCausalLM with every weight and buffer randomised.

    rope_style "hub": the config gets `rope_scaling` + `rope_theta` (the hub's config.json);
    "tf5": `rope_parameters` (transformers 5). yarn={} means plain rope, no scaling."""
    from transformers import (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
    )

    kw: dict[str, Any] = dict(
        vocab_size=128, hidden_size=48, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
        q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        max_position_embeddings=256, routed_scaling_factor=1.0, rms_norm_eps=1e-6,
        bos_token_id=0, eos_token_id=1)
    kw.update(overrides)
    yarn = YARN if yarn is None else yarn
    kind = "yarn" if yarn else "default"
    if rope_style == "hub":
        kw.update(rope_scaling={"type": kind, **yarn} if yarn else None, rope_theta=10000.0)
    else:
        kw.update(rope_parameters={"rope_type": kind, "rope_theta": 10000.0, **yarn})
    config_cls, model_cls = ((DeepseekV2Config, DeepseekV2ForCausalLM) if version == 2
                             else (DeepseekV3Config, DeepseekV3ForCausalLM))
    config = config_cls(**kw)
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    randomize_(model, seed)
    return model


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int) -> None:
    """HF init gives norms all ones, e_score_correction_bias zeros and std-0.02 weights (near
    uniform routing, near-zero logits): replace all of it so every parameter matters."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=gen))
        elif name.endswith("mlp.gate.weight"):  # routers: decisive, not near-tied, scores
            p.copy_(2.0 * torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def save(model: torch.nn.Module, directory: Path, rope_style: str = "tf5") -> Path:
    """`save_pretrained`; with "hub", config.json is rewritten to the hub's rope fields."""
    model.save_pretrained(directory)
    if rope_style == "hub":
        path = directory / "config.json"
        raw = json.loads(path.read_text())
        rope = dict(raw.pop("rope_parameters"))
        raw["rope_theta"] = rope.pop("rope_theta")
        kind = rope.pop("rope_type", "default")
        rope.pop("type", None)
        raw["rope_scaling"] = {**rope, "type": kind} if kind != "default" else None
        path.write_text(json.dumps(raw, indent=2))
    return directory


@torch.no_grad()
def hf_last_logits(model: torch.nn.Module, tokens: Sequence[int]) -> Tensor:
    """HF logits of the last token, the whole sequence recomputed (no cache)."""
    return model(torch.tensor([list(tokens)])).logits[0, -1].float()


@dataclass
class Runner:
    """Our model over a paged cache; sequences grow step by step. `backend`: the attention
    backend the batches name."""

    params: mf.Params
    page_size: int = 4
    num_pages: int = 64
    max_pages: int = 32
    backend: str = "torch"
    kernels: KernelOptions | None = None  # all the ops' implementations (default: the device's)
    tokens: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = mf.init_state(self.params.cfg, self.num_pages, self.page_size)

    def step(self, work: Sequence[tuple[int, Sequence[int]]]) -> dict[int, Tensor]:
        """work: (sequence id, new tokens), decodes first. Returns each sequence's logits."""
        seqs = []
        for seq, new in work:
            have = self.tokens.setdefault(seq, [])
            pages = self.state.allocator.reserve(seq, len(have) + len(new))
            seqs.append(mf.SeqWork(list(new), len(have), list(pages)))
            have.extend(new)
        batch = mf.make_batch(seqs, self.page_size, self.max_pages, backend=self.backend,
                              vocab_size=self.params.cfg.vocab_size, kernels=self.kernels)
        logits, self.state = mf.forward(self.params, self.state, batch)
        return {seq: logits[i] for i, (seq, _) in enumerate(work)}


def assert_logits_close(ours: Tensor, ref: Tensor, what: str, rel: float = 1e-4) -> None:
    """Within `rel` of the reference's scale, and ours ranks HF's greedy token first."""
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= rel * scale, f"{what}: max |ours - hf| = {err:.3g} > {rel} x {scale:.3g}"
    top = int(ref.argmax())
    assert ours[top] >= ours.max() - 2 * rel * scale, f"{what}: greedy token differs"
