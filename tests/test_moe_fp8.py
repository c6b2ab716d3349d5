"""The experts' block-FP8 GEMMs: kernels/moe/fp8_gemm.py (+ gate_up.py, down.py, fused.py,
shared_fp8.py in their FP8 form, config.py's FP8 rows), ops/moe_fp8.py (the torch reference of
their numerics) and mla_func.moe's wiring of `Fp8Weight` experts.

CPU: Triton under TRITON_INTERPRET=1, float32 activations (the 3.9 interpreter rounds float32
to bf16 as it rounds to e4m3: wrongly, see `fp8_gemm`), small sizes with K and moe_inter whole
and partial groups of 128. Against `ops.moe_fp8` the kernels agree to float32 rounding (the
order of each group's sum); against the float experts of the dequantised weights they differ by
the activations' e4m3 rounding (3 mantissa bits: each quantised value within 2^-4 of its own
size, about 3% RMS), twice (x, then the SwiGLU activation): 4-5% of the output's norm here,
bounded at 8% (`LOOSE`). The GPU test runs V2-Lite's shapes in bf16.
"""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from moe_helpers import close, place_shared, tails
from sm90_ptxas import run_compile_script

import mla_func as mf
from mla_func import kernel_ops
from mla_func.fp8 import FP8, dequantize, quantize, quantize_activations
from mla_func.kernels.act_quant import quant_rows, quant_tokens
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.moe.config import CONFIGS, FP8_BLOCK_K, FP8_CONFIGS, MoEConfig, pick_config
from mla_func.kernels.moe.fp8_gemm import Fp8Scales
from mla_func.kernels.moe.fused import fused_experts
from mla_func.kernels.plan import KernelOptions
from mla_func.moe import experts
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference, route
from mla_func.ops.moe_fp8 import experts_fp8
from mla_func.params import DenseMLP
from mla_func.quantize import quantize_fp8

# Tiles for the interpreter: BLOCK_K is one scale group; one or two N-tiles per GEMM.
SMALL = MoEConfig(16, (64, FP8_BLOCK_K, 4, 1), (128, FP8_BLOCK_K, 4, 1))
LOOSE = 0.08  # against unquantised activations: the norm of the difference over the result's


def make_fp8(tokens, topk, n_exp, hidden, inter, shared, seed=0, skew=False, device="cpu",
             dtype=torch.float32):
    """Random routing, and experts (+ a shared MLP `shared` experts wide) quantised in
    DeepSeek's blocks of 128 (x is `dtype`, fresh random)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    x = r(tokens, hidden, scale=1.0).to(dtype)
    gate_up = quantize(r(n_exp, 2, inter, hidden, scale=hidden**-0.5), 128, 2, 1)
    down = quantize(r(n_exp, hidden, inter, scale=inter**-0.5), 128, 1, 1)
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:topk] for _ in range(tokens)])
    if skew:  # every token's first choice is expert 0
        ids = torch.stack([torch.cat((torch.zeros(1, dtype=torch.long),
                                      torch.randperm(n_exp - 1, generator=g)[:topk - 1] + 1))
                           for _ in range(tokens)])
    weights = (torch.rand(tokens, topk, generator=g) + 0.1).to(device)
    mlp = None
    if shared:
        width = shared * inter
        mlp = DenseMLP(quantize(r(2, width, hidden, scale=hidden**-0.5), 128, 1, 1),
                       quantize(r(hidden, width, scale=width**-0.5), 128, 0, 1))
    return x, weights, ids.to(device), gate_up, down, mlp


def fused_fp8(x, weights, ids, gate_up, down, mlp, cfg, **kw):
    """`fused_experts` on the e4m3 data and scales of the weights (as `mla_func.moe` passes
    them)."""
    n = gate_up.shape[0]
    extra = {}
    if mlp is not None:
        extra = dict(shared_gate_up=mlp.gate_up.scales, shared_down=mlp.down.scales[0],
                     shared_rows=(mlp.gate_up.block[0], mlp.down.block[0]))
    scales = Fp8Scales(gate_up.scales.view(n, 2, *gate_up.scales.shape[1:]), down.scales,
                       (gate_up.block[0], down.block[0]), **extra)
    data = [w.data.view(w.shape) for w in (gate_up, down)]
    shared = [None, None] if mlp is None else [w.data.view(w.shape) for w in (mlp.gate_up,
                                                                               mlp.down)]
    return fused_experts(x, weights, ids, *data, *shared, cfg, scales=scales, **kw)


def float_experts(x, weights, ids, gate_up, down, mlp):
    """The float experts of the dequantised weights (unquantised activations)."""
    out = experts_reference(x, weights, ids, dequantize(gate_up, x.dtype),
                            dequantize(down, x.dtype))
    if mlp is not None:
        out = out + swiglu(x, mlp.gate_up, mlp.down)
    return out


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


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


# Ahead-of-time sm90 compiles (no GPU) of the FP8 kernels at V2-Lite sizes, every distinct
# (kernel, tile, path) of the FP8 rows, as `fused_experts` launches them: ptxas must report no
# spill (the rows were chosen so: `config.FP8_CONFIGS`).
_AOT = """
from sm90_ptxas import compile_sm90
from mla_func.kernels.moe.config import FP8_CONFIGS, FP8_SPILLS
from mla_func.kernels.moe.down import down_kernel
from mla_func.kernels.moe.gate_up import gate_up_kernel
ptrs = dict(weights_ptr="*fp32", ids_ptr="*i64", sorted_ptr="*i32", block_expert_ptr="*i32",
            block_rows_ptr="*i32", counter_ptr="*i32", eps="fp32", q_ptr="*fp32",
            qs_ptr="*fp32", w_ptr="*fp8e4nv", ws_ptr="*fp8e4nv")
seen, bad = set(), []
for bound, cfg in FP8_CONFIGS:
    bm = 16 if cfg.direct else cfg.block_m
    for fn, (bn, bk, warps, stages) in ((gate_up_kernel, cfg.gate_up), (down_kernel, cfg.down)):
        gate = fn is gate_up_kernel
        const = dict(PAIRS_PER_TOKEN=8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION="tf32",
                     EVEN_K=True, FP8=True, ROUND=False, DIRECT=cfg.direct, TMA=cfg.tma,
                     MERGE_TAIL=cfg.merge_tail, LOCAL=False)
        types = ptrs
        if gate:
            const.update(PDL=True, INLINE=cfg.inline_align, E_P2=128 if cfg.inline_align else 2,
                         P_BLOCK=(256 if bm == 16 else 1024) if cfg.inline_align else 1,
                         XQ=cfg.quant_x, SPLIT=cfg.gate_up_split)
            if cfg.quant_x:  # x comes quantised, its scales beside it
                types = dict(ptrs, x_ptr="*fp8e4nv", xs_ptr="*fp32")
            if cfg.gate_up_split > 1:  # K split: float32 partials, a counter a tile
                types = dict(types, part_ptr="*fp32", cnt_ptr="*i32")
        else:
            last = cfg.last_sum
            const.update(LAST_SUM=last, HAS_EXTRA=False, ADD_NORM=last, TRIGGER=last,
                         SUM_BLOCK=2048 if last else 1, AQ=cfg.quant_act)
            if cfg.quant_act:  # act comes quantised, its scales beside it
                types = dict(ptrs, act_ptr="*fp8e4nv", as_ptr="*fp32")
            if not cfg.merge_tail:
                const["act_tail_desc"] = None
            const["SPLIT"] = cfg.down_split
            if cfg.down_split > 1:  # K split: float32 partials, a counter a tile
                types = dict(types, part_ptr="*fp32", cnt_ptr="*i32")
        if not cfg.tma:
            const.update(w_desc=None, **({} if gate else dict(act_desc=None)))
        key = (gate, bm, bn, warps, stages, tuple(sorted(const.items())))
        if key in seen:
            continue
        seen.add(key)
        w_block = f"1, 2, {bn}, {bk}" if gate else f"{bn}, {bk}"
        act = "fp8e4nv" if cfg.quant_act else "bf16"
        descs = dict(w_desc=f"tensordesc<fp8e4nv[{w_block}]>",
                     act_desc=f"tensordesc<{act}[{bm}, {bk}]>",
                     act_tail_desc=f"tensordesc<{act}[{bm // 2}, {bk}]>")
        spills, report = compile_sm90(fn, const, types, descs, warps, stages)
        if spills and bound not in FP8_SPILLS:
            bad.append((bound, fn.__name__, spills))
assert not bad, bad
"""


@pytest.mark.cuda  # ~40 s of compiles, no GPU needed: with the GPU tests (their Triton's ptxas)
def test_fp8_rows_compile_for_sm90_without_spills():
    """Every FP8 row but those measured faster with their spills (`FP8_SPILLS`; the first
    row's kernels compile on every run: test_moe_cuda.py's
    `test_compiles_for_sm90_at_v2_lite_sizes`)."""
    out = run_compile_script(_AOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- GPU: V2-Lite shapes, bf16 --------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 100, 600, 3000])  # direct, inline, aligned, TMA (+tails)
def test_cuda_fp8_experts_at_v2_lite_shapes(tokens):
    """64 experts top-6, hidden 2048, moe_inter 1408 (11 groups), 2 shared experts (folded up
    to 512 tokens, apart past it), bf16 activations: the Triton FP8 path through
    `mla_func.moe.experts` against `ops.moe_fp8` (the tensor cores' fp8 sums of a group, and
    the bf16 activation's rounding before its quantisation, apart: 2% of the norm) and against
    the float experts of the dequantised weights (the activations' e4m3 rounding, `LOOSE`)."""
    x, w, ids, gu, dn, mlp = make_fp8(tokens, 6, 64, 2048, 1408, 2, seed=tokens, device="cuda",
                                      dtype=torch.bfloat16)
    got = experts(x, w, ids, gu, dn, mlp, impl="triton")
    assert got.dtype == torch.bfloat16
    want = experts_fp8(x, w, ids, gu, dn, mlp, fold=tokens <= 512)
    # 1.3% at 100 tokens on an H200: each GEMM's tensor-core sums sit ~0.3% from float32
    # (tests/test_kernels_fp8_linear.py), and the SwiGLU activations they give are quantised
    # again, where one value rounded to its other e4m3 neighbour moves by up to 12%.
    assert rel_err(got, want) < 2e-2
    close(got, want, 0.05)
    assert rel_err(got, float_experts(x, w, ids, gu, dn, mlp)) < LOOSE


@pytest.mark.cuda
@pytest.mark.parametrize("tokens,split,down_split", [(1, 3, 1), (1, 2, 2), (4, 2, 3)])
def test_cuda_fp8_split_gemms_replay_bitwise(tokens, split, down_split):
    """gate_up's and down's K in slices (`MoEConfig.gate_up_split`, `down_split`, the direct
    layout) at V2-Lite's shapes: the unsplit layer's output but for the order of its float32
    sums (which the bf16 `act` and pair rows mostly round away), the same bits on every call
    and in a CUDA graph's replay (the last slice to arrive sums in slice order), and the
    reference's `ops.moe_fp8` as close as the unsplit layer is."""
    x, w, ids, gu, dn, mlp = make_fp8(tokens, 6, 64, 2048, 1408, 2, seed=tokens, device="cuda",
                                      dtype=torch.bfloat16)
    cfg = dataclasses.replace(pick_config(tokens, fp8=True), direct=True, gate_up_split=split,
                              down_split=down_split)
    got = fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    whole = fused_fp8(x, w, ids, gu, dn, mlp,
                      dataclasses.replace(cfg, gate_up_split=1, down_split=1))
    assert rel_err(got, whole) < 1e-2
    assert rel_err(got, experts_fp8(x, w, ids, gu, dn, mlp, fold=True)) < 2e-2
    for _ in range(5):
        assert torch.equal(fused_fp8(x, w, ids, gu, dn, mlp, cfg), got)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture
        fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_fp8(x, w, ids, gu, dn, mlp, cfg)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)
