"""The experts' block-FP8 GEMMs: kernels/moe/fp8_gemm.py (+ gate_up.py, down.py, fused.py,
shared_fp8.py in their FP8 form, config.py's FP8 rows), ops/moe_fp8.py (the torch reference of
their numerics) and mla_func.moe's wiring of `Fp8Weight` experts.

CPU: Triton under TRITON_INTERPRET=1, float32 activations (the 3.9 interpreter rounds float32
to bf16 as it rounds to e4m3: wrongly, see `fp8_gemm`), small sizes with K and moe_inter whole
and partial groups of 128. Against `ops.moe_fp8` the kernels agree to float32 rounding (the
order of each group's sum); against the float experts of the dequantised weights they differ by
the activations' e4m3 rounding (3 mantissa bits: each quantised value within 2^-4 of its own
size, about 3% RMS), twice (x, then the SwiGLU activation): 4-5% of the output's norm here,
bounded at 8% (`LOOSE`). The GPU tests and the sm90 compiles: test_moe_fp8_cuda.py.
"""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from moe_fp8_helpers import LOOSE, float_experts, fused_fp8, make_fp8, rel_err
from moe_helpers import close, place_shared, tails

import mla_func as mf
from mla_func import kernel_ops
from mla_func.fp8 import FP8, dequantize, quantize, quantize_activations
from mla_func.kernels.act_quant import quant_rows, quant_tokens
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.moe.config import CONFIGS, FP8_BLOCK_K, FP8_CONFIGS, MoEConfig, pick_config
from mla_func.kernels.plan import KernelOptions
from mla_func.moe import experts
from mla_func.ops.moe import route
from mla_func.ops.moe_fp8 import experts_fp8
from mla_func.quantize import quantize_fp8

# Tiles for the interpreter: BLOCK_K is one scale group; one or two N-tiles per GEMM.
SMALL = MoEConfig(16, (64, FP8_BLOCK_K, 4, 1), (128, FP8_BLOCK_K, 4, 1))
@triton.jit
def _quant_kernel(a_ptr, q_ptr, s_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    r, c = tl.arange(0, ROWS), tl.arange(0, COLS)
    q, s = quant_rows(tl.load(a_ptr + r[:, None] * COLS + c[None, :]), True)
    tl.store(q_ptr + r[:, None] * COLS + c[None, :], q)
    tl.store(s_ptr + r, s)


@pytest.mark.interpret
def test_activation_quantisation_rounds_as_torch():
    """`quant_rows` (in the interpreter, which rounds on e4m3's grid first) gives the bits
    of `fp8.quantize_activations`: the scales, and values at e4m3's ties, in its
    subnormals and at its largest, an all-zero row."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 128, generator=g) * torch.logspace(-6, 4, 16)[:, None]
    grid = torch.arange(127, dtype=torch.uint8).view(FP8).float()  # every e4m3 >= 0
    a[0], a[1] = grid[1:].repeat(2)[:128], -((grid[1:] + grid[:-1]) / 2).repeat(2)[:128]
    a[0, 0], a[1, 0] = 448.0, -448.0  # scale 1: the ties of row 1 stay ties
    a[2] = 0.0
    a[3, 1:] *= 1e-4  # below e4m3's smallest normal, relative to the row's largest
    q, s = torch.empty(16, 128, dtype=FP8), torch.empty(16)
    _quant_kernel[(1,)](a, q, s, 16, 128)
    want_q, want_s = quantize_activations(a)
    assert torch.equal(s, want_s[:, 0])
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.interpret
def test_tokens_quantised_once_are_quant_rows():
    """`quant_tokens` (x quantised before the gate_up GEMM, `MoEConfig.quant_x`) gives
    `fp8.quantize_activations`' bits for tokens past one block and a partial last group;
    bf16 experts refuse the option."""
    from mla_func.kernels.moe.fp8_gemm import gate_up_x

    g = torch.Generator().manual_seed(5)
    x = torch.randn(19, 200, generator=g) * torch.logspace(-3, 2, 19)[:, None]
    x[4] = 0.0
    q, s = quant_tokens(x, FP8_BLOCK_K)
    want_q, want_s = quantize_activations(x)
    assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    with pytest.raises(ValueError, match="quant_x"):
        gate_up_x(x, True, fp8=False)


CASES = {  # name: (tokens, topk, n_exp, hidden, inter, shared, fold, config, skew)
    "aligned-folded": (3, 2, 4, 256, 128, 2, True, SMALL, False),
    "direct-last-sum-folded": (2, 2, 4, 256, 128, 1, True,
                               dataclasses.replace(SMALL, direct=True, last_sum=True), False),
    # TMA loads, the tails merged, one expert taking every token; the shared MLP apart.
    "tma-merge-tail-apart": (36, 2, 4, 256, 128, 1, False,
                             dataclasses.replace(SMALL, block_m=32, tma=True, merge_tail=True),
                             True),
    # x quantised once before gate_up (`quant_x`), `act` before down (`quant_act`): the whole
    # tiles, the folded shared tiles and the merged tails read e4m3 rows and their scales,
    # through pointer and TMA loads.
    "aligned-folded-quant-x": (3, 2, 4, 256, 128, 2, True,
                               dataclasses.replace(SMALL, quant_x=True, quant_act=True), False),
    "tma-merge-tail-apart-quant-x": (36, 2, 4, 256, 128, 1, False, dataclasses.replace(
        SMALL, block_m=32, tma=True, merge_tail=True, quant_x=True, quant_act=True), True),
    # K and moe_inter partial groups (192 = 1.5, 160 = 1.25): the shared MLP apart whatever
    # the token count (moe_inter is no whole number of groups: `fold_shared`).
    "partial-groups": (3, 2, 4, 192, 160, 1, None, SMALL, False),
    # gate_up's K (3 groups) in 4 slices (`split_k`): one group each, the last slice empty;
    # down's (2 groups) in 2.
    "direct-split-k": (2, 2, 4, 384, 256, 1, True, dataclasses.replace(
        SMALL, direct=True, last_sum=True, gate_up_split=4, down_split=2), False),
}


@pytest.mark.parametrize("name", list(CASES))
# TMA loads `act`'s NaN padding rows (`nan_empty`): the interpreter's numpy warns of them.
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
@pytest.mark.interpret
def test_fp8_kernels_match_the_reference(name, nan_empty, monkeypatch):
    """The FP8 grouped GEMMs (each layout and load form, the shared experts folded in and
    apart) against `ops.moe_fp8` (float32 rounding apart) and against the float experts of
    the dequantised weights (the activations' e4m3 rounding apart)."""
    tokens, topk, n_exp, hidden, inter, shared, fold, cfg, skew = CASES[name]
    x, w, ids, gu, dn, mlp = make_fp8(tokens, topk, n_exp, hidden, inter, shared,
                                      seed=tokens, skew=skew)
    if cfg.merge_tail:
        assert tails(ids, n_exp, cfg.block_m)[0] > 0  # a tail merged into the tile before it
    place_shared(monkeypatch, fold)
    got = fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    close(got, experts_fp8(x, w, ids, gu, dn, mlp, fold=bool(fold)), 1e-6)
    assert rel_err(got, float_experts(x, w, ids, gu, dn, mlp)) < LOOSE


@pytest.mark.interpret
def test_fp8_tiles_and_weights_are_checked():
    x, w, ids, gu, dn, mlp = make_fp8(2, 2, 4, 256, 128, 1)
    with pytest.raises(ValueError, match="BLOCK_K = 128"):
        fused_fp8(x, w, ids, gu, dn, mlp, dataclasses.replace(SMALL, gate_up=(64, 64, 4, 1)))
    coarse = quantize(dequantize(gu), 64, 2, 1)  # blocks of 64 columns: no GEMM form
    with pytest.raises(ValueError, match="blocks of 128 columns"):
        experts(x, w, ids, coarse, dn, mlp, impl="triton")
    with pytest.raises(ValueError, match="are not those of"):
        fused_fp8(x, w, ids, coarse, dn, mlp, SMALL)
    with pytest.raises(ValueError, match="gate_up_split 2: 1, or more slices"):
        fused_fp8(x, w, ids, gu, dn, mlp, dataclasses.replace(SMALL, gate_up_split=2))
    with pytest.raises(ValueError, match="down_split 0: 1, or more slices"):
        fused_fp8(x, w, ids, gu, dn, mlp, dataclasses.replace(SMALL, down_split=0))
    # Every other implementation dequantises: the float experts' values.
    close(experts(x, w, ids, coarse, dn, mlp), float_experts(x, w, ids, coarse, dn, mlp), 1e-5)


@pytest.mark.interpret
def test_tiny_moe_layer_in_fp8_matches_the_reference_layer():
    """A tiny preset's MoE layer with `quantize_fp8`'d weights (hidden 64 and moe_inter 32:
    one partial group; its shared expert apart), as the model calls it (`kernel_ops`): the
    Triton path's block-FP8 GEMMs against the reference path, which dequantises the weights
    and multiplies unquantised activations. They differ by the activations' e4m3 rounding
    (`LOOSE`: 4.3% here, of the experts' output and of the next norm), while h = residual +
    that matches `ops.moe_fp8` to float32 rounding."""
    cfg = mf.MLAConfig.preset("tiny")
    params = quantize_fp8(mf.init_params(cfg, seed=4))
    moe = params.layers[1].mlp
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, cfg.hidden_size, generator=g)
    h = torch.randn(6, cfg.hidden_size, generator=g) * 0.25
    w, ids = route(x, moe.router, moe.score_bias, cfg)
    counters = Runtime(x.device).counters
    args = (x, w, ids, moe, h, params.layers[2].input_norm, cfg.rms_norm_eps)
    got_h, got_y = kernel_ops.experts_add_norm(
        *args, KernelOptions(fused=True, experts="triton"), counters, defer_norm=False)
    ref_h, ref_y = kernel_ops.experts_add_norm(*args, KernelOptions(experts="reference"),
                                               counters, defer_norm=False)
    assert rel_err(got_h - h, ref_h - h) < LOOSE and rel_err(got_y, ref_y) < LOOSE
    fp8 = h + experts_fp8(x, w, ids, moe.gate_up, moe.down, moe.shared, fold=False)
    close(got_h, fp8, 1e-6)


def test_fp8_table_rows():
    """The FP8 rows: the bf16 rows' token bounds and paths, BLOCK_K one scale group."""
    assert [b for b, _ in FP8_CONFIGS] == [b for b, _ in CONFIGS]
    for (bound, cfg), (_, bf16) in zip(FP8_CONFIGS, CONFIGS, strict=True):
        assert cfg.gate_up[1] == cfg.down[1] == FP8_BLOCK_K
        same = ("direct", "pdl", "tma", "shared_stream", "inline_align", "last_sum",
                "merge_tail")
        assert all(getattr(cfg, f) == getattr(bf16, f) for f in same), bound
        assert pick_config(bound, fp8=True) is cfg
