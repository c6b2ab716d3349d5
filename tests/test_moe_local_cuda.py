"""Expert parallelism of the MoE kernels on a GPU (`pytest -m cuda`): a rank's experts at the
real V2-Lite / V3 shapes in bf16, the ranks' partial sums against the reference, the rank's
alignment launch against the torch layout, CUDA-graph replay against eager. CPU tests:
test_moe_local.py."""

import pytest
import torch
from moe_helpers import close, make, reference
from moe_local_helpers import owned, rank_slice, ranks_sum

from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.linear.norm import add_rmsnorm
from mla_func.kernels.moe.align import align_torch, align_triton
from mla_func.moe import experts, experts_add_norm

V2_LITE = dict(topk=6, n_exp=64, hidden=2048, inter=1408, shared=2)
V3 = dict(topk=8, n_exp=256, hidden=7168, inter=2048, shared=1)


def finite(rank, part):
    assert not part.isnan().any(), f"rank {rank} read a row it does not own"


@pytest.mark.cuda
@pytest.mark.parametrize("shape,tp,tokens", [
    pytest.param(shape, tp, t, id=f"{name}-tp{tp}-{t}") for name, shape, tp, tokens in (
        # 1: direct + last-sum tail; 4: direct; 8, 128: inline alignment; 512: the alignment
        # launch (one program), 600: shared experts apart on the side stream, 4096: sliced
        # alignment, 12000: the alignment in torch ops (past 65536 pairs). V2-Lite's shared
        # slice folds at tp = 2 (1408 columns) and runs apart at 4 (704); V3's (1024 of 2048)
        # is always apart.
        ("v2lite", V2_LITE, 2, (1, 4, 8, 128, 512, 600, 4096, 12000)),
        ("v2lite", V2_LITE, 4, (1, 8, 512)), ("v3", V3, 2, (1, 8, 512)))
    for t in tokens])
def test_cuda_ranks_add_up(shape, tp, tokens, nan_empty):
    torch.cuda.empty_cache()
    x, w, ids, gu, dn, mlp = make(tokens, **shape, dtype=torch.bfloat16, device="cuda")
    want = reference(x, w, ids, gu, dn, mlp).float()
    total = ranks_sum(lambda first, g, d, s: experts(x, w, ids, g, d, s, impl="triton",
                                                     first_expert=first), gu, dn, mlp, tp,
                      finite)
    assert ((total - want).norm() / want.norm()) < 2e-2  # bf16 partials, rounded per rank
    close(total, want, 0.05)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [128, 4096])  # one program; slices
def test_cuda_rank_alignment_matches_torch(tokens):
    """A rank's alignment launch: the tiles of align_torch's layout, every run's pairs (in
    any order inside it: atomics) the local experts' alone."""
    n_exp, tp = 64, 2
    ids = make(tokens, 6, n_exp, 8, 8, 0, device="cuda", seed=tokens)[2]
    for rank in range(tp):
        first, n = rank * n_exp // tp, n_exp // tp
        a = align_torch(ids, n, 1, 16, first)
        b = align_triton(ids, n, 1, 16, first_expert=first)
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        assert torch.equal(_runs(a, 16), _runs(b, 16))
        assert int(a[2].sum()) == int(owned(ids, first, n).sum()) + tokens


def _runs(layout, block_m):
    sorted_pairs, block_expert, block_rows = layout
    real = torch.arange(block_m, device=block_rows.device)[None] < block_rows[:, None]
    expert = block_expert[:, None].expand(-1, block_m)[real].long()
    return (expert * (1 << 32) + sorted_pairs.view(-1, block_m)[real].long()).sort().values


@pytest.mark.cuda
@pytest.mark.parametrize("shape,tokens", [
    pytest.param(shape, t, id=f"{name}-{t}") for name, shape, tokens in (
        ("v2lite", V2_LITE, (1, 8, 128, 4096)), ("v3", V3, (1, 8))) for t in tokens])
def test_cuda_rank_graph_replay_matches_eager(shape, tokens):
    """Rank 1 of 2 captured in a CUDA graph: replays with fresh routing give the eager bits."""
    x, w, ids, gu, dn, mlp = make(tokens, **shape, dtype=torch.bfloat16, device="cuda")
    first, g, d, s = rank_slice(gu, dn, mlp, 2, 1)
    static = [t.clone() for t in (x, w, ids)]
    counters = Runtime("cuda").counters
    run = lambda *a: experts(*a, g, d, s, impl="triton", counters=counters,  # noqa: E731
                             first_expert=first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(*static)  # warm-up: compiles the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*static)
    for seed in (3, 4):  # fresh x and routing (the experts of these inputs: tiny, unused)
        fresh = make(tokens, shape["topk"], shape["n_exp"], shape["hidden"], 16, 0,
                     dtype=torch.bfloat16, device="cuda", seed=seed)[:3]
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, run(*fresh), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 4, 128])  # the last-sum tail's add+norm; the sum's
@pytest.mark.parametrize("tp", [2, 4])
def test_cuda_rank_add_norm_matches_add_rmsnorm(tokens, tp):
    x, w, ids, gu, dn, mlp = make(tokens, **V2_LITE, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(x.shape[1], device="cuda")).to(x.dtype)
    for rank in range(tp):
        first, g, d, s = rank_slice(gu, dn, mlp, tp, rank)
        out = experts(x, w, ids, g, d, s, impl="triton", first_expert=first)
        got = experts_add_norm(x, w, ids, g, d, s, residual, weight, 1e-6, impl="triton",
                               first_expert=first)
        want = add_rmsnorm(residual, out, weight, 1e-6)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), rank
