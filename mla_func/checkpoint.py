"""HF checkpoint loading: a safetensors directory (config.json + weights) -> `(MLAConfig, Params)`.

Names follow HF transformers' DeepseekV2/V3ForCausalLM. Two expert layouts are read: DeepSeek's
original one tensor per expert projection (`mlp.experts.{e}.gate_proj.weight`, what the hub
ships and what transformers' `save_pretrained` writes) and transformers 5's fused in-memory one
(`mlp.experts.gate_up_proj` [experts, 2*moe_inter, hidden], `mlp.experts.down_proj`). Weights may
be one file or sharded (`model.safetensors.index.json`), and block-FP8 with `weight_scale_inv`
(DeepSeek-V3's release format): dequantised on load, or kept in FP8 (`weights="fp8"`,
`checkpoint_fp8`). Reading the files is `checkpoint_read`'s. V3's multi-token-prediction layers
(indices num_hidden_layers .. +num_nextn_predict_layers) are skipped: inference does not use them.

Every key is checked against the config before a single tensor is read, and every problem
(missing, unexpected and mis-shaped keys) is reported in one `CheckpointError`. Tensors are then
read one at a time (`safe_open`) and converted to the target dtype and device, so beyond the
result, memory holds about one checkpoint tensor. The layout we map into is params.py's:
`kv_b_proj` is split once into the absorbed per-head W_UK / W_UV (arXiv:2405.04434, 2.1.2).
"""

import math
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mla_func.checkpoint_fp8 import attention_fields, experts_fields, mlp_fields
from mla_func.checkpoint_read import SCALE_SUFFIX, Reader, fp8_block, weight_files

# Writing lives in checkpoint_write.py; re-exported so that one import serves both directions.
from mla_func.checkpoint_write import INDEX_FILE, CheckpointError, hf_tensors, save_hf
from mla_func.config import MLAConfig, read_config_json
from mla_func.dtypes import resolve_dtype
from mla_func.parallel.group import SINGLE, TensorParallel, tensor_parallel
from mla_func.parallel.shard import check_shardable
from mla_func.params import Attention, DenseMLP, Layer, MoE, Params, yarn_inv_freq

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _mlp_keys(prefix: str, inter: int, hidden: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}gate_proj.weight": (inter, hidden),
            f"{prefix}up_proj.weight": (inter, hidden),
            f"{prefix}down_proj.weight": (hidden, inter)}


def expected_shapes(cfg: MLAConfig, fused_layers: frozenset[int] = frozenset()
                    ) -> dict[str, tuple[int, ...]]:
    """Every key a checkpoint for `cfg` holds, with its shape; MoE layers in `fused_layers`
    use transformers' fused expert tensors, the others DeepSeek's per-expert naming."""
    c, h, heads = cfg, cfg.hidden_size, cfg.num_attention_heads
    out = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if c.q_lora_rank is None:
            out[a + "q_proj.weight"] = (heads * c.qk_head_dim, h)
        else:
            out[a + "q_a_proj.weight"] = (c.q_lora_rank, h)
            out[a + "q_a_layernorm.weight"] = (c.q_lora_rank,)
            out[a + "q_b_proj.weight"] = (heads * c.qk_head_dim, c.q_lora_rank)
        out[a + "kv_a_proj_with_mqa.weight"] = (c.latent_dim, h)
        out[a + "kv_a_layernorm.weight"] = (c.kv_lora_rank,)
        out[a + "kv_b_proj.weight"] = (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
        out[a + "o_proj.weight"] = (h, heads * c.v_head_dim)
        if not c.is_moe_layer(i):
            out.update(_mlp_keys(m, c.intermediate_size, h))
            continue
        e, inter = c.n_routed_experts, c.moe_intermediate_size
        out[m + "gate.weight"] = (e, h)
        if c.topk_method == "noaux_tc":
            out[m + "gate.e_score_correction_bias"] = (e,)
        if i in fused_layers:
            out[m + "experts.gate_up_proj"] = (e, 2 * inter, h)
            out[m + "experts.down_proj"] = (e, h, inter)
        else:
            for j in range(e):
                out.update(_mlp_keys(f"{m}experts.{j}.", inter, h))
        if c.n_shared_experts:
            out.update(_mlp_keys(m + "shared_experts.", inter * c.n_shared_experts, h))
    return out


def _ignored(key: str, cfg: MLAConfig, mtp_layers: int) -> bool:
    """Keys a checkpoint may carry that inference does not use."""
    match = _LAYER.match(key)
    if match and cfg.num_hidden_layers <= int(match[1]) < cfg.num_hidden_layers + mtp_layers:
        return True  # V3 multi-token-prediction module
    if key.endswith("rotary_emb.inv_freq"):
        return True  # a buffer some old exports saved; recomputed from the config
    # Tied embeddings: like transformers, use the embedding and drop a stored lm_head copy.
    return key == "lm_head.weight" and cfg.tie_word_embeddings


def _check(cfg: MLAConfig, reader: Reader, mtp_layers: int, where: Path) -> None:
    fused = frozenset(i for i in range(cfg.num_hidden_layers)
                      if f"model.layers.{i}.mlp.experts.gate_up_proj" in reader.shapes)
    expected = expected_shapes(cfg, fused)
    found = reader.shapes
    (bo, bi) = reader.block
    for key in expected:
        if key + SCALE_SUFFIX in found and len(expected[key]) == 2:
            reader.fp8.add(key)
    scales = {k + SCALE_SUFFIX: (math.ceil(expected[k][0] / bo), math.ceil(expected[k][1] / bi))
              for k in reader.fp8}
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected and k not in scales
                  and not _ignored(k, cfg, mtp_layers)]
    mismatched = [f"{k}: expected {list(s)}, found {list(found[k])}"
                  for k, s in {**expected, **scales}.items() if k in found and found[k] != s]
    mismatched += [f"{k}: {reader.dtypes[k]} without {k}{SCALE_SUFFIX}" for k in expected
                   if reader.dtypes.get(k, "").startswith("F8") and k not in reader.fp8]
    if not (missing or unexpected or mismatched):
        return
    parts = [f"{len(v)} {name}: " + ", ".join(v[:SHOWN]) + (
             f", and {len(v) - SHOWN} more" if len(v) > SHOWN else "") for name, v in
             (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)) if v]
    summary = (f"{cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
               f"q_lora {cfg.q_lora_rank}, experts {cfg.n_routed_experts}")
    blame = _disagreeing_fields(cfg, {k: (expected[k], found[k]) for k in expected
                                      if k in found and found[k] != expected[k]})
    raise CheckpointError(f"weights in {where} do not match config.json ({summary}): "
                          + "; ".join(parts) + blame, missing, unexpected, mismatched)


SHOWN = 4  # keys a list in the error names before it counts the rest
# Config fields that size weights, asked which of them a wrong shape disagrees with.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "n_routed_experts")


def _disagreeing_fields(cfg: MLAConfig, wrong: dict[str, tuple[tuple, tuple]]) -> str:
    """'; config field(s) that may disagree with the weights: F = a (the weights: b), ...':
    the fields (and heads x a per-head field) whose size is an axis where the config's shape
    and the weights' differ."""
    sizes = {name: getattr(cfg, name) for name in SIZE_FIELDS}
    heads = cfg.num_attention_heads
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        sizes[f"num_attention_heads x {name}"] = heads * getattr(cfg, name)
    seen: dict[str, set[int]] = {}
    for want, got in wrong.values():
        for a, b in zip(want, got, strict=False):
            if a != b:
                for name, size in sizes.items():
                    if size == a:
                        seen.setdefault(f"{name} = {a}", set()).add(b)
    if not seen:
        return ""
    return "; config field(s) that may disagree with the weights: " + ", ".join(
        f"{k} (the weights: {', '.join(map(str, sorted(v)))})" for k, v in sorted(seen.items()))


def load_hf(
    directory: "str | Path", device: "str | torch.device" = "cpu",
    dtype: "torch.dtype | str" = torch.float32, mesh: Any = None,
    weights: str = "bf16",
) -> tuple[MLAConfig, Params]:
    """Config and parameters of an HF DeepSeek-V2/V3 checkpoint directory (or its config.json,
    as `MLAConfig.from_hf` takes), each tensor cast to `dtype` on `device` (V3's
    e_score_correction_bias stays float32, as in transformers). Raises, before reading any
    tensor, ConfigError for an absent or invalid config.json and CheckpointError for unreadable
    weights or weights that do not match the config (listing every bad key). A
    rope_interleave=False checkpoint comes back interleaved. `dtype`: a floating-point
    torch.dtype or its name (`dtypes.DTYPES`). `mesh` (a 1-D DeviceMesh, ProcessGroup or
    `parallel.TensorParallel`): this rank's shard only (`parallel.shard_params`' split), read
    as slices of the files: no rank reads or holds the whole model. `weights`: "bf16" (the
    default) gives every weight in `dtype`, block-FP8 ones dequantised; "fp8" keeps the
    projections (all but the router, the embedding and lm_head) in block FP8 as stored, scales
    and all (`fp8.Fp8Weight`, `checkpoint_fp8`; a matrix stored in a float dtype is quantized
    on the checkpoint's block grid, 128 x 128 without a quantization_config), but for
    kv_b_proj's W_UK / W_UV: in `dtype`, dequantised (`fp8_params.ABSORBED`)."""
    if weights not in ("bf16", "fp8"):
        raise ValueError(f"load_hf's weights must be 'bf16' or 'fp8'; got {weights!r}")
    dtype = resolve_dtype(dtype, "load_hf's dtype")
    directory, device = Path(directory), torch.device(device)
    if directory.name == "config.json" and directory.is_file():
        directory = directory.parent
    elif directory.is_file():
        raise CheckpointError(f"{directory} is a file: load_hf takes a checkpoint directory "
                              "or its config.json")
    tp = SINGLE if mesh is None else tensor_parallel(mesh)
    raw = read_config_json(directory)
    cfg = MLAConfig.from_hf(directory)
    check_shardable(cfg, tp)
    mtp_layers = int(raw.get("num_nextn_predict_layers", raw.get("num_mtp_layers", 0)) or 0)
    with ExitStack() as stack:
        reader = Reader(weight_files(directory), stack, fp8_block(raw))
        _check(cfg, reader, mtp_layers, directory)
        if not cfg.rope_interleave:
            # HF's rope_interleave=False rotates pairs (i, i + qk_rope/2); we rotate (2i, 2i+1).
            # Permuting the rope rows of q and k_pe alike turns one into the other and leaves
            # every q_pe . k_pe unchanged, so the loaded weights are in the interleaved layout.
            half = cfg.qk_rope_head_dim // 2
            reader.rope_perm = torch.stack((torch.arange(half), torch.arange(half) + half),
                                           dim=-1).flatten()
            cfg = cfg.with_(rope_interleave=True)
        return cfg, _build(cfg, reader, device, dtype, tp, weights == "fp8")


def _build(cfg: MLAConfig, reader: Reader, device: torch.device, dtype: torch.dtype,
           tp: TensorParallel, fp8: bool = False) -> Params:
    """Params from `reader`; `fp8`: the projections in block FP8 (`checkpoint_fp8`)."""
    c, heads = cfg, cfg.num_attention_heads // tp.size  # this rank's

    def get(key: str, rows: slice | None = None, cols: slice | None = None) -> Tensor:
        return reader.get(key, device, dtype, rows, cols)

    def mlp(prefix: str, out: Tensor | None = None, split: bool = False
            ) -> tuple[Tensor, Tensor]:
        """gate_up, down; `split`: this rank's share of the width (else all of it)."""
        width = reader.shapes[prefix + "gate_proj.weight"][0]
        inter = tp.part(width) if split else None
        gate = get(prefix + "gate_proj.weight", inter)
        gate_up = out if out is not None else gate.new_empty((2, *gate.shape))
        gate_up[0].copy_(gate)
        del gate
        gate_up[1].copy_(get(prefix + "up_proj.weight", inter))
        return gate_up, get(prefix + "down_proj.weight", None, inter)

    def dense(prefix: str) -> DenseMLP:
        if fp8:
            return DenseMLP(*mlp_fields(reader, prefix, tp, device))
        return DenseMLP(*mlp(prefix, split=True))

    def moe(m: str) -> MoE:
        mine, inter, h = tp.part(c.n_routed_experts), c.moe_intermediate_size, c.hidden_size
        e = mine.stop - mine.start
        if fp8:
            if m + "experts.gate_up_proj" in reader.shapes:
                raise CheckpointError(f"{m}experts: weights='fp8' reads DeepSeek's per-expert "
                                      "naming, not transformers' fused expert tensors")
            gate_up, down = experts_fields(reader, m, c, tp, device)
        elif m + "experts.gate_up_proj" in reader.shapes:
            gate_up = get(m + "experts.gate_up_proj", mine).view(e, 2, inter, h)
            down = get(m + "experts.down_proj", mine)
        else:
            gate_up = torch.empty(e, 2, inter, h, device=device, dtype=dtype)
            down = torch.empty(e, h, inter, device=device, dtype=dtype)
            for j in range(e):
                down[j].copy_(mlp(f"{m}experts.{mine.start + j}.", gate_up[j])[1])
        bias = m + "gate.e_score_correction_bias"
        return MoE(
            # In the model dtype, as HF holds it (route computes the scores in float32).
            router=get(m + "gate.weight"),
            # HF keeps the correction bias in float32 whatever the model dtype: so do we.
            score_bias=reader.get(bias, device, torch.float32) if c.topk_method == "noaux_tc"
            else None,
            gate_up=gate_up, down=down,
            shared=dense(m + "shared_experts.") if c.n_shared_experts else None)

    def rope_rows(w: Tensor, heads: int) -> Tensor:
        """w [heads*qk_head or latent, in]: permute each head's trailing qk_rope rows."""
        if reader.rope_perm is None:
            return w
        w = w.view(heads, -1, w.shape[-1])
        rope = w[:, -c.qk_rope_head_dim:]
        rope.copy_(rope[:, reader.rope_perm.to(w.device)].clone())
        return w.flatten(0, 1)

    def attention(a: str) -> Attention:
        lora = c.q_lora_rank is not None
        return Attention(
            kv_a_norm=get(a + "kv_a_layernorm.weight"),
            q_a_norm=get(a + "q_a_layernorm.weight") if lora else None,
            **absorbed(a),
            **(attention_fields(reader, a, c, tp, device) if fp8 else projections(a)))

    def per_head(width: int) -> slice:
        mine = tp.part(c.num_attention_heads)  # this rank's heads' rows or columns
        return slice(mine.start * width, mine.stop * width)

    def absorbed(a: str) -> dict[str, Tensor]:
        """W_UK / W_UV from kv_b_proj, in `dtype` whatever the `weights` (dequantised where
        stored in FP8: `fp8_params.ABSORBED`)."""
        nope, v = c.qk_nope_head_dim, c.v_head_dim
        kv_b = get(a + "kv_b_proj.weight", per_head(nope + v)).view(heads, nope + v, -1)
        return dict(w_uk=kv_b[:, :nope].contiguous(), w_uv=kv_b[:, nope:].contiguous())

    def projections(a: str) -> dict[str, Tensor | None]:
        v, qk = c.v_head_dim, c.qk_head_dim
        lora = c.q_lora_rank is not None
        q = (get(a + "q_a_proj.weight") if lora
             else rope_rows(get(a + "q_proj.weight", per_head(qk)), heads))
        kv_a = rope_rows(get(a + "kv_a_proj_with_mqa.weight"), 1)
        return dict(
            qkv_a_proj=torch.cat((q, kv_a)),
            o_proj=get(a + "o_proj.weight", None, per_head(v)).view(c.hidden_size, heads, v),
            q_b_proj=rope_rows(get(a + "q_b_proj.weight", per_head(qk)), heads).view(
                heads, qk, -1) if lora else None)

    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layers.append(Layer(
            input_norm=get(p + "input_layernorm.weight"), attn=attention(p + "self_attn."),
            post_attn_norm=get(p + "post_attention_layernorm.weight"),
            mlp=moe(p + "mlp.") if c.is_moe_layer(i) else dense(p + "mlp.")))
    vocab = tp.part(c.vocab_size)
    embed = get("model.embed_tokens.weight", vocab)
    return Params(
        cfg=c, embed=embed, layers=tuple(layers), norm=get("model.norm.weight"),
        lm_head=embed if c.tie_word_embeddings else get("lm_head.weight", vocab),
        rope_inv_freq=yarn_inv_freq(c).to(device), tp=tp)


__all__ = ["CheckpointError", "INDEX_FILE", "expected_shapes", "hf_tensors", "load_hf", "save_hf"]
