"""checkpoint.py: save_hf -> load_hf round trips (single file, sharded, fused expert naming,
block-FP8) and every kind of mismatch reported, all keys named, before anything is returned."""

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

import mla_func as mf  # noqa: E402
from mla_func.checkpoint import INDEX_FILE, CheckpointError, load_hf, save_hf  # noqa: E402
from mla_func.fp8 import Fp8Weight  # noqa: E402
from mla_func.params import tensor_leaves  # noqa: E402

TINY = mf.MLAConfig.preset("tiny")
V3ISH = TINY.with_(model_type="deepseek_v3", topk_method="noaux_tc", n_group=2, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=24,
                   tie_word_embeddings=True, first_k_dense_replace=2)


def assert_params_equal(a: mf.Params, b: mf.Params) -> None:
    la, lb = tensor_leaves(a), tensor_leaves(b)
    assert [n for n, _ in la] == [n for n, _ in lb]
    for (name, x), (_, y) in zip(la, lb, strict=True):
        assert x.shape == y.shape and torch.equal(x, y.to(x.dtype)), name


def saved(cfg: mf.MLAConfig, directory: Path, seed: int = 0, **kw) -> mf.Params:
    params = mf.init_params(cfg, seed=seed)
    save_hf(cfg, params, directory, **kw)
    return params


def rewrite(directory: Path, edit) -> None:
    """Apply `edit(tensors) -> tensors` to a single-file checkpoint."""
    path = directory / "model.safetensors"
    tensors = edit(dict(load_file(path)))
    save_file(tensors, path, metadata={"format": "pt"})


def edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("cfg", [TINY, V3ISH], ids=["v2", "v3-tied-qlora"])
def test_round_trip(cfg, tmp_path):
    params = saved(cfg, tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert "model.layers.2.mlp.experts.7.gate_proj.weight" in keys  # hub naming
    assert ("lm_head.weight" in keys) != cfg.tie_word_embeddings
    cfg2, params2 = load_hf(tmp_path)
    assert cfg2 == cfg
    assert_params_equal(params, params2)
    if cfg.tie_word_embeddings:
        assert params2.lm_head is params2.embed


def test_dtype_conversion(tmp_path):
    params = saved(V3ISH, tmp_path)
    _, half = load_hf(tmp_path, dtype=torch.bfloat16)
    moe = half.layers[-1].mlp
    assert half.embed.dtype == torch.bfloat16 and moe.gate_up.dtype == torch.bfloat16
    # HF keeps the routing correction bias (and we keep the rope table) in float32.
    assert moe.score_bias.dtype == torch.float32 and half.rope_inv_freq.dtype == torch.float32
    torch.testing.assert_close(moe.score_bias, params.layers[-1].mlp.score_bias)
    for name in ("bf16", "bfloat16", "torch.bfloat16"):  # a dtype's names load the same
        _, named = load_hf(tmp_path, dtype=name)
        assert_params_equal(half, named)
    with pytest.raises(ValueError, match="'bf17' is not a dtype name; use one of bf16"):
        load_hf(tmp_path, dtype="bf17")
    torch.testing.assert_close(moe.down.float(), params.layers[-1].mlp.down, rtol=1e-2, atol=1e-2)


def test_fused_expert_naming(tmp_path):
    """transformers 5's in-memory layout: experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]."""
    params = saved(TINY, tmp_path)

    def fuse(t):
        for i in range(TINY.first_k_dense_replace, TINY.num_hidden_layers):
            m = f"model.layers.{i}.mlp.experts."
            e = range(TINY.n_routed_experts)
            gate_up = [torch.cat((t.pop(f"{m}{j}.gate_proj.weight"),
                                  t.pop(f"{m}{j}.up_proj.weight"))) for j in e]
            t[m + "gate_up_proj"] = torch.stack(gate_up)
            t[m + "down_proj"] = torch.stack([t.pop(f"{m}{j}.down_proj.weight") for j in e])
        return t

    rewrite(tmp_path, fuse)
    assert_params_equal(params, load_hf(tmp_path)[1])


def test_sharded_with_and_without_index(tmp_path):
    params = saved(TINY, tmp_path, max_shard_bytes=40_000)
    files = sorted(tmp_path.glob("*.safetensors"))
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert len(files) > 3 and sorted(set(index["weight_map"].values())) == [f.name for f in files]
    assert not list(tmp_path.glob("*.tmp"))
    assert_params_equal(params, load_hf(tmp_path)[1])
    (tmp_path / INDEX_FILE).unlink()  # several files, no index: read them all
    assert_params_equal(params, load_hf(tmp_path)[1])


def test_block_fp8_weights_are_dequantised(tmp_path):
    params = saved(TINY, tmp_path)
    block = (8, 16)
    edit_config(tmp_path, quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                               "weight_block_size": list(block)})
    expected = {}

    def quantise(t):
        for key in ("model.layers.1.self_attn.kv_b_proj.weight",
                    "model.layers.2.mlp.experts.3.down_proj.weight"):
            w = t[key]
            rows, cols = math.ceil(w.shape[0] / block[0]), math.ceil(w.shape[1] / block[1])
            scale = torch.rand(rows, cols) + 0.5
            full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
            full = full[: w.shape[0], : w.shape[1]]
            t[key] = (w / full).to(torch.float8_e4m3fn)
            t[key + "_scale_inv"] = scale
            expected[key] = t[key].float() * full
        return t

    rewrite(tmp_path, quantise)
    _, loaded = load_hf(tmp_path)
    attn, moe = loaded.layers[1].attn, loaded.layers[2].mlp
    kv_b = torch.cat((attn.w_uk, attn.w_uv), dim=1).flatten(0, 1)
    assert torch.equal(kv_b, expected["model.layers.1.self_attn.kv_b_proj.weight"])
    assert torch.equal(moe.down[3], expected["model.layers.2.mlp.experts.3.down_proj.weight"])
    torch.testing.assert_close(moe.down[3], params.layers[2].mlp.down[3], rtol=0.07, atol=0.02)
    # Kept in FP8 (weights="fp8"), W_UK / W_UV still come dequantised (`fp8_params.ABSORBED`).
    fp8 = load_hf(tmp_path, weights="fp8")[1].layers[1].attn
    assert not isinstance(fp8.w_uk, Fp8Weight) and isinstance(fp8.o_proj, Fp8Weight)
    assert torch.equal(fp8.w_uk, attn.w_uk) and torch.equal(fp8.w_uv, attn.w_uv)
    key = "model.layers.2.mlp.experts.3.down_proj.weight"
    rewrite(tmp_path, lambda t: {k: v for k, v in t.items() if k != key + "_scale_inv"})
    with pytest.raises(CheckpointError, match=f"{key}: F8_E4M3 without {key}_scale_inv"):
        load_hf(tmp_path)


def test_mtp_layers_and_stale_buffers_are_ignored(tmp_path):
    saved(V3ISH, tmp_path)
    edit_config(tmp_path, num_nextn_predict_layers=1)
    n = V3ISH.num_hidden_layers
    extra = {f"model.layers.{n}.eh_proj.weight": torch.randn(4, 4),
             f"model.layers.{n}.self_attn.kv_a_layernorm.weight": torch.randn(4),
             "model.layers.0.self_attn.rotary_emb.inv_freq": torch.randn(4)}
    rewrite(tmp_path, lambda t: {**t, **extra})
    load_hf(tmp_path)
    # One layer past the MTP module is not an MTP layer: reported.
    rewrite(tmp_path, lambda t: {**t, f"model.layers.{n + 1}.input_layernorm.weight":
                                 torch.randn(4)})
    with pytest.raises(CheckpointError, match=rf"unexpected: model\.layers\.{n + 1}\."):
        load_hf(tmp_path)


def test_missing_keys_all_named(tmp_path):
    saved(TINY, tmp_path)
    gone = ["model.layers.1.self_attn.kv_b_proj.weight",
            "model.layers.2.mlp.experts.5.up_proj.weight", "lm_head.weight"]
    rewrite(tmp_path, lambda t: {k: v for k, v in t.items() if k not in gone})
    with pytest.raises(CheckpointError, match="3 missing") as err:
        load_hf(tmp_path)
    assert sorted(err.value.missing) == sorted(gone)
    assert all(k in str(err.value) for k in gone)
    assert isinstance(err.value, ValueError)


def test_unexpected_keys_all_named(tmp_path):
    saved(TINY, tmp_path)
    extra = ["model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.2.mlp.bias"]
    rewrite(tmp_path, lambda t: {**t, **{k: torch.zeros(2) for k in extra}})
    with pytest.raises(CheckpointError, match="2 unexpected") as err:
        load_hf(tmp_path)
    assert sorted(err.value.unexpected) == sorted(extra)
    assert not err.value.missing and not err.value.mismatched


def test_wrong_shapes_all_named(tmp_path):
    saved(TINY, tmp_path)
    bad = {"model.norm.weight": torch.ones(63),
           "model.layers.2.mlp.experts.1.down_proj.weight": torch.zeros(64, 31)}
    rewrite(tmp_path, lambda t: {**t, **bad})
    with pytest.raises(CheckpointError, match="2 wrong shape") as err:
        load_hf(tmp_path)
    msg = str(err.value)
    assert "model.norm.weight: expected [64], found [63]" in msg
    assert "experts.1.down_proj.weight: expected [64, 32], found [64, 31]" in msg


@pytest.mark.parametrize("change", [
    {"hidden_size": 96}, {"q_lora_rank": 16}, {"num_hidden_layers": 2}, {"n_routed_experts": 6},
    {"first_k_dense_replace": 2}, {"kv_lora_rank": 16}, {"v_head_dim": 8},
])
def test_config_that_does_not_match_weights(tmp_path, change):
    saved(TINY, tmp_path)
    edit_config(tmp_path, **change)
    with pytest.raises(CheckpointError, match="do not match config.json") as err:
        load_hf(tmp_path)
    e = err.value
    assert e.missing or e.unexpected or e.mismatched
    if "num_hidden_layers" in change:  # layer 2 of a 2-layer model: every key of it counted
        assert len(e.unexpected) == len([k for k in load_file(tmp_path / "model.safetensors")
                                         if k.startswith("model.layers.2.")])
    # One short message: each list names its first keys and counts the rest, and the message
    # names the config field the weights disagree with.
    for keys in (e.missing, e.unexpected, e.mismatched):
        if len(keys) > 4:
            assert f"and {len(keys) - 4} more" in str(e) and keys[4] not in str(e)
    assert len(str(e)) < 1500, len(str(e))
    field, value = next(iter(change.items()))
    if field in ("hidden_size", "kv_lora_rank"):
        assert f"{field} = {value} (the weights:" in str(e)
    if field == "v_head_dim":  # o_proj's input is heads x v_head wide
        assert f"num_attention_heads x v_head_dim = {4 * value} (the weights:" in str(e)


def test_no_weights_or_missing_shard(tmp_path):
    saved(TINY, tmp_path / "a")
    (tmp_path / "a" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_hf(tmp_path / "a")
    saved(TINY, tmp_path / "b", max_shard_bytes=200_000)
    next(iter(sorted((tmp_path / "b").glob("*.safetensors")))).unlink()
    with pytest.raises(CheckpointError, match="shard"):
        load_hf(tmp_path / "b")


def test_save_over_a_checkpoint_replaces_it(tmp_path):
    """An old index or shard left behind would be read instead of the new weights."""
    old = saved(TINY, tmp_path, seed=0, max_shard_bytes=40_000)
    (tmp_path / "tokenizer.json").write_text("{}")  # not the format's: kept
    (tmp_path / "part-00007.tmp").write_bytes(b"left by a crashed save")
    new = saved(TINY, tmp_path, seed=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert_params_equal(new, load_hf(tmp_path)[1])
    newer = saved(V3ISH, tmp_path, seed=2, max_shard_bytes=40_000)
    assert not (tmp_path / "model.safetensors").exists()
    cfg, loaded = load_hf(tmp_path)
    assert cfg == V3ISH and (tmp_path / "tokenizer.json").read_text() == "{}"
    assert_params_equal(newer, loaded)
    assert not torch.equal(old.embed, new.embed)  # seeds differ: old weights would show


@pytest.mark.parametrize("existing", [True, False], ids=["over-old", "new-dir"])
def test_failed_save_changes_nothing(tmp_path, monkeypatch, existing):
    import mla_func.checkpoint_write as cw

    target = tmp_path / "ckpt"
    old = saved(TINY, target) if existing else None
    real, calls = cw.save_file, []

    def fail_after_first(*args, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("disk full")
        real(*args, **kw)

    monkeypatch.setattr(cw, "save_file", fail_after_first)
    with pytest.raises(OSError, match="disk full"):
        save_hf(V3ISH, mf.init_params(V3ISH, seed=1), target, max_shard_bytes=40_000)
    assert len(calls) == 2
    assert [p.name for p in tmp_path.iterdir()] == (["ckpt"] if existing else [])
    if existing:
        cfg, loaded = load_hf(target)
        assert cfg == TINY
        assert_params_equal(old, loaded)


def test_save_rejects_a_config_other_than_the_params(tmp_path):
    params = mf.init_params(TINY, seed=0)
    with pytest.raises(CheckpointError, match=r"rope_theta=5000\.0 \(params: 10000\.0\)"):
        save_hf(TINY.with_(rope_theta=5000.0), params, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_load_hf_takes_the_config_json_path(tmp_path):
    params = saved(TINY, tmp_path)
    cfg, loaded = load_hf(tmp_path / "config.json")
    assert cfg == TINY
    assert_params_equal(params, loaded)
    with pytest.raises(CheckpointError, match="is a file"):
        load_hf(tmp_path / "model.safetensors")


def test_unreadable_files_name_themselves(tmp_path):
    saved(TINY, tmp_path / "a", max_shard_bytes=200_000)
    shard = sorted((tmp_path / "a").glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:1000])  # truncated
    with pytest.raises(CheckpointError, match=shard.name):
        load_hf(tmp_path / "a")
    (tmp_path / "a" / INDEX_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=INDEX_FILE):
        load_hf(tmp_path / "a")
    saved(TINY, tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text('{"model_type": "deepseek_v2",')
    with pytest.raises(mf.ConfigError, match="config.json is not valid JSON"):
        load_hf(tmp_path / "b")
