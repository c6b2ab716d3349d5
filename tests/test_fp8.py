"""fp8.py, quantize.py, fp8_params.py: block-FP8 weights in the params pytree, quantized and
dequantized, read by the reference ops, computed in block FP8 on the fused path, and planned
by the capture compiler on `meta`."""

import math

import pytest
import torch
from hf_helpers import Runner

import mla_func as mf
from mla_func.compile_step import plan_step
from mla_func.fp8 import FP8, FP8_MAX, Fp8Weight, dequantize, expand_scales, quantize
from mla_func.fp8_params import weight_precisions
from mla_func.kernels.plan import KernelOptions
from mla_func.params import tensor_leaves
from mla_func.quantize import dequantize as dequantize_params
from mla_func.quantize import quantize_fp8

TINY = mf.MLAConfig.preset("tiny")
V3ISH = TINY.with_(model_type="deepseek_v3", topk_method="noaux_tc", n_group=2, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=24)
CONFIGS = pytest.mark.parametrize("cfg", [TINY, V3ISH], ids=["v2", "v3-noaux-qlora"])


def test_quantize_blocks_shapes_not_divisible_by_the_block():
    w = torch.randn(3, 50, 70)
    w[1, 32:, 64:] = 0  # an all-zero (partial) block
    q = quantize(w, block=32, stack=1)
    assert q.data.dtype == FP8 and q.data.shape == (3, 50, 70) and q.shape == (3, 50, 70)
    assert q.scales.dtype == torch.float32 and q.scales.shape == (3, 2, 3) and q.block == (32, 32)
    assert q.scales[1, 1, 2] == 1  # zero block: scale 1, data 0
    # Each block's largest |value| is e4m3's largest, and its scale is amax / 448.
    block = w[2, 32:, 32:64]
    assert q.scales[2, 1, 1] == block.abs().max() / FP8_MAX
    assert q.data[2, 32:, 32:64].float().abs().max() == FP8_MAX
    back = dequantize(q)
    assert back.shape == w.shape
    # e4m3 keeps 3 mantissa bits (half an ulp: 2^-4 relative), subnormals below 2^-6
    # spaced 2^-9 (in units of the block's scale).
    scale = expand_scales(q.scales, q.block, 50, 70)
    assert ((back - w).abs() <= w.abs() / 16 + scale * 2**-10).all()
    # No stack, two axes of rows: one matrix [5 x 10, 64].
    assert quantize(torch.randn(5, 10, 64), 16, 0, 2).scales.shape == (1, 4, 4)


@CONFIGS
def test_quantize_fp8_params(cfg):
    params = mf.init_params(cfg, dtype=torch.bfloat16)
    q = quantize_fp8(params, block=64)
    moe, attn = q.layers[-1].mlp, q.layers[-1].attn
    for w in (attn.qkv_a_proj, attn.o_proj, moe.gate_up, moe.down, moe.shared.gate_up,
              q.layers[0].mlp.down):
        assert isinstance(w, Fp8Weight)
    assert (attn.q_b_proj is None) == (cfg.q_lora_rank is None)
    # W_UK / W_UV (`fp8_params.ABSORBED`), the router, score bias, norms, embedding and
    # lm_head are the same tensors.
    old = params.layers[-1].attn
    assert attn.w_uk is old.w_uk and attn.w_uv is old.w_uv
    assert moe.router is params.layers[-1].mlp.router and q.embed is params.embed
    assert moe.score_bias is params.layers[-1].mlp.score_bias and q.norm is params.norm
    # Grids: the checkpoint block where params' layout keeps DeepSeek's blocks whole, a
    # divisor where it cuts them (qkv_a_proj's rows: q's, then kv_a's).
    assert moe.gate_up.block == (64, 64) and moe.gate_up.data.shape[0] == 2 * 8
    q_rows = attn.qkv_a_proj.shape[0] - cfg.latent_dim
    assert attn.qkv_a_proj.block == (math.gcd(64, q_rows), 64) and q_rows % 64
    precisions = weight_precisions(q)
    assert precisions["experts.down"] == "fp8 e4m3, block 64"
    assert precisions["attn.w_uk"] == precisions["attn.w_uv"] == "bfloat16"
    assert precisions["router"] == precisions["lm_head"] == "bfloat16"
    back = dequantize_params(q)
    assert back.layers[-1].mlp.gate_up.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(tensor_leaves(params), tensor_leaves(back), strict=True):
        torch.testing.assert_close(b.float(), a.float(), rtol=0.07, atol=0.03, msg=name)
    with pytest.raises(ValueError, match="already block FP8"):
        quantize_fp8(q)


@CONFIGS
def test_fp8_model_equals_its_dequantized_model(cfg):
    """The reference ops dequantise FP8 weights on the fly: the same logits, bit for bit, as
    the float model of the dequantised weights, over a prefill and decodes."""
    fp8 = quantize_fp8(mf.init_params(cfg, seed=1), block=32)
    runners = Runner(fp8), Runner(dequantize_params(fp8))
    work = [(0, [3, 4, 5, 6, 7]), (1, [9, 8])]
    for _ in range(3):
        a, b = (r.step(work) for r in runners)
        for s in a:
            assert torch.equal(a[s], b[s])
        work = [(s, [int(a[s].argmax())]) for s in a]


def test_capture_plans_an_fp8_step_on_meta():
    params = quantize_fp8(mf.init_params(V3ISH, device="meta", dtype=torch.bfloat16))
    state = mf.init_state(V3ISH, 64, 16, device="meta", dtype=torch.bfloat16)
    plan = plan_step(params, state, max_tokens=64, max_seqs=8)
    assert plan.meta["weights"]["experts.gate_up"] == "fp8 e4m3, block 128"
    one, many = plan.meta["kernels"]["full"]["1"], plan.meta["kernels"]["piecewise"]["64"]
    assert one["projections"] == many["projections"] == "fp8"  # meta plans the fused path
    assert (one["qkv_a"], one["o_proj"], many["qkv_a"]) == ("norm+fp8", "fp8+add_norm", "fp8")
    assert set(one["fp8_gemms"]) == {"qkv_a", "q_b", "o_proj", "mlp.gate_up", "mlp.down"}
    assert "quant=inline" in one["fp8_gemms"]["o_proj"]
    assert "quant=apart" in many["fp8_gemms"]["o_proj"]
    assert plan.meta["weights"]["embed"] == "bfloat16"
    # Every bucket's experts run the block-FP8 GEMMs (the Triton experts of `meta`'s plans).
    buckets = [b for mode, bs in plan.meta["kernels"].items() if mode != "options"
               for b in bs.values()]
    assert buckets and all(b["experts_precision"] == "fp8" for b in buckets)
    leaves = {leaf.path: leaf for leaf in plan.signature.leaves}
    w = leaves["params.layers.2.mlp.gate_up.data"]
    assert w.dtype == FP8 and w.dims == ("stack", "width_out", "width_in")
    assert leaves["params.layers.2.mlp.gate_up.scales"].dims == ("stack", "blocks_out",
                                                                 "blocks_in")


@pytest.mark.interpret
def test_fused_fp8_projections_match_the_reference_path():
    """The fused path runs the projections in block FP8 (q + kv_a, q_b, o_proj, the dense
    MLP): a prefill of 20 rows (the activations quantised by a kernel before the GEMM) and a
    decode row (quantised inside the GEMM), against the reference path's dequantised float32
    products (the torch MoE on both: the experts are not this test's), two layers (the dense
    one and a MoE one). Tolerance: e4m3 keeps 3 mantissa bits, so each quantised activation
    moves by up to 2^-4 of itself, about 2.6% rms of a product; the logits rows came out
    3.3% and 6.8% off (relative L2); 0.15 leaves room for other draws, where a wrong scale or
    block gives O(1)."""
    cfg = V3ISH.with_(num_hidden_layers=2)
    fp8 = quantize_fp8(mf.init_params(cfg, seed=1))  # float32 activations: only FP8 noise
    outs = []
    for opts in (KernelOptions(), KernelOptions(fused=True)):
        state = mf.init_state(cfg, num_pages=16, page_size=4)
        prompt = list(range(3, 23))
        pages = state.allocator.reserve(0, len(prompt) + 1)
        batch = mf.make_batch([mf.SeqWork(prompt, 0, pages)], 4, 8, kernels=opts)
        first, state = mf.forward(fp8, state, batch)
        batch = mf.make_batch([mf.SeqWork([9], len(prompt), pages)], 4, 8, kernels=opts)
        outs.append(torch.cat([first, mf.forward(fp8, state, batch)[0]]))
    ref, got = outs
    assert ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.15
