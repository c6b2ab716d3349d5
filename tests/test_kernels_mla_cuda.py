"""Triton MLA kernels at real V2-Lite / V3 sizes on a GPU (`cuda`-marked; skipped without one):
every plan variant against the torch reference, prefill, and CUDA-graph replay against eager.
The interpreter-sized tests of the same kernels are in test_kernels_mla.py."""

from dataclasses import replace

import pytest
import torch
from mla_helpers import make_problem, poisoned_workspace, ref_args, rel_err

from mla_func.batch import SeqWork, make_batch
from mla_func.kernels.mla_decode import (
    DecodeWorkspace,
    attend_absorbed,
    legacy_plan,
    num_sms,
    plan_decode,
)
from mla_func.kernels.mla_prefill import mha_prefill
from mla_func.ops import attention as ref

V2_LITE = {"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
V3 = dict(V2_LITE, heads=128)


# Plan variants the GPU tests run besides plan_decode's own (see the sweep in
# scripts/bench_kernels.py): the first version, and the double-buffered ones.
CUDA_VARIANTS = {
    "default": {},
    "legacy": None,
    "pages-prefetch-s3": dict(page_tiles=True, prefetch=True, num_stages=3),
    "pages-prefetch-s3-n16-fused": dict(page_tiles=True, prefetch=True, num_stages=3,
                                        block_n=16, merge="fused"),
    "tile-merge-h4c128": dict(prefetch=True, num_stages=4, merge_heads=4, merge_cols=128),
    "pages-prefetch-s3-pdl": dict(page_tiles=True, prefetch=True, num_stages=3, pdl=True),
    "pages-prefetch-n64-s2": dict(page_tiles=True, prefetch=True, block_n=64, num_stages=2),
    "shared-p": dict(shared_p=True),
    "shared-p-n64-s2": dict(shared_p=True, block_n=64, num_stages=2),
}


def cuda_plan(variant, rows, capacity, heads):
    plan = plan_decode(rows, capacity, num_sms(torch.device("cuda")), heads)
    fields = CUDA_VARIANTS[variant]
    return legacy_plan(plan) if fields is None else replace(plan, **fields)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", list(CUDA_VARIANTS))
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_cuda_decode_real_sizes(heads, page_size, variant):
    dims = dict(V2_LITE, heads=heads)
    lens = [1, 1000, 4097, 16384 - 3] if heads == 16 else [1, 777, 16384]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), page_size, dims, "cuda",
                     torch.bfloat16, max_pages=16384 // page_size + 1)
    plan = cuda_plan(variant, len(lens), p["page_table"].shape[1] * page_size, heads)
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, plan.num_splits, plan), plan)
    fp32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
            for k, v in p.items()}
    assert rel_err(got, ref.attend_absorbed(*ref_args(fp32), chunk=1)) < 2e-2


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [16, 128])
def test_cuda_prefill_real_sizes(heads):
    dims = dict(V2_LITE, heads=heads)
    ctx, q = [0, 300, 0], [1000, 77, 129]
    p = make_problem(ctx, q, 16, dims, "cuda", torch.bfloat16)
    got = mha_prefill(*ref_args(p), max(c + n for c, n in zip(ctx, q, strict=True)), max(q))
    fp32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
            for k, v in p.items()}
    assert rel_err(got, ref.attend_mha(*ref_args(fp32), chunk=32)) < 2e-2


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["default", "pages-prefetch-s3-n16-fused",
                                     "pages-prefetch-s3-pdl"])
def test_cuda_decode_graph_replay_matches_eager(variant):
    """Capture one decode bucket (plan from bucket + capacity), then replay it on new lengths
    and contents: same result as eager on the same inputs (the fused merge's counters are
    back at zero after every replay; the programmatic dependent merge waits for the split)."""
    dims = V2_LITE
    lens = [1, 300, 2049, 64]
    p = make_problem([n - 1 for n in lens], [1] * 4, 16, dims, "cuda", torch.bfloat16,
                     max_pages=4096 // 16)
    plan = cuda_plan(variant, 4, 4096, 16) if variant != "default" else None
    ws = DecodeWorkspace()
    args = ref_args(p)
    attend_absorbed(*args, ws, plan)  # warm-up: compiles and allocates the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_absorbed(*args, ws, plan)
    for trial in range(2):
        p["positions"].copy_(torch.tensor([1500, 0, 3, 2047 - trial], device="cuda"))
        p["q_nope"].normal_()
        p["cache"].normal_()
        graph.replay()
        eager = attend_absorbed(*args, DecodeWorkspace(), plan)
        assert torch.equal(out, eager)


@pytest.mark.cuda
def test_cuda_backend_decode_step_in_graph_matches_eager():
    """The whole op (prologue, cache write, absorbed decode) captured for a decode bucket with
    a padded row, replayed on the next step's inputs: same output and cache as an eager call."""
    h, n, r, v, c = (V2_LITE[k] for k in ("heads", "nope", "rope", "v", "kv_lora"))
    g = torch.Generator().manual_seed(0)
    work = [SeqWork([1], start, list(range(1 + 8 * i, 9 + 8 * i)))
            for i, start in enumerate([5, 100, 17])]
    batch = make_batch(work, 16, max_pages=8, device="cuda", backend="triton")
    pad = {"slot_mapping": -1, "token_seq": 3, "positions": 0}
    cols = {k: torch.cat([getattr(batch, k), torch.tensor([x], dtype=torch.int32,
                                                          device="cuda")])
            for k, x in pad.items()}
    table = torch.cat([batch.page_table, torch.zeros_like(batch.page_table[:1])])
    seq_lens = torch.cat([batch.seq_lens, torch.ones_like(batch.seq_lens[:1])])

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to("cuda", torch.bfloat16)

    q_nope, q_pe, kv = rnd(4, h, n), rnd(4, h, r), rnd(4, c + r)
    cache = rnd(2, 30, 16, c + r)
    w_uk, w_uv = rnd(h, n, c, s=n**-0.5), rnd(h, v, c, s=c**-0.5)
    kv_norm = 1 + 0.1 * rnd(c)
    inv_freq = (1.0 / 1e4 ** (torch.arange(0, r, 2, device="cuda") / r)).repeat_interleave(2)

    def step():
        return torch.ops.mla_func.mla_attention(
            q_nope, q_pe, kv, cache, 1, kv_norm, inv_freq, w_uk, w_uv, cols["slot_mapping"],
            cols["token_seq"], cols["positions"], table, seq_lens, batch.host, 0.07, 1.0, 1e-6,
            "triton")

    step()  # warm-up: compile, allocate the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(2):  # the next decode steps: one more token per sequence
        cols["positions"][:3] += 1
        cols["slot_mapping"][:3] += 1
        seq_lens[:3] += 1
        for x in (q_nope, q_pe, kv):
            x.normal_()
        before = cache.clone()
        graph.replay()
        got, got_cache = out.clone(), cache.clone()
        cache.copy_(before)
        assert torch.equal(step(), got)
        assert torch.equal(cache, got_cache)
