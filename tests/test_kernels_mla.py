"""Triton MLA cache-write and absorbed-decode kernels (mla_func/kernels) against the torch
reference (mla_func/ops/attention); prefill/extend and the backend: test_kernels_mla_prefill.py.

CPU runs use the Triton interpreter at small sizes (real V2-Lite/V3 sizes in bf16 on a GPU:
test_kernels_mla_cuda.py; the ahead-of-time sm90 compile: test_kernels_mla_sm90.py). Inputs
are fresh random values, outputs and workspaces are NaN-poisoned before each run.
"""

import os
import warnings
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import (  # noqa: E402
    DEV,
    NAN,
    SMALL,
    TOL,
    make_problem,
    poison,
    poisoned_workspace,
    ref_args,
    rel_err,
)

from mla_func.kernels.attention import merge as mla_merge  # noqa: E402
from mla_func.kernels.attention.absorbed import attend_absorbed  # noqa: E402
from mla_func.kernels.attention.cache_write import reference_write, write_cache  # noqa: E402
from mla_func.kernels.attention.decode import (  # noqa: E402
    MAX_SPLITS,
    DecodeWorkspace,
    mla_decode,
    plan_decode,
)
from mla_func.kernels.attention.decode_plan import TWO_WAVE_KEYS, num_sms  # noqa: E402
from mla_func.kernels.attention.merge import launch_merge  # noqa: E402
from mla_func.ops import attention as ref  # noqa: E402

# ---------------------------------------------------------------- cache write


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_matches_reference_and_skips_padding(page_size, dtype):
    g = torch.Generator().manual_seed(page_size)
    cache = torch.randn(16 // page_size + 2, page_size, 48, generator=g).to(DEV, dtype)
    want = cache.clone()
    kv = torch.randn(7, 48, generator=g).to(DEV, dtype)  # the model's kv_new has the cache dtype
    slots = torch.randperm(cache.shape[0] * page_size, generator=g)[:7].to(torch.int32)
    slots[[1, 4]] = -1
    slots = slots.to(DEV)
    write_cache(cache, kv, slots)
    reference_write(want, kv, slots)
    assert torch.equal(cache, want)
    assert torch.equal(cache.view(-1, 48)[slots[0].long()], kv[0].to(dtype))


# ---------------------------------------------------------------- absorbed decode


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("splits", [1, 5])
def test_decode_matches_reference(page_size, splits):
    lens = [1, 5, 23, 40]  # length 1; not multiples of the page or block size
    p = make_problem([n - 1 for n in lens], [1] * len(lens), page_size, SMALL, seed=splits)
    plan = replace(plan_decode(len(lens), 64, 4, SMALL["heads"]), num_splits=splits,
                   block_n=16)
    ws = poisoned_workspace(p, splits)
    got = attend_absorbed(*ref_args(p), ws, plan)
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


def test_decode_kernel_writes_every_output_row():
    """Poisoned out / partials: every (head, row) comes back finite and equal to the reference
    latent output, including a head count (20) that is not a multiple of the head block."""
    dims = dict(SMALL, heads=20)
    p = make_problem([0, 16, 33], [1, 1, 1], 4, dims, seed=3)
    t, h = p["q_nope"].shape[:2]
    q_lat = torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"])
    plan = replace(plan_decode(t, 64, 4, h), num_splits=4, block_n=16)
    out = torch.full((h, t, 32), NAN, device=DEV)
    part_o = torch.full((t, h, 4, 32), NAN, device=DEV)
    part_lse = torch.full((t, h, 4), NAN, device=DEV)
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, out, part_o, part_lse)
    eye = torch.eye(32, device=DEV).expand(h, 32, 32)
    want = ref.attend_absorbed(p["q_nope"], p["q_pe"], p["cache"], p["w_uk"], eye,
                               p["token_seq"], p["positions"], p["page_table"], p["scale"])
    assert rel_err(out.transpose(0, 1), want) < TOL


def test_decode_sixteen_heads_one_head_block():
    # fp32 here: the Triton 3.9 interpreter's tl.dot mis-reads bf16 operands; the cuda tests
    # below cover bf16.
    dims = dict(SMALL, heads=16)
    p = make_problem([70, 2], [1, 1], 16, dims, seed=5)
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, 2),
                          replace(plan_decode(2, 96, 4, 16), num_splits=2, block_n=32))
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


def with_padded_row(p):
    """`p` plus one padded row as a captured bucket pads: position 0 of a sequence whose page
    table row is all zeros (the scratch page)."""
    p = dict(p)
    seqs = p["page_table"].shape[0]
    p["page_table"] = torch.cat([p["page_table"], torch.zeros_like(p["page_table"][:1])])
    for name, value in (("token_seq", seqs), ("positions", 0)):
        p[name] = torch.cat([p[name], p[name].new_full((1,), value)])
    for name in ("q_nope", "q_pe"):
        p[name] = torch.cat([p[name], torch.randn_like(p[name][:1])])
    return p


# id: (page_size, heads, plan fields). Page 64 with block_n dividing it takes one page-table
# entry per tile; pages 1 and 16 below block_n gather per key; split counts include more
# splits than the short rows have chunks (16 for keys 1 and 37). At 4 heads and 4 rows the plan
# fuses the merge with W_UV (`uv`); uv=False: the merge, then the bmm.
VARIANTS = {
    "pt64-n16": (64, 4, dict(block_n=16, num_splits=3)),
    "pt64-n32": (64, 4, dict(block_n=32, num_splits=5)),
    "pt64-n64-bmm": (64, 4, dict(block_n=64, num_splits=2, uv=False)),
    "pt64-n32-onesplit": (64, 4, dict(block_n=32, num_splits=1)),
    "pt64-n32-16splits": (64, 4, dict(block_n=32, num_splits=16)),
    "pt16-n16-bmm": (16, 4, dict(block_n=16, num_splits=4, uv=False)),
    "p16-n32": (16, 4, dict(block_n=32, num_splits=3)),
    "p1-n16": (1, 4, dict(block_n=16, num_splits=7)),
    "p1-n32-bmm": (1, 4, dict(block_n=32, num_splits=2, uv=False)),
    "h128-pt64-h64": (64, 128, dict(block_h=64, block_n=32, num_splits=3)),
    "h128-pt16-h32": (16, 128, dict(block_h=32, block_n=16, num_splits=2)),
    # shared_p: p and alpha reach the value product through the scratch
    "h128-pt64-h64-sharedp": (64, 128, dict(block_h=64, block_n=32, num_splits=3,
                                            shared_p=True)),
    "h128-p1-h64-n64-sharedp-onesplit": (1, 128, dict(block_h=64, block_n=64, num_splits=1,
                                                      shared_p=True)),
    "pt16-n16-sharedp-bmm": (16, 4, dict(block_n=16, num_splits=4, shared_p=True, uv=False)),
}


def run_variant(p, plan, ws):
    """attend_absorbed on a NaN-poisoned workspace."""
    poison(ws, p, plan.num_splits, plan)
    return attend_absorbed(*ref_args(p), ws, plan)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decode_variants_match_reference(variant):
    page, heads, fields = VARIANTS[variant]
    lens = [1, 37, 100]  # length 1; not multiples of the page or block size
    dims = dict(SMALL, heads=heads)
    p = with_padded_row(make_problem([n - 1 for n in lens], [1] * 3, page, dims, seed=page))
    plan = replace(plan_decode(4, p["page_table"].shape[1] * page, 4, heads), **fields)
    got = run_variant(p, plan, DecodeWorkspace())
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


@pytest.mark.interpret
def test_merge_reads_only_the_splits_a_row_reaches():
    """Rows of 1, 15, 17 and 100 keys reach 1, 2, 3 and 7 of 9 splits (chunks of 8 keys, 16
    for the longest row); from ACTIVE_MIN_SPLITS splits the merge must not read the others:
    their lse and partials are NaN here (a merge that read every split would give NaN)."""
    assert mla_merge.ACTIVE_MIN_SPLITS <= 9
    p = make_problem([0, 14, 16, 99], [1] * 4, 4, SMALL, seed=11)
    plan = replace(plan_decode(4, 128, 4, 4), num_splits=9, block_n=8)
    t, h = p["q_nope"].shape[:2]
    q_lat = torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"])
    out = torch.full((h, t, 32), NAN, device=DEV)
    part_o = torch.full((t, h, 9, 32), NAN, device=DEV)
    part_lse = torch.full((t, h, 9), NAN, device=DEV)
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, out, part_o, part_lse)
    eye = torch.eye(32, device=DEV).expand(h, 32, 32)
    want = ref.attend_absorbed(p["q_nope"], p["q_pe"], p["cache"], p["w_uk"], eye,
                               p["token_seq"], p["positions"], p["page_table"], p["scale"])
    assert rel_err(out.transpose(0, 1), want) < TOL
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    for row, n in enumerate((1, 15, 17, 100)):
        used = cdiv(n, cdiv(cdiv(n, 9), 8) * 8)  # split_chunk
        assert used < 9
        part_lse[row, :, used:] = NAN  # empty splits wrote lse = -inf; unread, NaN is harmless
        assert part_o[row, :, used:].isnan().all()
    out.fill_(NAN)
    launch_merge(plan.block_n, part_o, part_lse, p["positions"], out)
    assert rel_err(out.transpose(0, 1), want) < TOL


@pytest.mark.parametrize("heads,page_size", [(16, 64), (16, 1), (128, 64)])
def test_decode_long_rows_default_plan(heads, page_size):
    """Rows past 2048 and 4096 keys beside a length-1 row, with the plan attend_absorbed picks
    itself for a 16384-key page table (on the CPU's 4 stand-in SMs: 64-key tiles at page 64 and
    16 heads, 32-key per-key gathers at page 1, 64-head programs with shared_p at 128 heads)."""
    lens = [1, 2049, 4097]
    p = make_problem([n - 1 for n in lens], [1] * 3, page_size, dict(SMALL, heads=heads),
                     seed=heads + page_size, max_pages=16384 // page_size + 1)
    capacity = p["page_table"].shape[1] * page_size
    plan = plan_decode(3, capacity, num_sms(torch.device(DEV)), heads, page_size=page_size)
    if DEV == "cpu":
        assert (plan.block_n, plan.shared_p) == ((32, False) if page_size == 1 else
                                                 (64, heads == 128))
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, plan.num_splits, plan))
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


# id: (heads, plan fields): the merge that reads only the splits a row reaches (from
# ACTIVE_MIN_SPLITS splits), shared_p's scratch, the merge fused with W_UV (its counters and
# shares).
REUSE = {
    "tile12": (4, dict(num_splits=12, block_n=16, uv=False)),
    "tile12-uv": (4, dict(num_splits=12, block_n=16, uv=True)),
    "h128-sharedp-tile3": (128, dict(num_splits=3, block_n=64, shared_p=True)),
}


@pytest.mark.parametrize("variant", list(REUSE))
def test_decode_workspace_reused_without_poison(variant):
    """A second step on the first one's workspace, not poisoned again (as a graph replays):
    rows grew and shrank, q and the cache are new. What the first step left there (partials
    of splits a row no longer reaches, counters, scratch) changes no bit of the result."""
    heads, fields = REUSE[variant]
    if variant == "tile12":  # the merge skips the splits a row does not reach
        assert fields["num_splits"] >= mla_merge.ACTIVE_MIN_SPLITS
    dims = dict(SMALL, heads=heads)
    steps = [make_problem(ctx, [1] * 4, 16, dims, seed=seed, max_pages=20)
             for seed, ctx in ((3, [299, 150, 0, 63]), (4, [0, 299, 5, 17]))]
    plan = replace(plan_decode(4, 20 * 16, 4, heads), **fields)
    ws = poisoned_workspace(steps[0], plan.num_splits, plan)
    for p in steps:
        got = attend_absorbed(*ref_args(p), ws, plan)
        assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL
    fresh = attend_absorbed(*ref_args(p), poisoned_workspace(p, plan.num_splits, plan), plan)
    assert torch.equal(got, fresh)


def test_plan_is_a_function_of_shapes_and_fills_the_gpu():
    assert plan_decode(1, 1024, 132, 16).num_splits == 1024 // 32  # capacity-bound
    assert plan_decode(1, 1 << 20, 132, 16).num_splits >= 0.85 * 132
    assert plan_decode(128, 4096, 132, 16).num_splits == 2  # two waves
    assert plan_decode(32, 4096, 132, 16).num_splits == 8
    # One wave where two would cut a short capacity into splits under TWO_WAVE_KEYS keys; not
    # where the capacity bounds the splits (1-8 rows at 576 keys).
    assert [plan_decode(rows, 576, 132, 16).num_splits for rows in (1, 8, 16, 32, 64, 128)] == [
        18, 18, 8, 4, 2, 2]
    assert plan_decode(32, 1088, 132, 16).num_splits == 4
    assert plan_decode(32, TWO_WAVE_KEYS * 8, 132, 16).num_splits == 8
    # Launched early everywhere; the merge warms W_UV in L2 at small batches only.
    assert all(plan_decode(rows, 8256, 132, 16).early for rows in (1, 8, 32, 128))
    assert [plan_decode(rows, 8256, 132, 16).warm for rows in (1, 8, 9, 32)] == [
        True, True, False, False]
    # ...and multiplies by W_UV itself (mla_merge_uv) up to 4 rows, at any page-table width.
    assert [plan_decode(rows, cap, 132, 16).uv for rows in (1, 4, 5, 32) for cap in (
        1024, 8256)] == [True, True, True, True, False, False, False, False]
    # Not at 128 heads (W_UV read once a row is 16 MB a row there), either kernel.
    assert not any(plan_decode(rows, 8256, 132, 128, ws=ws).uv for rows in (1, 4)
                   for ws in (False, True))
    assert plan_decode(1, 1 << 20, 132, 128).num_splits <= MAX_SPLITS
    for rows in (1, 8, 32, 128):
        for heads in (16, 128):
            plan = plan_decode(rows, 16384, 132, heads)
            programs = rows * -(-heads // plan.block_h) * plan.num_splits
            # Two waves, unless the splits hit MAX_SPLITS (one row of 128 heads at 16k keys).
            assert programs >= 0.85 * 2 * 132 or plan.num_splits == MAX_SPLITS
            assert plan == plan_decode(rows, 16384, 132, heads)


def test_workspace_shares_one_allocation_and_only_grows():
    ws = DecodeWorkspace()
    big = ws.get(torch.device("cpu"), torch.float32, 8, 4, 32, 3)
    small = ws.get(torch.device("cpu"), torch.float32, 2, 4, 32, 5)
    assert [t.data_ptr() for t in small[:3]] == [t.data_ptr() for t in big[:3]]
    assert small[3].shape == (2, 4, 5) and small[2].shape == (2, 4, 5, 32)
    bigger = ws.get(torch.device("cpu"), torch.float32, 16, 4, 32, 3)
    assert bigger[0].data_ptr() != big[0].data_ptr()
    assert ws.get(torch.device("cpu"), torch.float32, 8, 4, 32, 1)[2].numel() == 0
    counters = ws.counters(torch.device("cpu"), 8)  # mla_merge_uv's: zeros, only grow
    assert counters.dtype == torch.int32 and not counters.any()
    assert ws.counters(torch.device("cpu"), 4).data_ptr() == counters.data_ptr()


def test_plan_that_runs_out_of_resources_shrinks_and_still_matches(monkeypatch):
    """A split launch that runs out of shared memory is retried with fewer stages (then
    smaller tiles), the same splits; later launches of that plan on that workspace start from
    the smaller one (`DecodeWorkspace.effective`: the record is the workspace's, not the
    process's), and the result still matches the reference."""
    from mla_helpers import TightKernel

    from mla_func.kernels.attention import decode as md

    tight = TightKernel(md._split_kernel, "num_stages", 3)  # 3 stages do not fit
    stages_seen = tight.seen
    monkeypatch.setattr(md, "_split_kernel", tight)
    p = make_problem([0, 40, 99], [1] * 3, 16, SMALL, seed=11)
    plan = replace(plan_decode(3, 128, 4, 4), num_splits=3, block_n=16, num_stages=3)
    with pytest.warns(RuntimeWarning, match=r"ran out of GPU resources .*num_stages=3.*; "
                      r"its launches use .*num_stages=2"):
        got = run_variant(p, plan, ws := DecodeWorkspace())
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL
    assert stages_seen == [3, 2]
    assert ws.effective(plan) == replace(plan, num_stages=2)
    assert DecodeWorkspace().effective(plan) == plan  # another workspace has no record
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the shrunk plan runs from the start now
        run_variant(p, plan, ws)
    assert stages_seen == [3, 2, 2]
