"""Triton MLA kernels (mla_func/kernels) against the torch reference (mla_func/ops/attention).

CPU runs use the Triton interpreter at small sizes (real V2-Lite/V3 sizes in bf16 on a GPU:
test_kernels_mla_cuda.py; the ahead-of-time sm90 compile: test_kernels_mla_sm90.py). Inputs
are fresh random values, outputs and workspaces are NaN-poisoned before each run.
"""

import os
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

from mla_func.attention import get_backend  # noqa: E402
from mla_func.batch import SeqWork, make_batch  # noqa: E402
from mla_func.kernels import mla_merge  # noqa: E402
from mla_func.kernels.cache_write import reference_write, write_cache  # noqa: E402
from mla_func.kernels.decode_plan import num_sms  # noqa: E402
from mla_func.kernels.mla_decode import (  # noqa: E402
    MAX_SPLITS,
    DecodeWorkspace,
    attend_absorbed,
    legacy_plan,
    mla_decode,
    plan_decode,
)
from mla_func.kernels.mla_merge import launch_merge  # noqa: E402
from mla_func.kernels.mla_prefill import mha_prefill  # noqa: E402
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


@pytest.mark.parametrize("merge", ["tile", "serial", "fused"])
def test_decode_kernel_writes_every_output_row(merge):
    """Poisoned out / partials: every (head, row) comes back finite and equal to the reference
    latent output, including a head count (20) that is not a multiple of the head block (nor
    of the tile merge's 8 heads per program)."""
    dims = dict(SMALL, heads=20)
    p = make_problem([0, 16, 33], [1, 1, 1], 4, dims, seed=3)
    t, h = p["q_nope"].shape[:2]
    q_lat = torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"])
    plan = replace(plan_decode(t, 64, 4, h), num_splits=4, block_n=16, merge=merge,
                   merge_heads=8)
    out = torch.full((h, t, 32), NAN, device=DEV)
    part_o = torch.full((t, h, 4, 32), NAN, device=DEV)
    part_lse = torch.full((t, h, 4), NAN, device=DEV)
    counters = torch.zeros(t * 2, dtype=torch.int32, device=DEV)  # 2 head blocks of 16
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, out, part_o, part_lse, counters)
    assert not counters.any()
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
# splits than the short rows have chunks (16 for keys 1 and 37).
VARIANTS = {
    "pt64-n16-prefetch-tile": (64, 4, dict(block_n=16, page_tiles=True, prefetch=True,
                                           num_splits=3)),
    "pt64-n32-tile-h2c16": (64, 4, dict(block_n=32, page_tiles=True, num_splits=5,
                                        merge_heads=2, merge_cols=16)),
    "pt64-n64-prefetch-serial": (64, 4, dict(block_n=64, page_tiles=True, prefetch=True,
                                             num_splits=2, merge="serial")),
    "pt64-n32-prefetch-onesplit": (64, 4, dict(block_n=32, page_tiles=True, prefetch=True,
                                               num_splits=1)),
    "pt64-n32-prefetch-tile16": (64, 4, dict(block_n=32, page_tiles=True, prefetch=True,
                                             num_splits=16)),
    "pt16-n16-prefetch-fused": (16, 4, dict(block_n=16, page_tiles=True, prefetch=True,
                                            num_splits=4, merge="fused")),
    "p16-n32-prefetch-tile-h4": (16, 4, dict(block_n=32, page_tiles=True, prefetch=True,
                                             num_splits=3, merge_heads=4)),
    "p1-n16-prefetch-tile": (1, 4, dict(block_n=16, prefetch=True, num_splits=7)),
    "p1-n32-fused": (1, 4, dict(block_n=32, num_splits=2, merge="fused")),
    "h128-pt64-h64-prefetch-tile": (64, 128, dict(block_h=64, block_n=32, page_tiles=True,
                                                  prefetch=True, num_splits=3,
                                                  merge_heads=16)),
    "h128-pt16-h32-fused": (16, 128, dict(block_h=32, block_n=16, page_tiles=True,
                                          num_splits=2, merge="fused")),
    # shared_p: p and alpha reach the value product through the scratch
    "h128-pt64-h64-sharedp-tile": (64, 128, dict(block_h=64, block_n=32, page_tiles=True,
                                                 prefetch=True, num_splits=3, merge_heads=16,
                                                 shared_p=True)),
    "h128-p1-h64-n64-sharedp-onesplit": (1, 128, dict(block_h=64, block_n=64, prefetch=True,
                                                      num_splits=1, shared_p=True)),
    "pt16-n16-sharedp-fused": (16, 4, dict(block_n=16, page_tiles=True, prefetch=True,
                                           num_splits=4, merge="fused", shared_p=True)),
}


def run_variant(p, plan, ws):
    """attend_absorbed on a NaN-poisoned workspace; fused merges must leave counters at 0."""
    t, h = p["q_nope"].shape[:2]
    poison(ws, p, plan.num_splits, plan)
    got = attend_absorbed(*ref_args(p), ws, plan)
    if plan.merge == "fused":
        assert not ws.counters(p["q_nope"].device, t * -(-h // plan.block_h)).any()
    return got


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decode_variants_match_reference(variant):
    page, heads, fields = VARIANTS[variant]
    lens = [1, 37, 100]  # length 1; not multiples of the page or block size
    dims = dict(SMALL, heads=heads)
    p = with_padded_row(make_problem([n - 1 for n in lens], [1] * 3, page, dims, seed=page))
    plan = replace(plan_decode(4, p["page_table"].shape[1] * page, 4, heads), **fields)
    ws = DecodeWorkspace()
    got = run_variant(p, plan, ws)
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL
    if variant == "pt16-n16-prefetch-fused":  # counters were reset: a second launch agrees
        assert torch.equal(run_variant(p, plan, ws), got)


@pytest.mark.parametrize("merge", ["tile", "fused"])
def test_merge_in_split_chunks_matches_reference(merge, monkeypatch):
    """A tile budget below the splits: the merge loops over chunks of splits."""
    monkeypatch.setattr(mla_merge, "MERGE_TILE", 64)  # 2 splits of 32 columns per chunk
    p = make_problem([0, 40, 99], [1] * 3, 4, SMALL, seed=7)
    plan = replace(plan_decode(3, 128, 4, 4), num_splits=7, block_n=16, merge=merge,
                   page_tiles=True, prefetch=True)
    got = run_variant(p, plan, DecodeWorkspace())
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


@pytest.mark.parametrize("merge", ["tile", "serial"])
def test_merge_reads_only_the_splits_a_row_reaches(merge):
    """Rows of 1, 15, 17 and 100 keys reach 1, 2, 3 and 7 of 9 splits (chunks of 8 keys, 16
    for the longest row); from ACTIVE_MIN_SPLITS splits the merges must not read the others:
    their lse and partials are NaN here (a merge that read every split would give NaN)."""
    assert mla_merge.ACTIVE_MIN_SPLITS <= 9
    p = make_problem([0, 14, 16, 99], [1] * 4, 4, SMALL, seed=11)
    plan = replace(plan_decode(4, 128, 4, 4), num_splits=9, block_n=8, merge=merge,
                   page_tiles=True, prefetch=True)
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
    launch_merge(merge, plan.merge_heads, plan.merge_cols, plan.block_n, part_o, part_lse,
                 p["positions"], out)
    assert rel_err(out.transpose(0, 1), want) < TOL


def test_legacy_plan_matches_reference():
    p = make_problem([0, 40, 99], [1] * 3, 16, SMALL, seed=9)
    plan = legacy_plan(replace(plan_decode(3, 128, 4, 4), num_splits=5, block_n=16,
                               page_tiles=True, prefetch=True))
    assert (plan.page_tiles, plan.prefetch, plan.merge) == (False, False, "serial")
    got = run_variant(p, plan, DecodeWorkspace())
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


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


# id: (heads, plan fields): merges that read only the splits a row reaches (tile from
# ACTIVE_MIN_SPLITS splits, serial), the fused one's counters, shared_p's scratch.
REUSE = {
    "tile12": (4, dict(num_splits=12, block_n=16, merge="tile")),
    "fused6": (4, dict(num_splits=6, block_n=16, merge="fused")),
    "serial12": (4, dict(num_splits=12, block_n=16, merge="serial")),
    "h128-sharedp-tile3": (128, dict(num_splits=3, block_n=64, merge="tile", shared_p=True,
                                     merge_heads=16)),
}


@pytest.mark.parametrize("variant", list(REUSE))
def test_decode_workspace_reused_without_poison(variant):
    """A second step on the first one's workspace, not poisoned again (as a graph replays):
    rows grew and shrank, q and the cache are new. What the first step left there (partials
    of splits a row no longer reaches, counters, scratch) changes no bit of the result."""
    heads, fields = REUSE[variant]
    if variant == "tile12":  # the tile merge skips the splits a row does not reach
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
    assert plan_decode(128, 4096, 132, 16, waves=1).num_splits == 1
    assert plan_decode(128, 4096, 132, 16).num_splits == 2  # two waves by default
    assert plan_decode(32, 4096, 132, 16).num_splits == 8
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
    counters = ws.counters(torch.device("cpu"), 8)  # the fused merge's: zeros, only grow
    assert counters.dtype == torch.int32 and not counters.any()
    assert ws.counters(torch.device("cpu"), 4).data_ptr() == counters.data_ptr()


# ---------------------------------------------------------------- prefill / extend


# (page_size, heads, cached, new tokens, blocks): 16-row blocks over several tiles a sequence,
# and the backend's default blocks with length-1 prompts and length-1 extends next to a prompt
# longer than a key block; at 128 heads the extend's key is the last of a full 64-key page,
# the last the expansion holds.
PREFILL_CASES = {
    "p1-h4-n16": (1, 4, [0, 5, 17], [20, 3, 33], dict(block_m=16, block_n=16)),
    "p16-h4-n16": (16, 4, [0, 5, 17], [20, 3, 33], dict(block_m=16, block_n=16)),
    "p64-h16-one": (64, 16, [0, 0, 63, 5], [1, 70, 1, 2], {}),
    "p1-h16-one": (1, 16, [0, 0, 63, 5], [1, 70, 1, 2], {}),
    "p64-h128-one": (64, 128, [0, 63], [1, 1], {}),
}


@pytest.mark.parametrize("case", list(PREFILL_CASES))
def test_mha_prefill_matches_reference(case):
    page_size, heads, ctx, q, blocks = PREFILL_CASES[case]
    dims = dict(SMALL, heads=heads)
    p = make_problem(ctx, q, page_size, dims, seed=page_size + heads)
    out = torch.full((sum(q), heads, dims["v"]), NAN, device=DEV)
    out_len = max(c + n for c, n in zip(ctx, q, strict=True))
    got = mha_prefill(*ref_args(p), out_len, max(q), **blocks, out=out)
    assert got is out
    assert rel_err(got, ref.attend_mha(*ref_args(p))) < TOL


def test_absorbed_extend_matches_reference():
    p = make_problem([0, 9, 30], [5, 1, 4], 4, SMALL, seed=11)
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, 2),
                          replace(plan_decode(10, 64, 4, 4), num_splits=2, block_n=16))
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL


# ---------------------------------------------------------------- backend `run`


def backend_case(work, page_size, pad_rows=0, seed=0):
    """Random weights, q, kv and a random 2-layer cache for a make_batch batch; padded
    token rows (slot -1, position 0, the scratch page) appended when pad_rows > 0."""
    g = torch.Generator().manual_seed(seed)
    batch = make_batch(work, page_size, max_pages=12, device=DEV)
    h, n, r, v, c = (SMALL[k] for k in ("heads", "nope", "rope", "v", "kv_lora"))
    t = batch.num_tokens + pad_rows

    def pad(x, value):
        return torch.cat([x, torch.full((pad_rows,), value, dtype=x.dtype, device=DEV)])

    s = batch.num_seqs
    table = torch.cat([batch.page_table, torch.zeros(pad_rows, 12, dtype=torch.int32, device=DEV)])
    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(DEV)

    # q_pe and kv as the input projection leaves them: the op runs their rope and norm.
    inv_freq = 1.0 / 500.0 ** (torch.arange(0, r, 2).float() / r)
    args = [
        rnd(t, h, n), rnd(t, h, r), rnd(t, c + r), rnd(2, 40, page_size, c + r), 1,
        1 + 0.1 * rnd(c), inv_freq.repeat_interleave(2).to(DEV),
        rnd(h, n, c, s=1 / 4), rnd(h, v, c, s=1 / 6),
        pad(batch.slot_mapping, -1), pad(batch.token_seq, s), pad(batch.positions, 0),
        table, torch.cat([batch.seq_lens, torch.ones(pad_rows, dtype=torch.int32, device=DEV)]),
        batch.host, 0.25, 1.1, 1e-6,
    ]
    return batch, args


CACHE_ARG = 3  # where backend_case's args hold the cache


def run_both(args):
    want_cache, got_cache = args[CACHE_ARG].clone(), args[CACHE_ARG].clone()
    a = list(args)
    a[CACHE_ARG] = want_cache
    want = torch.ops.mla_func.mla_attention(*a, "torch")
    a[CACHE_ARG] = got_cache
    got = torch.ops.mla_func.mla_attention(*a, "triton")
    return got, want, got_cache, want_cache


def assert_cache_rows(got_cache, want_cache, before, slot_mapping, layer=1):
    """The live slots' rows of `layer` match the reference's (two implementations of the rope
    and the norm: close, not bit-equal); every other row of every layer, the scratch page
    included (where the reference drops padded rows), is exactly as it was."""
    flat = lambda c: c[layer].reshape(-1, c.shape[-1])  # noqa: E731
    live = slot_mapping[slot_mapping >= 0].long()
    assert rel_err(flat(got_cache)[live], flat(want_cache)[live]) < TOL
    kept = torch.ones(flat(got_cache).shape[0], dtype=torch.bool, device=got_cache.device)
    kept[live] = False
    assert torch.equal(flat(got_cache)[kept], flat(before)[kept])
    others = [i for i in range(got_cache.shape[0]) if i != layer]
    assert torch.equal(got_cache[others], before[others])


@pytest.mark.parametrize("page_size", [1, 16])
def test_backend_pure_decode_with_padded_rows(page_size):
    order = torch.randperm(39, generator=torch.Generator().manual_seed(page_size)) + 1
    work, used = [], 0
    for start in (1, 6, 10):
        need = -(-(start + 1) // page_size)
        work.append(SeqWork([5], start, order[used: used + need].tolist()))
        used += need
    batch, args = backend_case(work, page_size, pad_rows=2)
    got, want, got_cache, want_cache = run_both(args)
    t = batch.num_tokens
    assert rel_err(got[:t], want[:t]) < TOL
    assert torch.isfinite(got).all()
    # Padded rows wrote nothing: not even the scratch page the reference scribbles on.
    assert_cache_rows(got_cache, want_cache, args[CACHE_ARG], args[9])


@pytest.mark.parametrize("long_prompt", [False, True])
def test_backend_mixed_decode_and_prefill(long_prompt):
    work = [
        SeqWork([1], 9, [1, 2, 3]), SeqWork([2], 3, [4]),   # decodes first
        SeqWork(list(range(70 if long_prompt else 6)), 0, list(range(5, 12))),
        SeqWork(list(range(5)), 7, [12, 13, 14]),           # an extend after a prefix
    ]
    batch, args = backend_case(work, 16 if long_prompt else 4, seed=int(long_prompt))
    got, want, got_cache, want_cache = run_both(args)
    assert batch.num_decodes == 2 and (int(batch.host[4]) >= 64) == long_prompt
    assert rel_err(got, want) < TOL
    assert_cache_rows(got_cache, want_cache, args[CACHE_ARG], args[9])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("long_prompt", [None, False, True])  # None: pure decode
def test_out_variant_writes_the_ops_result_into_out(backend, long_prompt):
    """`mla_attention_out` (the capture compiler's out variant) writes exactly what the op
    returns into a view of a larger buffer, and nothing past the view's rows."""
    from mla_func.attention import mla_attention_out

    if long_prompt is None:
        work = [SeqWork([5], 6, [3, 4]), SeqWork([6], 2, [5])]
    else:
        work = [SeqWork([1], 9, [1, 2, 3]),
                SeqWork(list(range(70 if long_prompt else 6)), 0, list(range(5, 12)))]
    batch, args = backend_case(work, 16 if long_prompt else 4, seed=3)
    t, h, v = batch.num_tokens, SMALL["heads"], SMALL["v"]
    a = list(args)
    a[CACHE_ARG] = want_cache = args[CACHE_ARG].clone()
    want = torch.ops.mla_func.mla_attention(*a, backend)
    buf = torch.full((t + 3, h, v), NAN, device=DEV)
    a[CACHE_ARG] = cache = args[CACHE_ARG].clone()
    assert mla_attention_out(*a, backend, out=buf[:t]) is None
    assert torch.equal(buf[:t], want) and buf[t:].isnan().all()
    assert torch.equal(cache, want_cache)  # the same cache writes
    with pytest.raises(ValueError, match="attention out"):
        mla_attention_out(*a, backend, out=buf[: t + 1])


def test_backend_declares_single_token_decode_graph_support():
    from mla_func.attention import GraphSupport

    assert get_backend("triton").graph_support == GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE


def test_model_forward_triton_backend_matches_torch():
    """The tiny model, a long prompt (MHA form) with a short one, then two mixed decode
    steps: logits with the triton backend equal the torch backend's."""
    import mla_func as mf
    from mla_func.state import init_state

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0, device=DEV)
    states = {b: init_state(cfg, num_pages=24, page_size=4, device=DEV)
              for b in ("torch", "triton")}
    prompts = [list(range(3, 73)), [7, 8, 9, 10, 11]]
    pages = [list(range(1, 21)), list(range(21, 24))]
    steps = [[SeqWork(p, 0, pg) for p, pg in zip(prompts, pages, strict=True)],
             [SeqWork([5], 70, pages[0]), SeqWork([6], 5, pages[1])],
             [SeqWork([9], 71, pages[0]), SeqWork([4, 2, 3], 6, pages[1])]]
    for work in steps:
        logits = {}
        for name, state in states.items():
            batch = make_batch(work, 4, max_pages=20, device=DEV, backend=name)
            logits[name], states[name] = mf.forward(params, state, batch)
        assert rel_err(logits["triton"], logits["torch"]) < max(TOL, 1e-4)
