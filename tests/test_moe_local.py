"""Expert parallelism in mla_func.moe and kernels/moe/ (`first_expert`): a rank's slice of the
routed experts and of the shared MLP, global ids from the replicated router; every rank's
partial sum, added over the ranks, against the whole MoE (first_expert None, every expert) and
the reference, for every implementation and every path of the fused one (direct layout with
and without the last-sum tail, the alignment launch as torch ops, as one program and as
slices, the inline alignment, TMA loads, merged tails, the add+norm sums, the shared experts
folded or apart). New buffers are NaN (`nan_empty`): a rank that read the row of a pair it
does not own, even to weight it by zero, would show. The GPU side: test_moe_local_cuda.py.
"""

import dataclasses

import pytest
import torch
from moe_helpers import DIRECT, DIRECT_LAST, SMALL, close, make, place_shared, reference
from moe_local_helpers import owned, rank_slice, ranks_sum

from mla_func.config import MLAConfig
from mla_func.kernels.linear.norm import add_rmsnorm
from mla_func.kernels.moe import align as moe_align
from mla_func.kernels.moe import fused as fused_moe
from mla_func.kernels.moe.align import align_torch, align_triton, max_blocks, pair_experts
from mla_func.kernels.moe.config import MoEConfig
from mla_func.kernels.moe.fused import fused_experts
from mla_func.moe import IMPLS, experts, experts_add_norm
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference, route

N_EXP, TOPK, HIDDEN, INTER = 16, 4, 64, 32


def inputs(tokens, shared, routing, seed, topk=TOPK):
    """Random experts and x; ids and weights `routing`: "random" (distinct experts a token),
    "noaux_tc" (V3's routing over 4 groups of 4: every token's experts in 2 groups, i.e. on
    2 of 4 ranks) or "one_rank" (every pair to experts 0-3: the other ranks own none)."""
    x, w, ids, gu, dn, mlp = make(tokens, topk, N_EXP, HIDDEN, INTER, shared, seed=seed)
    if routing == "noaux_tc":
        cfg = MLAConfig.preset("tiny").with_(
            model_type="deepseek_v3", n_routed_experts=N_EXP, num_experts_per_tok=topk,
            n_group=4, topk_group=2, topk_method="noaux_tc", norm_topk_prob=True,
            routed_scaling_factor=2.5)
        g = torch.Generator().manual_seed(seed + 1)
        router = torch.randn(N_EXP, HIDDEN, generator=g) * 2 * HIDDEN**-0.5
        w, ids = route(x, router, torch.randn(N_EXP, generator=g) * 0.3, cfg)
    elif routing == "one_rank":
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.stack([torch.randperm(4, generator=g)[:topk] for _ in range(tokens)])
    return x, w, ids, gu, dn, mlp


def finite(rank, part):
    assert not part.isnan().any(), f"rank {rank} read a row it does not own"


# (tokens, shared experts, routing). The fused path's row per token count (`pick_config`):
# 1 the direct layout with the last-sum tail, 3 the direct layout, 9 the inline alignment, 150
# the alignment launch. Shared experts: 1 (width 32) is 16 or 8 columns on a rank, never whole
# experts (apart); 2 (width 64) is one whole expert at tp = 2 (folded), half of one at 4.
CASES = [(1, 2, "noaux_tc"), (1, 1, "random"), (3, 0, "random"), (3, 1, "one_rank"),
         (9, 2, "random"), (9, 1, "noaux_tc"), (150, 1, "noaux_tc"), (150, 2, "one_rank"),
         (150, 0, "random")]


# Every case on 2 ranks; on 4 the cases up to 9 tokens (150 tokens repeat the 2-rank paths
# with more interpreter time).
RANKED = [(2, *c) for c in CASES] + [(4, *c) for c in CASES if c[0] <= 9]


@pytest.mark.parametrize("tp,tokens,shared,routing", RANKED)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.interpret
def test_ranks_add_up_to_the_whole(impl, tp, tokens, shared, routing, nan_empty):
    x, w, ids, gu, dn, mlp = inputs(tokens, shared, routing, seed=tokens + 10 * shared)
    whole = experts(x, w, ids, gu, dn, mlp, impl=impl)
    close(whole, reference(x, w, ids, gu, dn, mlp), 1e-5)

    def check(rank, part):
        finite(rank, part)
        if routing == "one_rank" and rank:  # no pair of its own: its shared slice alone
            _, _, _, s = rank_slice(gu, dn, mlp, tp, rank)
            if s is None:
                assert torch.equal(part, torch.zeros_like(part))
            else:
                close(part, swiglu(x, s.gate_up, s.down), 1e-5)

    total = ranks_sum(lambda first, g, d, s: experts(x, w, ids, g, d, s, impl=impl,
                                                     first_expert=first), gu, dn, mlp, tp, check)
    close(total, whole, 1e-5)


def _spy_align(monkeypatch, form):
    """`fused_experts`'s alignment as `align_triton` (the GPU's) in `form`: "one" program or
    "sliced" (16-pair slices: several programs, several steps over the counts)."""
    calls = []

    def spy(*args):
        calls.append(args)
        return align_triton(*args)

    monkeypatch.setattr(fused_moe, "align", spy)
    monkeypatch.setattr(moe_align, "ONE_PROGRAM_MAX_BINNED", 1 << 40 if form == "one" else 0)
    monkeypatch.setattr(moe_align, "ALIGN_SLICE", 16)
    return calls


TAIL = MoEConfig(32, (32, 64, 4, 1), (64, 32, 4, 1))
# path: (config, tokens, top-k, shared experts, shared experts apart at every width, how the
# alignment runs: "torch" ops, align_triton's "one" program or "sliced" launches, or none).
PATHS = {
    "direct": (DIRECT, 4, 4, 2, None, None),
    "direct_last": (DIRECT_LAST, 2, 4, 1, None, None),
    # K split (`split_k`): a tile of another rank's expert arrives at the sum from one slice.
    "direct_last_split": (dataclasses.replace(DIRECT_LAST, gate_up_split=2, down_split=3), 2, 4,
                          1, None, None),
    "aligned_torch": (SMALL, 40, 4, 2, None, "torch"),
    "aligned_one_program": (SMALL, 40, 4, 2, None, "one"),
    "aligned_sliced": (SMALL, 40, 4, 1, None, "sliced"),
    "aligned_apart": (SMALL, 40, 4, 2, True, "one"),
    "inline": (dataclasses.replace(SMALL, inline_align=True), 9, 4, 2, None, None),
    "tma": (dataclasses.replace(SMALL, tma=True), 40, 4, 1, True, "torch"),
    "merge_tail": (dataclasses.replace(TAIL, merge_tail=True), 160, 4, 1, True, "one"),
    "shared_stream": (dataclasses.replace(SMALL, shared_stream=True), 40, 4, 1, True, "torch"),
}


@pytest.mark.parametrize("path,tp", [(p, 2) for p in PATHS] + [
    (p, 4) for p in ("direct", "direct_last", "direct_last_split", "inline", "aligned_sliced")])
# TMA reads `act`'s padding rows (NaN here) into rows the store masks off.
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.interpret
def test_fused_paths_add_up_to_the_whole(path, tp, nan_empty, monkeypatch):
    cfg, tokens, topk, shared, apart, alignment = PATHS[path]
    x, w, ids, gu, dn, mlp = inputs(tokens, shared, "random", seed=tp, topk=topk)
    place_shared(monkeypatch, False if apart else None)
    calls = _spy_align(monkeypatch, alignment) if alignment in ("one", "sliced") else []
    whole = fused_experts(x, w, ids, gu, dn, mlp.gate_up, mlp.down, cfg)
    close(whole, reference(x, w, ids, gu, dn, mlp), 1e-5)
    total = ranks_sum(lambda first, g, d, s: fused_experts(
        x, w, ids, g, d, s.gate_up, s.down, cfg, first_expert=first), gu, dn, mlp, tp, finite)
    close(total, whole, 1e-5)
    assert len(calls) == (tp + 1 if alignment in ("one", "sliced") else 0)
    assert all(c[-1] == (None if i == 0 else (i - 1) * N_EXP // tp)
               for i, c in enumerate(calls))  # first_expert reached the alignment


@pytest.mark.parametrize("cfg,shared,wide", [
    (SMALL, 2, False),        # the sum kernel's add+norm
    (SMALL, 2, True),         # rows wider than one program: the sum, then add_rmsnorm
    (DIRECT_LAST, 2, False),  # the last-sum tail's add+norm
    (DIRECT_LAST, 1, False),  # ... with the shared slice apart (its output in the tail's sum)
])
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.interpret
def test_add_norm_paths_of_a_rank(cfg, shared, wide, tp, nan_empty, monkeypatch):
    """A rank's `add_norm`: h = residual + its partial sum, with the bits of the sum then
    `add_rmsnorm`; the ranks' h (the residual given to rank 0, zeros to the others) add up
    to the whole MoE's h, through `experts_add_norm` too."""
    if wide:  # 96 columns stand for V3's 7168
        monkeypatch.setattr(fused_moe, "ADD_NORM_MAX_WIDTH", 64)
    x, w, ids, gu, dn, mlp = make(4, TOPK, N_EXP, 96, INTER, shared, seed=tp)
    residual = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(x.shape[1])
    want_h = residual + reference(x, w, ids, gu, dn, mlp)

    def run(first, g, d, s):
        res = residual if first == 0 else torch.zeros_like(residual)
        out = fused_experts(x, w, ids, g, d, s.gate_up, s.down, cfg, first_expert=first)
        h, y = fused_experts(x, w, ids, g, d, s.gate_up, s.down, cfg,
                             add_norm=(res, weight, 1e-6), first_expert=first)
        want = add_rmsnorm(res, out, weight, 1e-6)
        assert torch.equal(h, want[0]) and torch.equal(y, want[1])
        sorted_h, _ = experts_add_norm(x, w, ids, g, d, s, res, weight, 1e-6,
                                       impl="sorted_torch", first_expert=first)
        close(sorted_h, h, 1e-5)
        return h

    close(ranks_sum(run, gu, dn, mlp, tp, finite), want_h, 1e-5)


@pytest.mark.parametrize("tokens,shared,block_m", [(5, 2, 4), (40, 1, 16), (120, 0, 16)])
@pytest.mark.parametrize("routing", ["random", "noaux_tc", "one_rank"])
@pytest.mark.parametrize("form", ["one", "sliced"])
@pytest.mark.interpret
def test_alignment_holds_only_local_pairs(tokens, shared, block_m, routing, form, monkeypatch):
    """A rank's layout (align_torch; align_triton as one program or as 16-pair slices): the
    local experts' pairs and the shared ones, each in one row, none of another rank's; tile
    experts local (0..El-1, the shared ones after them) or -1; the same tiles and rows from
    both, within the static bound of El experts."""
    monkeypatch.setattr(moe_align, "ONE_PROGRAM_MAX_BINNED", 1 << 40 if form == "one" else 0)
    monkeypatch.setattr(moe_align, "ALIGN_SLICE", 16)
    ids = inputs(tokens, 0, routing, seed=tokens)[2]
    tp = 4
    n = N_EXP // tp
    for rank in range(tp):
        first = rank * n
        a = align_torch(ids, n, shared, block_m, first)
        b = align_triton(ids, n, shared, block_m, first_expert=first)
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        assert a[1].shape[0] == max_blocks(tokens * (TOPK + shared), n + shared, block_m)
        real = (torch.arange(block_m)[None] < a[2][:, None]).flatten()
        assert torch.equal(a[0][real], b[0][real])  # the interpreter's atomics: lane order
        mine = owned(ids, first, n)
        per_token = torch.cat((mine, torch.ones(tokens, shared, dtype=torch.bool)), 1)
        want = per_token.flatten().nonzero().flatten()
        assert sorted(a[0][real].tolist()) == want.tolist()
        expert_of_row = a[1].repeat_interleave(block_m)[real].long()
        assert torch.equal(pair_experts(ids, n, shared, first)[a[0][real].long()],
                           expert_of_row)
        assert bool(((a[1] >= -1) & (a[1] < n + shared)).all())
        if routing == "one_rank" and rank and not shared:
            assert bool((a[1] == -1).all()) and not real.any()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tokens", [1, 3, 9])
@pytest.mark.interpret
def test_one_rank_of_one_is_the_default(impl, tokens, nan_empty):
    """first_expert 0 over all the experts (the range checks compiled in, every pair local)
    gives the default call's bits."""
    x, w, ids, gu, dn, mlp = inputs(tokens, 2, "noaux_tc", seed=3)
    want = experts(x, w, ids, gu, dn, mlp, impl=impl)
    assert torch.equal(experts(x, w, ids, gu, dn, mlp, impl=impl, first_expert=0), want)


@pytest.mark.parametrize("tokens,width,folded", [(3, 64, True), (3, 16, False),
                                                 (3, 48, False), (9, 8, False)])
@pytest.mark.parametrize("first", [None, N_EXP // 2])
@pytest.mark.interpret
def test_shared_slice_apart_unless_whole_experts(tokens, width, folded, first, monkeypatch,
                                                 nan_empty):
    """A shared slice of whole experts (a multiple of moe_inter, 32) folds into the routed
    launches; any other width (a tensor-parallel slice: 16, 8; or 1.5 experts) runs apart,
    beside them (`kernels.swiglu`), and adds in the sum; on every rank, at the token counts
    where whole experts fold."""
    x, w, ids, gu, dn, _ = make(tokens, TOPK, N_EXP, HIDDEN, INTER, 0, seed=width)
    if first is not None:  # the second half of the experts
        gu, dn = gu[first:], dn[first:]
    g = torch.Generator().manual_seed(width)
    s_gu = torch.randn(2, width, HIDDEN, generator=g) * HIDDEN**-0.5
    s_dn = torch.randn(HIDDEN, width, generator=g) * width**-0.5
    calls = []
    inner = fused_moe.swiglu
    monkeypatch.setattr(fused_moe, "swiglu", lambda *a, **k: calls.append(1) or inner(*a, **k))
    got = fused_experts(x, w, ids, gu, dn, s_gu, s_dn, first_expert=first)
    want = experts_reference(x, w, ids, gu, dn, first) + swiglu(x, s_gu, s_dn)
    close(got, want, 1e-5)
    assert len(calls) == (not folded)


def test_a_bad_range_is_a_clear_error():
    """first_expert must be a rank's first expert of an even split (>= 0, a multiple of the
    local count); the two weight tensors must hold the same experts; a split must be even."""
    from mla_func.ops.moe import check_local_experts, local_experts

    x, w, ids, gu, dn, mlp = make(3, TOPK, N_EXP, 32, 16, 1)
    n = N_EXP // 4
    for impl in IMPLS:
        for bad in (-n, 3, n + 1):
            with pytest.raises(ValueError, match=f"first_expert {bad} is not the first of {n}"):
                experts(x, w, ids, gu[:n], dn[:n], mlp, impl=impl, first_expert=bad)
    with pytest.raises(ValueError, match="first_expert -4 is not the first"):
        experts_add_norm(x, w, ids, gu[:n], dn[:n], mlp, x, torch.ones(32), 1e-6,
                         impl="triton", first_expert=-4)
    with pytest.raises(ValueError, match="gate_up holds 4 experts and down 8"):
        check_local_experts(gu[:4], dn[:8], 0)
    assert local_experts(N_EXP, 4, 3) == (12, 4)
    for n_exp, tp, rank, match in ((N_EXP, 3, 0, "do not split evenly over 3"),
                                   (N_EXP, 4, 4, "rank 4 of a group of 4"),
                                   (N_EXP, 2, -1, "rank -1 of a group of 2")):
        with pytest.raises(ValueError, match=match):
            local_experts(n_exp, tp, rank)


@pytest.mark.interpret
def test_a_rank_traces_with_symbolic_tokens():
    """A rank's experts export with a dynamic token count (static shapes: the layout's bounds
    are the local count's), the op's node carrying first_expert; the default call's node
    leaves it out (a traced step reads as before: graphs/)."""
    x, w, ids, gu, dn, mlp = make(9, TOPK, N_EXP, 32, 16, 1)
    first, g, d, s = rank_slice(gu, dn, mlp, 4, 2)
    tokens = torch.export.Dim("tokens", min=2, max=1024)

    class Part(torch.nn.Module):
        def __init__(self, impl, first):
            super().__init__()
            self.impl, self.first = impl, first

        def forward(self, x, w, ids):
            return experts(x, w, ids, g, d, s, impl=self.impl, first_expert=self.first)

    want = experts(x, w, ids, g, d, s, impl="reference", first_expert=first)
    for impl in ("sorted_torch", "triton"):
        ep = torch.export.export(Part(impl, first), (x, w, ids),
                                 dynamic_shapes=({0: tokens},) * 3)
        close(ep.module()(x, w, ids), want, 1e-5)
    ops = [n for n in ep.graph.nodes if n.target is torch.ops.mla_func.moe_experts.default]
    assert len(ops) == 1 and ops[0].args[-1] == first
    ep = torch.export.export(Part("triton", None), (x, w, ids))
    ops = [n for n in ep.graph.nodes if n.target is torch.ops.mla_func.moe_experts.default]
    assert len(ops) == 1 and len(ops[0].args) == 9  # first_expert left at its default


@pytest.mark.parametrize("preset,tp,tokens,shared", [
    ("v2-lite", 1, 1, "folded"), ("v2-lite", 2, 1, "folded"),  # 2 x 1408 wide: one expert a rank
    ("v2-lite", 4, 1, "apart"),                                # 704 of 1408
    ("v2-lite", 2, 600, "apart"),                              # past FUSE_SHARED_MAX_TOKENS
    ("v3", 1, 1, "folded"), ("v3", 2, 1, "apart"), ("v3", 8, 8, "apart")])  # 1024, 256 of 2048
def test_plan_places_a_rank_s_shared_slice(preset, tp, tokens, shared):
    """The plan's shared-experts placement is the kernels' rule at a rank's slice width."""
    from mla_func.kernels import plan as P

    opts = P.KernelOptions(attention="triton", fused=True, experts="triton")
    h100 = P.DeviceSpec("cuda", 132, (9, 0))
    p = P.plan_step(MLAConfig.preset(preset), h100, tokens, tokens, options=opts,
                    max_pages=8, page_size=16, ranks=tp)
    assert p.shared_experts == shared and p.moe is not None


def test_plan_refuses_an_uneven_split():
    from mla_func.kernels import plan as P

    opts = P.KernelOptions(attention="triton", fused=True, experts="triton")
    h100 = P.DeviceSpec("cuda", 132, (9, 0))
    v2 = MLAConfig.preset("v2-lite")
    with pytest.raises(ValueError, match="64 routed experts do not split evenly over 3"):
        P.plan_step(v2, h100, 1, 1, options=opts, max_pages=8, page_size=16, ranks=3)
    odd = v2.with_(moe_intermediate_size=1410)  # 2 x 1410 shared columns over 8 ranks
    with pytest.raises(ValueError, match="2820 columns do not split evenly over 8"):
        P.plan_step(odd, h100, 1, 1, options=opts, max_pages=8, page_size=16, ranks=8)
