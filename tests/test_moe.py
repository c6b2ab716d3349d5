"""mla_func.moe and kernels/moe_align.py, moe_config.py, moe_gemm.py, fused_moe.py against
ops.moe.experts_reference.

CPU: Triton under TRITON_INTERPRET=1 (conftest sets it without a GPU) at small sizes, float32
(the 3.9 interpreter's bf16 tl.dot is wrong, so bf16 runs under `-m cuda` only). GPU: real
V2-Lite / V3 shapes in bf16, plus CUDA-graph capture and replay.
"""

import dataclasses

import pytest
import torch
from sm90_ptxas import run_compile_script

from mla_func.config import MLAConfig
from mla_func.kernels import fused_moe, moe_align
from mla_func.kernels.fused_moe import ADD_NORM_MAX_WIDTH, fused_experts, side_stream
from mla_func.kernels.moe_align import align_torch, align_triton, pair_experts
from mla_func.kernels.moe_config import (
    CONFIGS,
    DIRECT_MAX_TOKENS,
    FUSE_SHARED_MAX_TOKENS,
    MoEConfig,
    pick_config,
)
from mla_func.kernels.norm import add_rmsnorm
from mla_func.kernels.router import route_fused
from mla_func.moe import experts, experts_add_norm
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference, route
from mla_func.ops.norm import rmsnorm as rmsnorm_ref
from mla_func.params import DenseMLP

# Tiles for the interpreter: one N-tile per GEMM at these sizes keeps the program count low.
SMALL = MoEConfig(16, (32, 64, 4, 1), (64, 32, 4, 1))
DIRECT = dataclasses.replace(SMALL, direct=True)
DIRECT_SUM = dataclasses.replace(SMALL, direct=True, fused_sum=True)


def make(tokens, topk, n_exp, hidden, inter, shared, dtype=torch.float32, device="cpu",
         skew=False, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)  # real-size weights made on device

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gd, device=device) * scale).to(dtype)

    x = r(tokens, hidden)
    gate_up = r(n_exp, 2, inter, hidden, scale=hidden**-0.5)
    down = r(n_exp, hidden, inter, scale=inter**-0.5)
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:topk] for _ in range(tokens)])
    if skew:  # every token's first choice is expert 0
        ids = torch.stack([torch.cat((torch.zeros(1, dtype=torch.long),
                                      torch.randperm(n_exp - 1, generator=g)[: topk - 1] + 1))
                           for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=g).to(device) + 0.1
    mlp = None
    if shared:
        mlp = DenseMLP(r(2, shared * inter, hidden, scale=hidden**-0.5),
                       r(hidden, shared * inter, scale=(shared * inter) ** -0.5))
    return x, weights, ids.to(device), gate_up, down, mlp


def reference(x, weights, ids, gate_up, down, mlp):
    out = experts_reference(x, weights, ids, gate_up, down)
    return out if mlp is None else out + swiglu(x, mlp.gate_up, mlp.down)


def close(a, b, tol):
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol * b.float().abs().max().item(), err


@pytest.fixture
def nan_empty(monkeypatch):
    """New buffers (`torch.empty`, `torch.empty_like`) start as NaN, or -7 for integer ones:
    a kernel that reads a row or a layout entry nothing wrote shows."""
    def poisoned(alloc):
        def make(*args, **kwargs):
            t = alloc(*args, **kwargs)
            if t.is_floating_point():
                return t.fill_(float("nan"))
            return t.fill_(-7) if t.dtype in (torch.int32, torch.int64) else t
        return make

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))


@pytest.mark.parametrize("tokens,topk,n_exp,shared,block_m,skew", [
    (1, 6, 64, 2, 16, False), (5, 2, 8, 1, 4, False), (33, 6, 64, 0, 16, False),
    (17, 8, 256, 1, 16, False), (9, 2, 8, 0, 1, False), (40, 6, 64, 2, 16, True),
    (300, 6, 64, 2, 16, False)])  # 2400 pairs: 19 (or 150) sliced programs
@pytest.mark.parametrize("sliced", [0, 128, 16])
def test_align_kernel_matches_torch(tokens, topk, n_exp, shared, block_m, skew, sliced,
                                    monkeypatch):
    # 0: one program at every size; else the two sliced launches, with 16-pair slices too
    # (150 at 300 tokens, so several steps over the counts).
    monkeypatch.setattr(moe_align, "ONE_PROGRAM_MAX_BINNED", 0 if sliced else 1 << 40)
    if sliced:
        monkeypatch.setattr(moe_align, "ALIGN_SLICE", sliced)
    ids = make(tokens, topk, n_exp, 8, 8, 0, skew=skew)[2]
    a, b = align_torch(ids, n_exp, shared, block_m), align_triton(ids, n_exp, shared, block_m)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    real = (torch.arange(block_m)[None] < a[2][:, None]).flatten()
    # The same rows in the same (stable) order: the interpreter's atomics go in lane order.
    assert torch.equal(a[0][real], b[0][real])
    # The shared experts' runs first, in token order (what `shared_tile` reads off the sizes).
    per = -(-tokens // block_m)
    want = torch.arange(n_exp, n_exp + shared).repeat_interleave(per)
    assert torch.equal(a[1][: shared * per], want.to(a[1].dtype))
    pairs = torch.arange(tokens)[None] * (topk + shared) + topk + torch.arange(shared)[:, None]
    head = a[0][: shared * per * block_m].view(shared, per * block_m)[:, :tokens]
    assert torch.equal(head, pairs.to(head.dtype))
    rows = a[0][real].long()
    assert sorted(rows.tolist()) == list(range(tokens * (topk + shared)))
    expert_of_row = a[1].repeat_interleave(block_m)[real].long()
    assert torch.equal(pair_experts(ids, n_exp, shared)[rows], expert_of_row)
    c = align_torch(ids.int(), n_exp, shared, block_m)  # int32 ids work too
    assert all(torch.equal(u, v) for u, v in zip(a, c, strict=True))


@pytest.mark.parametrize("tokens,topk,n_exp,hidden,inter,shared,skew,fold", [
    (1, 6, 64, 64, 32, 2, False, None),   # most experts get no token
    (7, 2, 8, 64, 32, 1, False, None),
    (33, 2, 8, 32, 16, 0, False, None),   # several M-tiles per expert
    (24, 6, 64, 64, 32, 0, True, None),   # skewed: every token to expert 0
    (2, 8, 256, 32, 16, 1, False, None),  # V3 expert count, tiny dims
    (5, 2, 8, 48, 24, 1, False, None),    # K and N not multiples of the tiles
    (70, 2, 8, 32, 16, 1, False, False),  # shared MLP apart: added in the final sum
    (70, 2, 8, 32, 16, 1, False, True),   # shared experts folded over several M-tiles
])
def test_fused_matches_reference(tokens, topk, n_exp, hidden, inter, shared, skew, fold,
                                 nan_empty):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, skew=skew)
    want = reference(x, w, ids, gu, dn, mlp)
    cfg = dataclasses.replace(SMALL, fuse_shared=fold)
    got = fused_experts(x, w, ids, gu, dn, mlp and mlp.gate_up, mlp and mlp.down, cfg)
    close(got, want, 1e-5)
    close(experts(x, w, ids, gu, dn, mlp, impl="sorted_torch"), want, 1e-5)


@pytest.mark.parametrize("tokens,topk,n_exp,hidden,inter,shared", [
    (33, 2, 8, 32, 16, 0),   # several M-tiles per expert
    (5, 2, 8, 48, 24, 1),    # tiles past hidden and moe_inter: TMA fills zeros, rows of the
                             # next down matrix land in masked columns
    (40, 6, 64, 64, 32, 2),  # most experts empty
])
# The NaN padding rows of `act` meet the interpreter's numpy multiply (and are masked off).
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_tma_matches_reference_and_pointer_loads(tokens, topk, n_exp, hidden, inter, shared,
                                                nan_empty):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, seed=tokens)
    s_gu, s_dn = (None, None) if mlp is None else (mlp.gate_up, mlp.down)
    cfg = dataclasses.replace(SMALL, fuse_shared=False)
    # TMA reads `act`'s padding rows, which nothing writes: they are NaN here (`nan_empty`), so
    # any of it that reaches a real row shows.
    pointer = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, cfg)
    got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, dataclasses.replace(cfg, tma=True))
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    # Not bit for bit here: numpy's float32 products of another width round otherwise (the
    # GPU test checks the bits of bf16 wgmma).
    close(got, pointer, 1e-6)
    with pytest.raises(ValueError, match="tma needs the aligned layout and the shared"):
        fused_experts(x, w, ids, gu, dn, s_gu, s_dn, dataclasses.replace(SMALL, tma=True,
                      fuse_shared=True) if shared else dataclasses.replace(DIRECT, tma=True))
    with pytest.raises(ValueError, match="tma needs contiguous expert weights"):
        fused_experts(x, w, ids, torch.cat((gu, gu), 2)[:, :, :inter], dn,
                      config=dataclasses.replace(cfg, tma=True))


@pytest.mark.parametrize("tokens,topk,n_exp,skew", [
    (64, 2, 8, False),   # runs of 1 and 2 units: 3 whole tiles, 5 half tiles
    (40, 6, 64, False),  # every run one half tile; empty experts
    (30, 2, 8, True),    # one expert takes every token: a whole tile, then half tiles
])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_halves_match_whole_tiles_and_reference(tokens, topk, n_exp, skew, tma):
    """`MoEConfig.halves`: runs padded to half tiles, two units a program (one whole tile or
    up to two half tiles): the reference's result and the whole-tile layout's."""
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, 32, 16, 1, skew=skew, seed=tokens)
    cfg = MoEConfig(8 * 4, (32, 64, 4, 1), (64, 32, 4, 1), fuse_shared=False, tma=tma)
    whole = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(cfg, halves=True))
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    close(got, whole, 1e-6)  # numpy's products of another height may round otherwise
    for bad in (dataclasses.replace(cfg, halves=True, fuse_shared=True, tma=False),
                dataclasses.replace(DIRECT, halves=True),
                dataclasses.replace(cfg, halves=True, block_m=16)):
        with pytest.raises(ValueError, match="halves needs"):
            fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, bad)


@pytest.mark.parametrize("tokens,topk,n_exp,hidden,inter,shared,fuse_shared", [
    (1, 6, 64, 64, 32, 2, None),   # decode: no expert read twice
    (2, 2, 8, 64, 32, 1, None),
    (3, 6, 64, 64, 32, 0, None),   # no shared experts
    (4, 6, 8, 48, 24, 2, None),    # experts repeated across tokens; K, N not tile multiples
    (4, 2, 8, 64, 32, 1, False),   # shared MLP apart: added in the (fused) sum
])
def test_direct_matches_reference_and_aligned(tokens, topk, n_exp, hidden, inter, shared,
                                              fuse_shared, nan_empty):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, seed=tokens)
    s_gu, s_dn = (None, None) if mlp is None else (mlp.gate_up, mlp.down)
    want = reference(x, w, ids, gu, dn, mlp)
    aligned = fused_experts(x, w, ids, gu, dn, s_gu, s_dn,
                            dataclasses.replace(SMALL, fuse_shared=fuse_shared))
    close(aligned, want, 1e-5)
    for cfg in (DIRECT, DIRECT_SUM):
        got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn,
                            dataclasses.replace(cfg, fuse_shared=fuse_shared))
        close(got, want, 1e-5)
        # Same tiles, same order of the fp32 sums: the paths agree bit for bit.
        assert torch.equal(got, aligned), cfg


@pytest.mark.parametrize("cfg,shared,fuse_shared,wide", [
    (SMALL, 2, None, False),        # shared experts folded in
    (SMALL, 1, False, False),       # shared MLP apart: added in the same final sum
    (SMALL, 2, None, True),         # rows wider than one program holds: sum, then add+norm
    (DIRECT, 2, None, False),
    (DIRECT_SUM, 1, None, False),   # the down GEMM sums: the add and the norm run after it
])
def test_add_norm_equals_experts_then_add_rmsnorm(cfg, shared, fuse_shared, wide,
                                                  monkeypatch, nan_empty):
    """`add_norm` gives the bits of `norm.add_rmsnorm(residual, experts)` (the rounding of
    the two launches it replaces), and the reference's values through `experts_add_norm`."""
    if wide:  # 96 columns stand for V3's 7168
        monkeypatch.setattr(fused_moe, "ADD_NORM_MAX_WIDTH", 64)
    x, w, ids, gu, dn, mlp = make(4, 6, 64, 96, 32, shared, seed=11)
    residual = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(x.shape[1])
    cfg = dataclasses.replace(cfg, fuse_shared=fuse_shared)
    out = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    want_h, want_y = add_rmsnorm(residual, out, weight, 1e-6)
    h, y = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg,
                         add_norm=(residual, weight, 1e-6))
    assert torch.equal(h, want_h) and torch.equal(y, want_y)
    ref_h = residual + reference(x, w, ids, gu, dn, mlp)
    close(h, ref_h, 1e-5)
    close(y, rmsnorm_ref(ref_h, weight, 1e-6), 1e-5)
    sorted_h, sorted_y = experts_add_norm(x, w, ids, gu, dn, mlp, residual, weight, 1e-6,
                                          impl="sorted_torch")
    close(sorted_h, ref_h, 1e-5)
    close(sorted_y, y, 1e-5)
    with pytest.raises(ValueError, match="add_norm: the residual is"):
        fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg,
                      add_norm=(residual.double(), weight, 1e-6))


def test_add_norm_wider_than_one_program(nan_empty):
    """Rows wider than ADD_NORM_MAX_WIDTH (V3's 7168 on a GPU; here 2112 columns, so the last
    of the sum's column blocks is partial) on a decode step's table row: the sum, then
    `norm.add_rmsnorm` over the whole row, against the reference (the other paths to it run
    at 96 columns in the test above)."""
    x, w, ids, gu, dn, mlp = make(3, 2, 8, 2112, 16, 1, seed=12)
    assert x.shape[1] > ADD_NORM_MAX_WIDTH
    residual = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(x.shape[1])
    h, y = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, pick_config(3),
                         add_norm=(residual, weight, 1e-6))
    ref_h = residual + reference(x, w, ids, gu, dn, mlp)
    close(h, ref_h, 1e-5)
    close(y, rmsnorm_ref(ref_h, weight, 1e-6), 1e-5)


@pytest.mark.parametrize("bound", [128, 256, 512, 1024, 4096])
@pytest.mark.parametrize("triton_align", [False, True])
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_table_rows_match_reference(bound, triton_align, nan_empty, monkeypatch):
    """The aligned rows of the config table as they are (block_m, tiles, TMA; hidden 256 and
    moe_inter 128 leave every tile unshrunk, with K a multiple of BLOCK_K as at real sizes) on
    150 skewed tokens, from the layout of `align_torch` (`align` on the CPU) or of
    `align_triton` (on a GPU): its sliced launches with the shared experts folded in, its one
    program with them apart."""
    cfg = pick_config(bound)
    if bound > FUSE_SHARED_MAX_TOKENS:  # apart, as at the row's own token counts (TMA needs it)
        cfg = dataclasses.replace(cfg, fuse_shared=False)
    calls = []
    if triton_align:
        def spy(*args):
            calls.append(args)
            return align_triton(*args)

        monkeypatch.setattr(fused_moe, "align", spy)
    x, w, ids, gu, dn, mlp = make(150, 6, 64, 256, 128, 2, skew=True, seed=bound)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    assert len(calls) == triton_align


def test_direct_config_checks():
    assert pick_config(DIRECT_MAX_TOKENS).direct and not pick_config(DIRECT_MAX_TOKENS + 1).direct
    x, w, ids, gu, dn, _ = make(17, 2, 8, 32, 16, 0)
    with pytest.raises(ValueError, match="at most 16 tokens"):
        fused_experts(x, w, ids, gu, dn, config=DIRECT)
    with pytest.raises(ValueError, match="fused_sum needs the direct layout"):
        fused_experts(x, w, ids, gu, dn, config=dataclasses.replace(SMALL, fused_sum=True))


@pytest.mark.parametrize("cfg", [SMALL, DIRECT, DIRECT_SUM])
def test_shared_stream_off_cuda_runs_in_order(cfg):
    """Without CUDA streams `shared_stream` runs the shared experts in order: the same bits.
    With the shared experts folded in there is nothing to run beside: an error."""
    x, w, ids, gu, dn, mlp = make(4, 2, 8, 64, 32, 2, seed=7)
    apart = dataclasses.replace(cfg, fuse_shared=False)
    want = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, apart)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(apart, shared_stream=True))
    assert torch.equal(got, want)
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    # No shared experts: the flag has nothing to move.
    alone = dataclasses.replace(cfg, shared_stream=True)
    assert torch.equal(fused_experts(x, w, ids, gu, dn, config=alone),
                       fused_experts(x, w, ids, gu, dn, config=cfg))
    with pytest.raises(ValueError, match="shared_stream needs the shared experts apart"):
        fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                      dataclasses.replace(alone, fuse_shared=True))


def test_shared_stream_only_where_shared_experts_run_apart():
    """A table row may set `shared_stream` only where no token count it covers folds the
    shared experts in (that raises)."""
    low = 0
    for bound, cfg in CONFIGS:
        folds = cfg.fuse_shared or (cfg.fuse_shared is None and low < FUSE_SHARED_MAX_TOKENS)
        assert not (cfg.shared_stream and folds), (bound, cfg)
        low = bound


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy", "noaux_tc"])
def test_routing_methods(method):
    cfg = dataclasses.replace(
        MLAConfig.preset("tiny"), n_routed_experts=64, num_experts_per_tok=6, n_group=8,
        topk_group=3, topk_method=method, norm_topk_prob=method == "noaux_tc",
        routed_scaling_factor=2.5 if method == "noaux_tc" else 1.0)
    x, _, _, gu, dn, mlp = make(6, 6, 64, 64, 32, 1, seed=1)
    router = torch.randn(64, 64)
    bias = torch.randn(64) * 0.1 if method == "noaux_tc" else None
    w, ids = route(x, router, bias, cfg)
    want = reference(x, w, ids, gu, dn, mlp)
    close(experts(x, w, ids, gu, dn, mlp, impl="triton"), want, 1e-5)
    close(experts(x, w, ids, gu, dn, mlp), want, 1e-5)  # CPU default: sorted_torch


@pytest.mark.parametrize("impl", ["sorted_torch", "triton"])
def test_padded_rows_do_not_change_real_rows(impl, nan_empty):
    x, w, ids, gu, dn, mlp = make(12, 2, 8, 64, 32, 1, seed=2)
    real = experts(x[:5], w[:5], ids[:5], gu, dn, mlp, impl=impl)
    padded = experts(x, w, ids, gu, dn, mlp, impl=impl)  # rows 5.. stand for bucket padding
    torch.testing.assert_close(padded[:5], real, rtol=1e-6, atol=1e-6)


def test_unknown_impl():
    x, w, ids, gu, dn, _ = make(2, 2, 8, 32, 16, 0)
    with pytest.raises(ValueError, match="unknown experts impl"):
        experts(x, w, ids, gu, dn, impl="nope")


def test_traces_with_symbolic_tokens():
    """The sorted path and the Triton op both export with a dynamic token count."""
    x, w, ids, gu, dn, mlp = make(9, 2, 8, 32, 16, 1)
    tokens = torch.export.Dim("tokens", min=2, max=1024)
    class Experts(torch.nn.Module):
        def __init__(self, impl):
            super().__init__()
            self.impl = impl

        def forward(self, x, w, ids):
            return experts(x, w, ids, gu, dn, mlp, impl=self.impl)

    for impl in ("sorted_torch", "triton"):
        ep = torch.export.export(Experts(impl), (x, w, ids), dynamic_shapes=({0: tokens},) * 3)
        close(ep.module()(x, w, ids), reference(x, w, ids, gu, dn, mlp), 1e-5)


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.moe_gemm import down_kernel, down_sum_kernel, gate_up_kernel
ptrs = dict(weights_ptr="*fp32", ids_ptr="*i64", sorted_ptr="*i32", block_expert_ptr="*i32",
            block_rows_ptr="*i32")
no_tma = dict(TMA=False, w_desc=None, HALVES=False)
no_act = dict(act_desc=None, act_half_desc=None)
for fn, (bm, bn, bk, warps, stages), const in [
        (gate_up_kernel, (16, 32, 128, 4, 4), dict(DIRECT=False, PDL=True, **no_tma)),
        (gate_up_kernel, (16, 32, 128, 4, 4), dict(DIRECT=True, PDL=True, **no_tma)),
        (down_kernel, (16, 64, 128, 4, 4), dict(DIRECT=False, **no_act, **no_tma)),
        (down_kernel, (16, 64, 128, 4, 4), dict(DIRECT=True, **no_act, **no_tma)),
        (down_sum_kernel, (16, 16, 256, 4, 4), dict(HAS_EXTRA=False)),
        # The large-token configuration: expert weights (and act) through TMA descriptors,
        # whole tiles only or also half tiles.
        (gate_up_kernel, (128, 128, 64, 8, 4), dict(DIRECT=False, PDL=True, TMA=True,
                                                    HALVES=False)),
        (down_kernel, (128, 256, 64, 8, 4), dict(DIRECT=False, TMA=True, HALVES=False,
                                                 act_half_desc=None)),
        (gate_up_kernel, (128, 128, 64, 8, 4), dict(DIRECT=False, PDL=True, TMA=True,
                                                    HALVES=True)),
        (down_kernel, (128, 256, 64, 8, 4), dict(DIRECT=False, TMA=True, HALVES=True))]:
    const = dict(PAIRS_PER_TOKEN=8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION="tf32",
                 EVEN_K=(1408 if fn is not gate_up_kernel else 2048) % bk == 0, **const)
    w_block = f"1, 2, {bn}, {bk}" if fn is gate_up_kernel else f"{bn}, {bk}"
    descs = dict(w_desc=f"tensordesc<bf16[{w_block}]>", act_desc=f"tensordesc<bf16[{bm}, {bk}]>",
                 act_half_desc=f"tensordesc<bf16[{bm // 2}, {bk}]>")
    sig = {n: "constexpr" if n in const else descs[n] if n in descs
           else ptrs.get(n, "*bf16") if n.endswith("_ptr") else "i32" for n in fn.arg_names}
    # What a launch at V2-Lite sizes specialises on: aligned pointers, strides and dims.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n][0] == "*" or n.startswith(("stride", "n_inter", "n_hidden"))}
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    _, spills, report = ptxas_usage(kernel)
    assert spills == 0, report
from mla_func.kernels.moe_gemm import sum_kernel
for add_norm, block in ((False, 1024), (True, 2048)):  # as fused_experts launches it
    const = dict(PAIRS_PER_TOKEN=8, HAS_EXTRA=True, ADD_NORM=add_norm, BLOCK=block)
    sig = {n: "constexpr" if n in const else "fp32" if n == "eps"
           else "*bf16" if n.endswith("_ptr") else "i32" for n in sum_kernel.arg_names}
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=sum_kernel, signature=sig, constexprs=const),
        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    _, spills, report = ptxas_usage(kernel)
    assert spills == 0, report
"""


def test_compiles_for_sm90_at_v2_lite_sizes():
    """Ahead-of-time sm90 compile (no GPU needed) of both layouts, the fused sum and the final
    sum with and without the residual add and norm."""
    out = run_compile_script(_AOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- GPU: real sizes, bf16 ------------------------------------------------------------------

V2_LITE = dict(topk=6, n_exp=64, hidden=2048, inter=1408, shared=2)
V3 = dict(topk=8, n_exp=256, hidden=7168, inter=2048, shared=1)


@pytest.mark.cuda
@pytest.mark.parametrize("shape,tokens", [
    pytest.param(shape, t, id=f"{name}-{t}") for name, shape, tokens in (
        ("v2lite", V2_LITE, (1, 7, 32, 128, 512, 4096)), ("v3", V3, (1, 512)))
    for t in tokens])
@pytest.mark.parametrize("skew", [False, True])
def test_cuda_real_sizes(shape, tokens, skew):
    torch.cuda.empty_cache()
    x, w, ids, gu, dn, mlp = make(tokens, **shape, dtype=torch.bfloat16, device="cuda",
                                  skew=skew)
    want = reference(x, w, ids, gu, dn, mlp)
    got = experts(x, w, ids, gu, dn, mlp)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 2e-2, err  # bf16: the two round gate/up/act at different points
    close(got, want, 0.05)
    a, b = align_torch(ids, shape["n_exp"], 1, 16), align_triton(ids, shape["n_exp"], 1, 16)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert torch.equal(runs(a, 16), runs(b, 16))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens, shape", [
    (1, V2_LITE), (32, V2_LITE), (128, V2_LITE), (1024, V2_LITE),
    (1, {**V3, "n_exp": 16}), (32, {**V3, "n_exp": 16})])  # V3's width, fewer experts
def test_cuda_add_norm_equals_experts_then_add_rmsnorm(tokens, shape):
    """At V2-Lite size on each table row's path, and at V3's width (the sum, then
    `add_rmsnorm`): the two launches it replaces, and the torch reference's values (at V3's
    width the first check runs the very code the op runs; this one does not)."""
    x, w, ids, gu, dn, mlp = make(tokens, **shape, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(x.shape[1], device="cuda")).to(torch.bfloat16)
    want_h, want_y = add_rmsnorm(residual, experts(x, w, ids, gu, dn, mlp), weight, 1e-6)
    h, y = experts_add_norm(x, w, ids, gu, dn, mlp, residual, weight, 1e-6)
    assert torch.equal(h, want_h)
    # The same sum of squares in another program: at most the last bit of a bf16 apart.
    torch.testing.assert_close(y, want_y, rtol=2**-7, atol=0)
    ref_h = residual + reference(x, w, ids, gu, dn, mlp)
    for got, want in ((h, ref_h), (y, rmsnorm_ref(ref_h, weight, 1e-6))):
        # bf16, as in test_cuda_real_sizes: the two round gate/up/act at different points
        # (H100: 4-6e-3 at every size here).
        err = (got.float() - want.float()).norm() / want.float().norm()
        assert err < 2e-2, err
        close(got, want, 0.05)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [300, 4096])
def test_cuda_tma_matches_pointer_loads(tokens):
    """The large-token tiles with TMA loads: the reference's result, and the pointer-load
    kernels' bits (the same tiles and the same order of sums)."""
    x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    cfg = MoEConfig(128, (128, 64, 8, 4), (128, 64, 8, 4), fuse_shared=False)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(cfg, tma=True))
    want = reference(x, w, ids, gu, dn, mlp)
    assert ((got.float() - want.float()).norm() / want.float().norm()) < 2e-2
    assert torch.equal(got, fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [300, 2048, 4096])
@pytest.mark.parametrize("tma", [False, True])
def test_cuda_halves_match_whole_tiles(tokens, tma):
    """Half tiles (`MoEConfig.halves`) at V2-Lite size: the reference's result, and the bits
    of whole tiles (every row's products run over K in the same order)."""
    x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    cfg = MoEConfig(128, (128, 64, 8, 4), (256, 64, 8, 4), fuse_shared=False, tma=tma)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(cfg, halves=True))
    want = reference(x, w, ids, gu, dn, mlp)
    assert ((got.float() - want.float()).norm() / want.float().norm()) < 2e-2
    assert torch.equal(got, fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg))


def runs(layout, block_m):
    """Each real row as (expert, pair), sorted: the pairs of every expert's run, whatever their
    order inside it (the one-program kernel's follows atomic timing on a GPU)."""
    sorted_pairs, block_expert, block_rows = layout
    real = (torch.arange(block_m, device=block_rows.device)[None] < block_rows[:, None])
    expert = block_expert[:, None].expand(-1, block_m)[real].long()
    return (expert * (1 << 32) + sorted_pairs.view(-1, block_m)[real].long()).sort().values


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_cuda_direct_matches_aligned(tokens):
    x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    aligned = dataclasses.replace(pick_config(tokens), direct=False, pdl=False)  # same tiles
    want = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, aligned)
    close(want, reference(x, w, ids, gu, dn, mlp), 0.05)
    for fused_sum, pdl in ((False, False), (True, False), (False, True)):
        cfg = dataclasses.replace(aligned, direct=True, fused_sum=fused_sum, pdl=pdl)
        got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
        assert torch.equal(got, want), (fused_sum, pdl)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4, 8, 128, 1024, 4096])
def test_cuda_pdl_behind_router_matches(tokens):
    """The alignment and the gate_up kernel launched while the router runs (`pdl`: shared
    tiles start early, routed tiles wait for the ids / layout) give the results of the plain
    launches, eagerly and replayed. The inputs alternate, so a tile that read the routing too
    early would read the other input's."""
    cfg = MLAConfig.preset("v2-lite")
    router = torch.randn(64, 2048, device="cuda") * 2048**-0.5
    inputs = [make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda", seed=seed)
              for seed in (5, 6)]
    gu, dn, mlp = inputs[0][3:]

    def layer(x, pdl):
        w, ids = route_fused(x, router, None, cfg)
        config = dataclasses.replace(pick_config(tokens), pdl=pdl)
        return fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, config)

    wants = [layer(inp[0], False) for inp in inputs]
    # Bit-identical up to the direct layout; the aligned one's routed rows may be ordered
    # otherwise by the alignment's atomics, which changes no bit either (rows are independent).
    for i in range(20):
        assert torch.equal(layer(inputs[i % 2][0], True), wants[i % 2]), i
    static = inputs[0][0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static, True)
    for i in range(20):
        static.copy_(inputs[i % 2][0])
        graph.replay()
        assert torch.equal(out, wants[i % 2]), i


DIRECT_SUM_V2 = MoEConfig(16, (32, 128, 4, 4), (16, 256, 4, 4), direct=True, fused_sum=True)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens,config", [
    (1, None), (8, None), (128, None), (4096, None), (1, DIRECT_SUM_V2), (4, DIRECT_SUM_V2)])
def test_cuda_graph_replay_matches_eager(tokens, config):
    x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    static = [t.clone() for t in (x, w, ids)]
    if config is None:
        run = lambda *a: experts(*a, gu, dn, mlp)  # noqa: E731
    else:
        run = lambda *a: fused_experts(*a, gu, dn, mlp.gate_up, mlp.down, config)  # noqa: E731
    fn = lambda: run(*static)  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up: compiles the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for seed in (3, 4):  # fresh routing every replay
        x2, w2, ids2, *_ = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda",
                                seed=seed)
        for dst, src in zip(static, (x2, w2, ids2), strict=True):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, run(x2, w2, ids2), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [600, 4096])
def test_cuda_shared_stream_matches_serial(tokens):
    """The shared experts on the side stream give the serial path's bits, eagerly (many calls
    queued without a sync: a block the caching allocator handed out too early would show) and
    replayed. Router included, as in the model: the fork follows it (and its PDL dependents).
    The inputs alternate, so a sum that read the shared result before the join would read the
    other input's."""
    cfg = MLAConfig.preset("v2-lite")
    router = torch.randn(64, 2048, device="cuda") * 2048**-0.5
    inputs = [make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda", seed=seed)[0]
              for seed in (8, 9)]
    gu, dn, mlp = make(1, **V2_LITE, dtype=torch.bfloat16, device="cuda", seed=10)[3:]
    assert side_stream(inputs[0].device) is side_stream(inputs[0].device)
    assert side_stream(inputs[0].device) != torch.cuda.current_stream()

    def layer(x, on):
        w, ids = route_fused(x, router, None, cfg)
        config = dataclasses.replace(pick_config(tokens), fuse_shared=False, shared_stream=on)
        return fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, config)

    wants = [layer(x, False) for x in inputs]
    w, ids = route_fused(inputs[0], router, None, cfg)
    close(wants[0], reference(inputs[0], w, ids, gu, dn, mlp), 0.05)
    outs = [layer(inputs[i % 2], True) for i in range(10)]
    for i, out in enumerate(outs):
        assert torch.equal(out, wants[i % 2]), i
    for on in (False, True):
        static = inputs[0].clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(static, on)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(static, on)
        for i in range(1, 7):
            static.copy_(inputs[i % 2])
            graph.replay()
            assert torch.equal(out, wants[i % 2]), (on, i)
