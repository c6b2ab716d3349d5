"""mla_func.moe and kernels/moe/align.py, inline_align.py, config.py, gemm.py,
gate_up.py, down.py, pair_sum.py, fused.py against ops.moe.experts_reference; the
MoE sub-layer of the fused path (`kernel_ops`: kernels/router/route.py feeding the experts)
against the reference routing, experts, add and norm.

CPU: Triton under TRITON_INTERPRET=1 (conftest sets it without a GPU) at small sizes, float32
(the 3.9 interpreter's bf16 tl.dot is wrong, so bf16 runs under `-m cuda` only). The GPU tests
(real V2-Lite / V3 shapes in bf16, CUDA-graph capture and replay) and the sm90 compiles are in
test_moe_cuda.py; shared inputs in moe_helpers.py.
"""

import dataclasses
import math

import pytest
import torch
from moe_helpers import (
    DIRECT,
    DIRECT_LAST,
    SMALL,
    close,
    make,
    moe_layer,
    place_shared,
    reference,
    reference_layer,
    same_routing,
    tails,
)

from mla_func import kernel_ops
from mla_func.config import MLAConfig
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.linear.norm import add_rmsnorm
from mla_func.kernels.moe import align as moe_align
from mla_func.kernels.moe import fused as fused_moe
from mla_func.kernels.moe.align import align_torch, align_triton, pair_experts
from mla_func.kernels.moe.config import (
    CONFIGS,
    DIRECT_MAX_TOKENS,
    FUSE_SHARED_MAX_TOKENS,
    MoEConfig,
    pick_config,
)
from mla_func.kernels.moe.fused import ADD_NORM_MAX_WIDTH, fused_experts
from mla_func.kernels.plan import KernelOptions
from mla_func.moe import experts, experts_add_norm
from mla_func.ops.moe import route
from mla_func.ops.norm import rmsnorm as rmsnorm_ref


@pytest.mark.parametrize("tokens,topk,n_exp,shared,block_m,skew", [
    (1, 6, 64, 2, 16, False), (5, 2, 8, 1, 4, False), (33, 6, 64, 0, 16, False),
    (17, 8, 256, 1, 16, False), (9, 2, 8, 0, 1, False), (40, 6, 64, 2, 16, True),
    (300, 6, 64, 2, 16, False)])  # 2400 pairs: 19 (or 150) sliced programs
@pytest.mark.parametrize("sliced", [0, 128, 16])
@pytest.mark.interpret
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
@pytest.mark.interpret
def test_fused_matches_reference(tokens, topk, n_exp, hidden, inter, shared, skew, fold,
                                 nan_empty, monkeypatch):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, skew=skew)
    want = reference(x, w, ids, gu, dn, mlp)
    place_shared(monkeypatch, fold)
    got = fused_experts(x, w, ids, gu, dn, mlp and mlp.gate_up, mlp and mlp.down, SMALL)
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
@pytest.mark.interpret
def test_tma_matches_reference_and_pointer_loads(tokens, topk, n_exp, hidden, inter, shared,
                                                nan_empty, monkeypatch):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, seed=tokens)
    s_gu, s_dn = (None, None) if mlp is None else (mlp.gate_up, mlp.down)
    place_shared(monkeypatch, False)
    cfg = SMALL
    # TMA reads `act`'s padding rows, which nothing writes: they are NaN here (`nan_empty`), so
    # any of it that reaches a real row shows.
    pointer = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, cfg)
    got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, dataclasses.replace(cfg, tma=True))
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    # Not bit for bit here: numpy's float32 products of another width round otherwise (the
    # GPU test checks the bits of bf16 wgmma).
    close(got, pointer, 1e-6)
    place_shared(monkeypatch, True)
    with pytest.raises(ValueError, match="tma needs the aligned layout and the shared"):
        fused_experts(x, w, ids, gu, dn, s_gu, s_dn, dataclasses.replace(
            SMALL if shared else DIRECT, tma=True))
    with pytest.raises(ValueError, match="tma needs contiguous expert weights"):
        fused_experts(x, w, ids, torch.cat((gu, gu), 2)[:, :, :inter], dn,
                      config=dataclasses.replace(cfg, tma=True))


@pytest.mark.parametrize("tokens,topk,n_exp,skew", [
    (160, 2, 8, False),  # runs of 33-48 rows: a tile and a tail, or a tile and a longer end
    (40, 6, 64, False),  # every run one tile (no tails); empty experts
    (45, 2, 8, True),    # one expert takes every token: a whole tile and a 13-row tail
])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.interpret
def test_merge_tail_matches_whole_tiles_and_reference(tokens, topk, n_exp, skew, tma,
                                                      nan_empty, monkeypatch):
    """`MoEConfig.merge_tail`: a tail's rows computed by the program of the tile before it;
    the reference's result and the whole-tile programs' (`act`'s padding rows NaN)."""
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, 32, 16, 1, skew=skew, seed=tokens)
    merged, left = tails(ids, n_exp, 32)
    assert (merged > 0 and left > 0) if tokens == 160 else merged == (tokens == 45)
    place_shared(monkeypatch, False)
    cfg = MoEConfig(32, (32, 64, 4, 1), (64, 32, 4, 1), tma=tma)
    whole = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(cfg, merge_tail=True))
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    close(got, whole, 1e-6)  # numpy's products of another height may round otherwise
    for bad in (dataclasses.replace(DIRECT, merge_tail=True),
                dataclasses.replace(cfg, merge_tail=True, block_m=16),
                dataclasses.replace(cfg, merge_tail=True, inline_align=True)):
        with pytest.raises(ValueError, match="merge_tail needs"):
            fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, bad)
    place_shared(monkeypatch, True)  # the shared experts folded in
    with pytest.raises(ValueError, match="merge_tail needs"):
        fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                      dataclasses.replace(cfg, merge_tail=True, tma=False))


@pytest.mark.parametrize("tokens,topk,n_exp,shared,skew,fold", [
    (7, 2, 8, 1, False, None),    # shared experts folded: their tiles first
    (33, 2, 8, 0, False, None),   # several M-tiles per expert
    (40, 6, 64, 2, True, None),   # one expert takes every token (3 tiles); empty experts
    (2, 8, 256, 1, False, None),  # V3's expert count: most tiles of the table unused
    (70, 2, 8, 1, False, False),  # shared MLP apart
])
@pytest.mark.interpret
def test_inline_align_matches_aligned_and_reference(tokens, topk, n_exp, shared, skew, fold,
                                                    nan_empty, monkeypatch):
    """`MoEConfig.inline_align`: the gate_up programs find their tiles and write the table
    the down GEMM reads; the alignment launch's bits (the same tiles, rows in align_torch's
    order) and the reference's values."""
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, 64, 32, shared, skew=skew, seed=tokens)
    s_gu, s_dn = (None, None) if mlp is None else (mlp.gate_up, mlp.down)
    place_shared(monkeypatch, fold)
    cfg = SMALL
    got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn,
                        dataclasses.replace(cfg, inline_align=True))
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    assert torch.equal(got, fused_experts(x, w, ids, gu, dn, s_gu, s_dn, cfg))
    with pytest.raises(ValueError, match="inline_align needs"):
        fused_experts(x, w, ids, gu, dn, s_gu, s_dn, dataclasses.replace(DIRECT,
                                                                         inline_align=True))
    x, w, ids, gu, dn, _ = make(683, 6, 8, 16, 16, 0)  # 4098 pairs: one program holds 4096
    with pytest.raises(ValueError, match="at most 4096 routed pairs"):
        fused_experts(x, w, ids, gu, dn, config=dataclasses.replace(cfg, inline_align=True))


@pytest.mark.parametrize("tokens,topk,n_exp,hidden,inter,shared,fold", [
    (1, 6, 64, 64, 32, 2, None),   # decode: no expert read twice
    (2, 2, 8, 64, 32, 1, None),
    (3, 6, 64, 64, 32, 0, None),   # no shared experts
    (4, 6, 8, 48, 24, 2, None),    # experts repeated across tokens; K, N not tile multiples
    (4, 2, 8, 64, 32, 1, False),   # shared MLP apart: added in the sum
])
@pytest.mark.interpret
def test_direct_matches_reference_and_aligned(tokens, topk, n_exp, hidden, inter, shared,
                                              fold, nan_empty, monkeypatch):
    x, w, ids, gu, dn, mlp = make(tokens, topk, n_exp, hidden, inter, shared, seed=tokens)
    s_gu, s_dn = (None, None) if mlp is None else (mlp.gate_up, mlp.down)
    want = reference(x, w, ids, gu, dn, mlp)
    place_shared(monkeypatch, fold)
    aligned = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, SMALL)
    close(aligned, want, 1e-5)
    # DIRECT_LAST twice: its arrival counters are zero again after a launch.
    for cfg in (DIRECT, DIRECT_LAST, DIRECT_LAST):
        got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, cfg)
        close(got, want, 1e-5)
        # Same tiles, same order of the fp32 sums: the paths agree bit for bit.
        assert torch.equal(got, aligned), cfg


@pytest.mark.parametrize("cfg,hidden,inter", [
    # 3 K steps each: 2 + 1, the last slice empty
    (dataclasses.replace(DIRECT_LAST, gate_up_split=2, down_split=4), 192, 96),
    (dataclasses.replace(DIRECT, gate_up_split=3, down_split=2), 192, 96),
    # 2.5 K steps each: the last slice's last step partial (masked)
    (dataclasses.replace(DIRECT_LAST, gate_up_split=2, down_split=2), 160, 80),
])
@pytest.mark.interpret
def test_split_k_matches_the_unsplit_direct_path(cfg, hidden, inter, nan_empty):
    """Both GEMMs' K in slices (`MoEConfig.gate_up_split`, `down_split`: the last slice to
    arrive sums the partials) give the unsplit path's values, on every launch (the counters
    are zero again after one)."""
    x, w, ids, gu, dn, mlp = make(2, 2, 4, hidden, inter, 1, seed=5)
    whole = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                          dataclasses.replace(cfg, gate_up_split=1, down_split=1))
    close(whole, reference(x, w, ids, gu, dn, mlp), 1e-5)
    for _ in range(2):
        close(fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg), whole, 1e-5)


@pytest.mark.parametrize("cfg,shared,fold,wide", [
    (SMALL, 2, None, False),        # shared experts folded in
    (SMALL, 1, False, False),       # shared MLP apart: added in the same final sum
    (SMALL, 2, None, True),         # rows wider than one program holds: sum, then add+norm
    (DIRECT, 2, None, False),
    (DIRECT_LAST, 2, None, False),  # the down GEMM's last programs sum, add and normalise
    (DIRECT_LAST, 1, False, False),  # ... with the shared MLP's output added in the sum
    (DIRECT_LAST, 2, None, True),   # ... only sum: the add and the norm run after it
])
@pytest.mark.interpret
def test_add_norm_equals_experts_then_add_rmsnorm(cfg, shared, fold, wide, monkeypatch,
                                                  nan_empty):
    """`add_norm` gives the bits of `norm.add_rmsnorm(residual, experts)` (the rounding of
    the two launches it replaces), and the reference's values through `experts_add_norm`."""
    if wide:  # 96 columns stand for V3's 7168
        monkeypatch.setattr(fused_moe, "ADD_NORM_MAX_WIDTH", 64)
    x, w, ids, gu, dn, mlp = make(4, 6, 64, 96, 32, shared, seed=11)
    residual = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(x.shape[1])
    place_shared(monkeypatch, fold)
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


@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.interpret
def test_defer_norm_leaves_the_norm_out_at_one_row(tokens, nan_empty):
    """`defer_norm` on the last_sum path: at one row (`norm_linear.normalises`) the tail adds
    the residual and stops, h has the same bits and the norm stays unwritten (NaN-poisoned);
    at two rows nothing changes."""
    x, w, ids, gu, dn, mlp = make(tokens, 6, 64, 96, 32, 2, seed=13)
    residual = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(x.shape[1])
    want_h, want_y = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, DIRECT_LAST,
                                   add_norm=(residual, weight, 1e-6))
    h, y = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, DIRECT_LAST,
                         add_norm=(residual, weight, 1e-6), defer_norm=True)
    assert torch.equal(h, want_h) and not want_y.isnan().any()
    if tokens == 1:
        assert y.isnan().all()
    else:
        assert torch.equal(y, want_y)


@pytest.mark.interpret
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
@pytest.mark.interpret
def test_table_rows_match_reference(bound, triton_align, nan_empty, monkeypatch):
    """The aligned rows of the config table as they are (block_m, tiles, TMA; hidden 256 and
    moe_inter 128 leave every tile unshrunk, with K a multiple of BLOCK_K as at real sizes) on
    150 skewed tokens, from the layout of `align_torch` (`align` on the CPU) or of
    `align_triton` (on a GPU): its sliced launches with the shared experts folded in, its one
    program with them apart. Rows with `inline_align` (128 here) run it as they are, and with
    the alignment launch where that is spied on. The tokens route to 8 of the 64 experts
    (expert 0 first): the alignment still bins 64 + 2 experts, 56 of them empty, and the
    interpreter runs 9-43 M-tiles (128 to 32 rows) where random routing over all 64 took
    65-78."""
    cfg = pick_config(bound)
    if bound > FUSE_SHARED_MAX_TOKENS:  # apart, as at the row's own token counts (TMA needs it)
        place_shared(monkeypatch, False)
    calls = []
    if triton_align:
        cfg = dataclasses.replace(cfg, inline_align=False)
        def spy(*args):
            calls.append(args)
            return align_triton(*args)

        monkeypatch.setattr(fused_moe, "align", spy)
    x, w, _, gu, dn, mlp = make(150, 6, 64, 256, 128, 2, seed=bound)
    ids = make(150, 6, 8, 8, 8, 0, skew=True, seed=bound)[2]  # experts 0-7 of the 64
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    assert len(calls) == triton_align


@pytest.mark.parametrize("bound", [1, 2, 3, 4, 8])
@pytest.mark.interpret
def test_decode_rows_match_reference(bound, nan_empty):
    """The 1-8-token rows of the config table as they are (hidden 256 and moe_inter 128 leave
    every tile unshrunk) at their own token counts, shared experts folded in."""
    cfg = pick_config(bound)
    assert cfg == next(c for b, c in CONFIGS if b == bound)  # each count has a row of its own
    x, w, ids, gu, dn, mlp = make(bound, 6, 64, 256, 128, 2, seed=bound)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)


def test_direct_config_checks():
    assert pick_config(DIRECT_MAX_TOKENS).direct and not pick_config(DIRECT_MAX_TOKENS + 1).direct
    x, w, ids, gu, dn, _ = make(17, 2, 8, 32, 16, 0)
    with pytest.raises(ValueError, match="at most 16 tokens"):
        fused_experts(x, w, ids, gu, dn, config=DIRECT)
    with pytest.raises(ValueError, match="last_sum needs the direct layout"):
        fused_experts(x[:4], w[:4], ids[:4], gu, dn,
                      config=dataclasses.replace(SMALL, last_sum=True))


@pytest.mark.parametrize("cfg", [SMALL, DIRECT, DIRECT_LAST])
@pytest.mark.interpret
def test_shared_stream_off_cuda_runs_in_order(cfg, monkeypatch):
    """Without CUDA streams `shared_stream` runs the shared experts in order: the same bits.
    With the shared experts folded in there is nothing to run beside: an error."""
    x, w, ids, gu, dn, mlp = make(4, 2, 8, 64, 32, 2, seed=7)
    place_shared(monkeypatch, False)
    want = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    got = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down,
                        dataclasses.replace(cfg, shared_stream=True))
    assert torch.equal(got, want)
    close(got, reference(x, w, ids, gu, dn, mlp), 1e-5)
    # No shared experts: the flag has nothing to move.
    alone = dataclasses.replace(cfg, shared_stream=True)
    assert torch.equal(fused_experts(x, w, ids, gu, dn, config=alone),
                       fused_experts(x, w, ids, gu, dn, config=cfg))
    place_shared(monkeypatch, True)
    with pytest.raises(ValueError, match="shared_stream needs the shared experts apart"):
        fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, alone)


def test_shared_stream_only_where_shared_experts_run_apart():
    """A table row may set `shared_stream` only where no token count it covers folds the
    shared experts in (that raises)."""
    low = 0
    for bound, cfg in CONFIGS:
        folds = low < FUSE_SHARED_MAX_TOKENS
        assert not (cfg.shared_stream and folds), (bound, cfg)
        low = bound


def _route_by_hand(logits: list[float], method: str, bias: list[float], n_group: int,
                   topk_group: int, k: int, normalize: bool, scale: float
                   ) -> dict[int, float]:
    """One token's routing as DeepSeek-V2 (2.1.2, 2.2.1) and V3 (2.1.2) describe it, in plain
    Python: {expert: weight}."""
    n = len(logits)
    size = n // n_group
    if method == "noaux_tc":
        scores = [1 / (1 + math.exp(-v)) for v in logits]
        choice = [sc + b for sc, b in zip(scores, bias, strict=True)]
        group = [sum(sorted(choice[g * size:(g + 1) * size])[-2:]) for g in range(n_group)]
    else:
        top = max(logits)
        ex = [math.exp(v - top) for v in logits]
        scores = [v / sum(ex) for v in ex]
        choice = list(scores)
        group = [max(scores[g * size:(g + 1) * size]) for g in range(n_group)]
    if method != "greedy":  # only the experts of the topk_group best groups compete
        kept = sorted(range(n_group), key=lambda g: group[g])[-topk_group:]
        choice = [c if e // size in kept else float("-inf") for e, c in enumerate(choice)]
    ids = sorted(range(n), key=lambda e: choice[e])[-k:]
    weights = {e: scores[e] for e in ids}
    if normalize:
        total = sum(weights.values())
        weights = {e: w / total for e, w in weights.items()}
    return {e: w * scale for e, w in weights.items()}


@pytest.mark.parametrize("method, model_type, normalize, scale", [
    ("greedy", "deepseek_v2", False, 1.0), ("greedy", "deepseek_v3", True, 2.5),
    ("group_limited_greedy", "deepseek_v2", False, 16.0),
    ("noaux_tc", "deepseek_v3", True, 2.5), ("noaux_tc", "deepseek_v3", False, 1.0)])
def test_route_matches_the_papers_per_token(method, model_type, normalize, scale):
    """`ops.moe.route` (the reference every router kernel is tested against) against a
    plain-Python reading of each method, token by token: the same experts, the same weights."""
    cfg = dataclasses.replace(
        MLAConfig.preset("tiny"), model_type=model_type, n_routed_experts=32,
        num_experts_per_tok=4, n_group=8, topk_group=3, topk_method=method,
        norm_topk_prob=normalize, routed_scaling_factor=scale)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 16, generator=g)
    router = torch.randn(32, 16, generator=g)
    bias = torch.randn(32, generator=g) * 0.5 if method == "noaux_tc" else None
    w, ids = route(x, router, bias, cfg)
    logits = (x.double() @ router.double().T).tolist()
    for t in range(x.shape[0]):
        want = _route_by_hand(logits[t], method, bias.tolist() if bias is not None else [],
                              8, 3, 4, normalize, scale)
        got = dict(zip(ids[t].tolist(), w[t].tolist(), strict=True))
        assert sorted(got) == sorted(want), f"token {t}"
        for e in want:
            assert got[e] == pytest.approx(want[e], rel=1e-5), f"token {t} expert {e}"


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy", "noaux_tc"])
@pytest.mark.interpret
def test_experts_under_each_routing_method(method):
    """The experts (Triton and the CPU default) against the dense reference under each
    method's weights and ids (`route` itself: test_route_matches_the_papers_per_token)."""
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


# Per method and expert count: (model_type, n_group, topk_group, top_k, norm_topk_prob, scale).
# `route` normalises under norm_topk_prob for noaux_tc or a deepseek_v3 model (greedy at 256
# experts: normalised softmax weights); V2's greedy and group-limited ignore it (set anyway).
ROUTINGS = {
    ("greedy", 8): ("deepseek_v2", 1, 1, 2, False, 1.0),
    ("greedy", 64): ("deepseek_v2", 1, 1, 6, False, 1.0),
    ("greedy", 256): ("deepseek_v3", 1, 1, 8, True, 2.5),
    ("group_limited_greedy", 8): ("deepseek_v2", 4, 2, 2, True, 1.5),
    ("group_limited_greedy", 64): ("deepseek_v2", 8, 3, 6, True, 1.5),
    ("group_limited_greedy", 256): ("deepseek_v2", 8, 4, 8, False, 16.0),
    ("noaux_tc", 8): ("deepseek_v3", 4, 2, 2, True, 2.5),
    ("noaux_tc", 64): ("deepseek_v3", 8, 4, 6, True, 2.5),
    ("noaux_tc", 256): ("deepseek_v3", 8, 4, 8, True, 2.5),
}


@pytest.mark.parametrize("tokens", [1, 7, 17])
@pytest.mark.parametrize("method,n_exp", list(ROUTINGS))
@pytest.mark.interpret
def test_fused_moe_layer_matches_reference(method, n_exp, tokens):
    """The MoE sub-layer as the fused path runs it (`kernel_ops`: the Triton router
    feeding the Triton experts, with the shared experts, the residual add and the next norm in
    their final reduction) against `route` + every expert + the shared MLP + add + rmsnorm.
    1, 7 and 17 tokens take the router's one-program-an-expert and split kernels (17: two
    token blocks, the last partial), and the experts' direct and aligned layouts (17: the
    table's 64-token row, as 33 would)."""
    model_type, n_group, topk_group, k, norm, scale = ROUTINGS[method, n_exp]
    cfg = MLAConfig.preset("tiny").with_(
        model_type=model_type, n_routed_experts=n_exp, num_experts_per_tok=k,
        n_shared_experts=2 if n_exp == 64 else 1, topk_method=method, n_group=n_group,
        topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scale)
    layer, x, h, weight = moe_layer(cfg, tokens, 64, 32, seed=tokens + n_exp)
    opts = KernelOptions(fused=True, experts="triton")
    counters = Runtime(x.device).counters
    w, ids = kernel_ops.route(x, layer, cfg, opts, counters)
    got_h, got_y = kernel_ops.experts_add_norm(x, w, ids, layer, h, weight, cfg.rms_norm_eps,
                                               opts, counters, defer_norm=False)
    want_h, want_y = reference_layer(layer, x, h, weight, cfg)
    same = same_routing(x, layer, cfg)  # other experts only at a float64 tie
    close(got_h[same], want_h[same], 1e-5)
    close(got_y[same], want_y[same], 1e-5)


@pytest.mark.parametrize("impl", ["sorted_torch", "triton"])
@pytest.mark.interpret
def test_padded_rows_do_not_change_real_rows(impl, nan_empty):
    x, w, ids, gu, dn, mlp = make(12, 2, 8, 64, 32, 1, seed=2)
    real = experts(x[:5], w[:5], ids[:5], gu, dn, mlp, impl=impl)
    padded = experts(x, w, ids, gu, dn, mlp, impl=impl)  # rows 5.. stand for bucket padding
    torch.testing.assert_close(padded[:5], real, rtol=1e-6, atol=1e-6)


def test_unknown_impl():
    x, w, ids, gu, dn, _ = make(2, 2, 8, 32, 16, 0)
    with pytest.raises(ValueError, match="unknown experts impl"):
        experts(x, w, ids, gu, dn, impl="nope")


@pytest.mark.interpret
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
