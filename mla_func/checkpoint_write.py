"""HF checkpoint writing: `(MLAConfig, Params)` -> config.json + safetensors, in DeepSeek's
original per-expert naming (what the hub ships and `checkpoint.load_hf` reads back), optionally
sharded with `model.safetensors.index.json`. Tensors are streamed one at a time. Block-FP8
params (`fp8.Fp8Weight`) are written in DeepSeek-V3's layout: e4m3 matrices, each with its
`weight_scale_inv` (one float32 scale per block), and `quantization_config` in config.json
(listing the matrices written in a float dtype, kv_b_proj's: `float_modules`).

Saving over a checkpoint replaces it: everything is written into a temporary directory beside
the target first, so a failure part way leaves the old checkpoint as it was; only then are the
target's checkpoint files that the new one lacks removed (a stale index would otherwise make
`load_hf` read the old shards) and the new files moved in. Other files (a tokenizer) are kept.
This module also owns `CheckpointError`, which `checkpoint.py` re-exports.
"""

import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.fp8 import FP8, Fp8Weight, Weight, expand_scales, unpack
from mla_func.fp8_params import is_fp8, map_projections
from mla_func.params import DenseMLP, Params, split_qkv_a

INDEX_FILE = "model.safetensors.index.json"
# Every file name this format writes, this writer's part files included (older versions left
# them in the target): the files a save may remove from its target.
_OWNED = re.compile(r"config\.json|model\.safetensors(\.index\.json)?"
                    r"|model-\d+-of-\d+\.safetensors|part-\d+\.tmp")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, does not match its config, or was asked to be saved
    with a config other than its params'; key mismatches list every offending key."""

    def __init__(self, message: str, missing: Sequence[str] = (),
                 unexpected: Sequence[str] = (), mismatched: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing, self.unexpected = list(missing), list(unexpected)
        self.mismatched = list(mismatched)


def hf_tensors(params: Params) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) in DeepSeek's original per-expert naming, one tensor at a time."""
    c = params.cfg

    def mlp(prefix: str, gate_up: Tensor, down: Tensor) -> Iterator[tuple[str, Tensor]]:
        yield prefix + "gate_proj.weight", gate_up[0]
        yield prefix + "up_proj.weight", gate_up[1]
        yield prefix + "down_proj.weight", down

    yield "model.embed_tokens.weight", params.embed
    for i, layer in enumerate(params.layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        at = layer.attn
        yield p + "input_layernorm.weight", layer.input_norm
        yield p + "post_attention_layernorm.weight", layer.post_attn_norm
        q, kv_a = split_qkv_a(at, params.cfg)
        if at.q_b_proj is None:
            yield a + "q_proj.weight", q
        else:
            yield a + "q_a_proj.weight", q
            yield a + "q_a_layernorm.weight", at.q_a_norm
            yield a + "q_b_proj.weight", at.q_b_proj.flatten(0, 1)
        yield a + "kv_a_proj_with_mqa.weight", kv_a
        yield a + "kv_a_layernorm.weight", at.kv_a_norm
        yield a + "kv_b_proj.weight", torch.cat((at.w_uk, at.w_uv), dim=1).flatten(0, 1)
        yield a + "o_proj.weight", at.o_proj.flatten(1, 2)
        if isinstance(layer.mlp, DenseMLP):
            yield from mlp(m, layer.mlp.gate_up, layer.mlp.down)
            continue
        yield m + "gate.weight", layer.mlp.router
        if layer.mlp.score_bias is not None:
            yield m + "gate.e_score_correction_bias", layer.mlp.score_bias
        for j in range(layer.mlp.gate_up.shape[0]):
            yield from mlp(f"{m}experts.{j}.", layer.mlp.gate_up[j], layer.mlp.down[j])
        if layer.mlp.shared is not None:
            yield from mlp(m + "shared_experts.", layer.mlp.shared.gate_up,
                           layer.mlp.shared.down)
    yield "model.norm.weight", params.norm
    if not c.tie_word_embeddings:
        yield "lm_head.weight", params.lm_head


def fp8_block(params: Params) -> int:
    """The block a block-FP8 checkpoint of `params` is written with: the least common multiple
    of the weights' grids (those are the checkpoint block or, where params' layout cuts a
    block, a divisor of it)."""
    sizes: list[int] = []

    def note(w: Weight, _: str) -> Weight:
        if isinstance(w, Fp8Weight):
            sizes.extend(w.block)
        return w

    map_projections(params, note)
    return math.lcm(*sizes)


def hf_fp8_tensors(params: Params, block: int) -> Iterator[tuple[str, Tensor]]:
    """`hf_tensors` of block-FP8 params: each FP8 matrix in e4m3, then its `_scale_inv`
    (`block` x `block` blocks); params' layout is cut back into DeepSeek's exactly, as
    `checkpoint_fp8` cut it (memory: the per-element scales of every FP8 weight, float32)."""

    def part(index: int):
        def fn(w: Weight, _: str) -> Weight:
            return unpack(w)[index] if isinstance(w, Fp8Weight) else w
        return fn

    data, scales = map_projections(params, part(0)), map_projections(params, part(1))
    for (name, d), (_, full) in zip(hf_tensors(data), hf_tensors(scales), strict=True):
        yield name, d
        if d.dtype == FP8:
            yield name + "_scale_inv", _block_scales(name, full, block)


def float_modules(params: Params) -> list[str]:
    """The HF modules block-FP8 params write in a float dtype: each layer's kv_b_proj whose
    W_UK / W_UV they hold as floats (`fp8_params.ABSORBED`), for config.json's
    `modules_to_not_convert` (transformers' name for the linear layers left unquantized)."""
    return [f"model.layers.{i}.self_attn.kv_b_proj" for i, layer in enumerate(params.layers)
            if not isinstance(layer.attn.w_uk, Fp8Weight)]


def _block_scales(name: str, full: Tensor, block: int) -> Tensor:
    """One scale per block x block block of per-element scales that hold one per block."""
    picked = full[::block, ::block]
    if not torch.equal(expand_scales(picked[None], (block, block), *full.shape)[0], full):
        raise CheckpointError(f"{name}: its FP8 scales differ inside a {block} x {block} "
                              "block, which DeepSeek's layout cannot hold")
    return picked.contiguous()


def save_hf(cfg: MLAConfig, params: Params, directory: "str | Path",
            max_shard_bytes: int | None = None) -> None:
    """Write config.json and safetensors weights in DeepSeek's per-expert naming (what the hub
    ships); with `max_shard_bytes`, as shards plus `model.safetensors.index.json`. Replaces a
    checkpoint already in `directory` (see the module docstring); CheckpointError, before
    anything is written, if `cfg` is not `params.cfg`."""
    if cfg != params.cfg:
        differ = [f"{f.name}={getattr(cfg, f.name)!r} (params: {getattr(params.cfg, f.name)!r})"
                  for f in fields(cfg) if getattr(cfg, f.name) != getattr(params.cfg, f.name)]
        raise CheckpointError("cfg does not match params.cfg, the config the params were built "
                              "or loaded with: " + ", ".join(differ))
    target = Path(directory).resolve()  # resolved: the temporary directory shares its device
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        _write(cfg, params, staging, max_shard_bytes)
        target.mkdir(exist_ok=True)
        new = {p.name for p in staging.iterdir()}
        for old in target.iterdir():
            if _OWNED.fullmatch(old.name) and old.name not in new and old.is_file():
                old.unlink()
        # config.json last: until it moves, the target's config is the old one or none.
        for name in sorted(new, key=lambda n: n == "config.json"):
            (staging / name).replace(target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write(cfg: MLAConfig, params: Params, directory: Path, max_shard_bytes: int | None) -> None:
    hf = cfg.to_hf_dict()
    hf["dtype"] = str(params.dtype).removeprefix("torch.")
    tensors = hf_tensors(params)
    if is_fp8(params):
        block = fp8_block(params)
        hf["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "weight_block_size": [block, block]}
        floats = float_modules(params)
        if floats:
            hf["quantization_config"]["modules_to_not_convert"] = floats
        tensors = hf_fp8_tensors(params, block)
    (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    # Each shard is written once full (bounded memory) and renamed for the final count.
    limit = math.inf if max_shard_bytes is None else max_shard_bytes
    shard: dict[str, Tensor] = {}
    parts: list[list[str]] = []
    size = total = 0

    def flush() -> None:
        save_file(shard, str(directory / f"part-{len(parts):05d}.tmp"), metadata={"format": "pt"})
        parts.append(list(shard))
        shard.clear()

    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > limit:
            flush()
            size = 0
        # Own contiguous CPU copies: safetensors refuses tensors that share storage.
        shard[name] = t.detach().to("cpu", copy=True).contiguous()
        size, total = size + nbytes, total + nbytes
    flush()
    if max_shard_bytes is None:
        (directory / "part-00000.tmp").rename(directory / "model.safetensors")
        return
    weight_map = {}
    for n, names in enumerate(parts):
        fname = f"model-{n + 1:05d}-of-{len(parts):05d}.safetensors"
        (directory / f"part-{n:05d}.tmp").rename(directory / fname)
        weight_map.update(dict.fromkeys(names, fname))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
