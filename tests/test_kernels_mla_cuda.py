"""Triton MLA kernels at real V2-Lite / V3 sizes on a GPU (`cuda`-marked; skipped without one):
every plan variant against the torch reference, prefill, and CUDA-graph replay against eager.
The interpreter-sized tests of the same kernels are in test_kernels_mla.py."""

from dataclasses import replace

import pytest
import torch
from mla_helpers import make_problem, poisoned_workspace, ref_args, rel_err

from mla_func.batch import SeqWork, make_batch
from mla_func.kernels.attention.absorb import NewRows
from mla_func.kernels.attention.absorbed import attend_absorbed
from mla_func.kernels.attention.cache_write import reference_write
from mla_func.kernels.attention.decode import (
    DecodeWorkspace,
    num_sms,
    plan_decode,
)
from mla_func.kernels.attention.decode_ws import device_ok as ws_device
from mla_func.kernels.attention.prefill import mha_prefill
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.plan import MHA_MIN_QUERY
from mla_func.ops import attention as ref
from mla_func.ops.attention import prologue

V2_LITE = {"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
V3 = dict(V2_LITE, heads=128)


# Plan variants the GPU tests run besides plan_decode's own (see the sweep in
# scripts/bench_kernels.py): other tiles and stages.
CUDA_VARIANTS = {
    "default": {},
    "s3": dict(num_stages=3),
    "n16-s3": dict(num_stages=3, block_n=16),
    "s4": dict(num_stages=4),
    "n64-s2": dict(block_n=64, num_stages=2),
    "shared-p": dict(shared_p=True),
    "shared-p-n64-s2": dict(shared_p=True, block_n=64, num_stages=2),
    "merge-uv": dict(uv=True),
    # The warp-specialised kernel where it takes the case (128 heads on sm90; the Triton
    # kernel runs the plan elsewhere), at the Triton plan's split counts.
    "ws": dict(ws=True, shared_p=False, block_n=32, num_stages=4),
}


def cuda_plan(variant, rows, capacity, heads):
    plan = plan_decode(rows, capacity, num_sms(torch.device("cuda")), heads)
    return replace(plan, **CUDA_VARIANTS[variant])


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
@pytest.mark.parametrize("variant", ["default", "n16-s3"])
def test_cuda_decode_graph_replay_matches_eager(variant):
    """Capture one decode bucket (plan from bucket + capacity), then replay it on new lengths
    and contents: same result as eager on the same inputs (the programmatic dependent merge
    waits for the split; the merge fused with W_UV leaves its counters at zero)."""
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

    runtime = Runtime("cuda")
    runtime.own(cache)  # the backend's workspace is the cache's runtime's

    def step():
        return torch.ops.mla_func.mla_attention(
            q_nope, q_pe, kv, cache, 1, kv_norm, inv_freq, w_uk, w_uv, 0.07, 1.0, 1e-6, None,
            None, 0, 0, cols["slot_mapping"], cols["token_seq"], cols["positions"], table,
            seq_lens, batch.host, MHA_MIN_QUERY, "triton")

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


@pytest.mark.cuda
@pytest.mark.parametrize("heads,ws", [(16, False), (128, False), (128, True)])
@pytest.mark.parametrize("page_size", [1, 64])
def test_cuda_early_split_after_absorb_matches_plain(heads, ws, page_size):
    """The split kernel launched early (`DecodePlan.early`: a programmatic dependent of the
    absorb + prologue launch, warming L2 with cache rows before it waits) and the merge warming
    L2 with W_UV (`warm`) give the bits of a plain launch, eagerly and replayed from a CUDA
    graph, and the reference's result: the new row each sequence's absorb program writes in
    the same step is read after the wait. `ws`: the plan of an sm90 device, the
    warp-specialised kernel at 128 heads (early: its first tiles of old rows load before it
    waits, q_lat and q_pe after)."""
    dims = dict(V2_LITE, heads=heads)
    lens = [1, 1000, 4097, 300, 65]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), page_size, dims, "cuda",
                     torch.bfloat16, max_pages=8192 // page_size + 1)
    g = torch.Generator().manual_seed(1)
    t, latent = len(lens), dims["kv_lora"] + dims["rope"]
    pos = p["positions"].long()
    slots = (p["page_table"][p["token_seq"].long(), pos // page_size].long() * page_size
             + pos % page_size).to(torch.int32)
    kv = torch.randn(t, latent, generator=g).to("cuda", torch.bfloat16)
    kv_norm = (1 + 0.1 * torch.randn(dims["kv_lora"], generator=g)).to("cuda", torch.bfloat16)
    rope = dims["rope"]
    inv_freq = (1.0 / 1e4 ** (torch.arange(0, rope, 2).float() / rope)).repeat_interleave(2)
    new = NewRows(p["q_pe"], kv, slots, p["positions"], kv_norm, inv_freq.cuda(), 1.0, 1e-6)
    capacity = p["page_table"].shape[1] * page_size
    plan = plan_decode(t, capacity, num_sms(torch.device("cuda")), heads, page_size=page_size,
                       ws=ws and ws_device(torch.device("cuda")))
    assert (plan.early or plan.ws) and plan.warm
    assert plan.ws == (ws and ws_device(torch.device("cuda")))
    old_cache = p["cache"].clone()

    def run(early: bool) -> tuple[torch.Tensor, torch.Tensor]:
        p["cache"].copy_(old_cache)
        ws = poisoned_workspace(p, plan.num_splits, plan)
        out = attend_absorbed(p["q_nope"], None, *ref_args(p)[2:], ws,
                              replace(plan, early=early, warm=early), new=new)
        return out, p["cache"].clone()

    (early_out, early_cache), (plain_out, plain_cache) = run(True), run(False)
    assert torch.equal(early_out, plain_out) and torch.equal(early_cache, plain_cache)
    q_pe, rows = prologue(new.q_pe, kv, kv_norm, p["positions"], new.inv_freq, 1.0, 1e-6)
    want_cache = old_cache.clone()
    reference_write(want_cache, rows, slots)
    fp32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
            for k, v in dict(p, cache=want_cache, q_pe=q_pe).items()}
    assert rel_err(early_out, ref.attend_absorbed(*ref_args(fp32), chunk=1)) < 2e-2

    p["cache"].copy_(old_cache)
    ws = DecodeWorkspace()
    args = (p["q_nope"], None, *ref_args(p)[2:], ws, plan)
    attend_absorbed(*args, new=new)  # warm-up: compiles and allocates the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_absorbed(*args, new=new)
    p["cache"].copy_(old_cache)
    graph.replay()
    assert torch.equal(out, plain_out) and torch.equal(p["cache"], plain_cache)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 8, 32, 128])
def test_cuda_merge_uv_matches_the_bmm_path_and_replays(rows):
    """The merge fused with W_UV (`DecodePlan.uv`, launched early: it loads its W_UV rows
    before it waits) against the tile merge + cuBLAS bmm it replaces: the same o_lat up to the
    order of the split sum, then one bf16 rounding of o apart; the reference; and a CUDA-graph
    replay gives the eager bits. Forced on at 1 to 128 rows (128 splits at one row; the plan
    keeps it to one row of up to 32 splits)."""
    g = torch.Generator().manual_seed(rows)
    lens = torch.randint(1, 4097, (rows,), generator=g).tolist()
    p = make_problem([n - 1 for n in lens], [1] * rows, 64, V2_LITE, "cuda", torch.bfloat16,
                     max_pages=129)
    plan = plan_decode(rows, 129 * 64, num_sms(torch.device("cuda")), 16)
    assert plan.num_splits > 1
    uv, bmm = replace(plan, uv=True), replace(plan, uv=False)
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, plan.num_splits, plan), uv)
    want = attend_absorbed(*ref_args(p), poisoned_workspace(p, plan.num_splits, plan), bmm)
    assert rel_err(got, want) < 1e-2
    fp32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
            for k, v in p.items()}
    assert rel_err(got, ref.attend_absorbed(*ref_args(fp32), chunk=1)) < 2e-2
    ws = poisoned_workspace(p, plan.num_splits, plan)
    attend_absorbed(*ref_args(p), ws, uv)  # warm-up: compiles and allocates the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_absorbed(*ref_args(p), ws, uv)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, got)
