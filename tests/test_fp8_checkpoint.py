"""load_hf(weights="fp8") and save_hf of block-FP8 params: DeepSeek's layout round trip bit
for bit, tensor-parallel slices of the scales, float checkpoints quantized on load, and the
default (weights="bf16") dequantising as before."""

import json

import pytest
import torch

pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

import mla_func as mf  # noqa: E402
from mla_func.checkpoint import load_hf, save_hf  # noqa: E402
from mla_func.fp8 import FP8, Fp8Weight  # noqa: E402
from mla_func.fp8_params import map_projections  # noqa: E402
from mla_func.parallel.group import TensorParallel  # noqa: E402
from mla_func.parallel.shard import shard_params  # noqa: E402
from mla_func.params import tensor_leaves  # noqa: E402
from mla_func.quantize import dequantize, quantize_fp8  # noqa: E402

TINY = mf.MLAConfig.preset("tiny")
V3ISH = TINY.with_(model_type="deepseek_v3", topk_method="noaux_tc", n_group=2, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=24,
                   tie_word_embeddings=True, first_k_dense_replace=2)
CONFIGS = pytest.mark.parametrize("cfg", [TINY, V3ISH], ids=["v2", "v3-tied-qlora"])


def assert_identical(a: mf.Params, b: mf.Params) -> None:
    """Same leaves, bit for bit, and the same FP8 layouts (grids and shapes)."""
    la, lb = tensor_leaves(a), tensor_leaves(b)
    assert [n for n, _ in la] == [n for n, _ in lb]
    for (name, x), (_, y) in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.dtype == FP8:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), name
    layouts = []

    def note(w, kind):
        layouts.append((kind, w.block, w.shape) if isinstance(w, Fp8Weight) else (kind,))
        return w

    map_projections(a, note)
    first, layouts[:] = list(layouts), []
    map_projections(b, note)
    assert first == layouts


@CONFIGS
def test_quantize_save_load_round_trip_is_exact(cfg, tmp_path):
    fp8 = quantize_fp8(mf.init_params(cfg), block=64)
    save_hf(cfg, fp8, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["quantization_config"]["weight_block_size"] == [64, 64]
    stored = load_file(tmp_path / "model.safetensors")
    key = "model.layers.2.self_attn.o_proj.weight"
    assert stored[key].dtype == FP8 and stored[key + "_scale_inv"].shape == (1, 1)
    # kv_b_proj (W_UK / W_UV: `fp8_params.ABSORBED`) in the float dtype, listed as such.
    key = "model.layers.2.self_attn.kv_b_proj.weight"
    assert stored[key].dtype == torch.float32 and key + "_scale_inv" not in stored
    assert raw["quantization_config"]["modules_to_not_convert"] == [
        f"model.layers.{i}.self_attn.kv_b_proj" for i in range(cfg.num_hidden_layers)]
    assert stored["model.layers.2.mlp.gate.weight"].dtype == torch.float32  # the router
    assert "model.embed_tokens.weight_scale_inv" not in stored
    cfg2, loaded = load_hf(tmp_path, weights="fp8")
    assert cfg2 == cfg
    assert_identical(fp8, loaded)
    # The default dequantises: the float weights FP8 stands for.
    _, floats = load_hf(tmp_path)
    assert_identical(dequantize(fp8), floats)


def test_tensor_parallel_slices_scales_by_blocks(tmp_path):
    """A rank's FP8 shard read as slices of the files (its heads cut DeepSeek's blocks)
    stands for the same weights as the rank's float shard."""
    fp8 = quantize_fp8(mf.init_params(V3ISH), block=32)
    save_hf(V3ISH, fp8, tmp_path)
    for rank in range(2):
        tp = TensorParallel(rank, 2)
        _, shard = load_hf(tmp_path, weights="fp8", mesh=tp)
        _, floats = load_hf(tmp_path, mesh=tp)
        assert shard.tp == tp and isinstance(shard.layers[2].mlp.gate_up, Fp8Weight)
        assert shard.layers[0].attn.o_proj.block == (32, 32)
        assert_identical(dequantize(shard), floats)
        assert_identical(floats, shard_params(dequantize(fp8), tp))


def test_float_checkpoint_is_quantized_on_load(tmp_path):
    """weights="fp8" on a float checkpoint: each matrix quantized on load on the block grid
    (128 without a quantization_config), as quantize_fp8 would."""
    params = mf.init_params(V3ISH, seed=2)
    save_hf(V3ISH, params, tmp_path)
    _, loaded = load_hf(tmp_path, weights="fp8")
    assert_identical(quantize_fp8(params), loaded)
    _, shard = load_hf(tmp_path, weights="fp8", mesh=TensorParallel(1, 2))
    assert shard.layers[1].attn.q_b_proj.shape == (2, V3ISH.qk_head_dim, 24)
    with pytest.raises(ValueError, match="weights must be 'bf16' or 'fp8'"):
        load_hf(tmp_path, weights="int4")
