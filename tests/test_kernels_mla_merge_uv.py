"""The split-KV merge fused with the W_UV product (mla_func/kernels/mla_merge_uv.py) against
the torch reference and against the tile merge + bmm it replaces.

CPU runs use the Triton interpreter at small sizes (V2-Lite sizes in bf16 on a GPU:
test_kernels_mla_cuda.py; the sm90 compile: test_kernels_mla_sm90.py). Inputs are fresh random
values; workspaces and outputs are NaN-poisoned.
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
    poisoned_workspace,
    ref_args,
    rel_err,
)

from mla_func.kernels.attention import merge as mla_merge  # noqa: E402
from mla_func.kernels.attention import merge_uv as mla_merge_uv  # noqa: E402
from mla_func.kernels.attention.absorbed import attend_absorbed  # noqa: E402
from mla_func.kernels.attention.decode import mla_decode, plan_decode  # noqa: E402
from mla_func.kernels.attention.merge_uv import merge_uv  # noqa: E402
from mla_func.ops import attention as ref  # noqa: E402

# id: (page_size, dims over SMALL, query rows' context lengths, plan fields). 12 splits reach
# the merge's "reached splits only" path; 40 splits load as one tile of 64 (24 masked);
# 40 kv_lora columns make 3 blocks at 16 columns a program (5 at 8), the last one partly
# masked; one row of length 1.
CASES = {
    "3rows-3splits": (16, {}, [1, 37, 100], dict(block_n=16, num_splits=3)),
    "20rows-5splits": (16, {}, [1 + 7 * i for i in range(20)], dict(block_n=16, num_splits=5)),
    "2rows-40splits": (4, {}, [77, 300], dict(block_n=4, num_splits=40)),
    "4rows-12splits": (16, {}, [300, 151, 1, 64], dict(block_n=16, num_splits=12)),
    "kvlora40-3rows": (16, {"kv_lora": 40}, [1, 37, 100], dict(block_n=16, num_splits=3)),
    "h128-3rows-3splits": (64, {"heads": 128}, [1, 37, 100], dict(block_h=64, block_n=32,
                                                                  num_splits=3)),
}


def _scratch(tokens: int, heads: int, kv_lora: int, v_head: int):
    """(shares, counters) of merge_uv: NaN shares, zero counters (as the workspace's)."""
    n = mla_merge_uv.shares_numel(tokens, heads, kv_lora, v_head)
    return (torch.full((n,), NAN, device=DEV),
            torch.zeros(tokens * heads, dtype=torch.int32, device=DEV))


def _solve(case: str, uv: bool):
    page, dims, lens, fields = CASES[case]
    dims = {**SMALL, **dims}
    heads = dims["heads"]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), page, dims,
                     seed=len(lens) + heads, max_pages=-(-320 // page))
    plan = replace(plan_decode(len(lens), 320, 4, heads), uv=uv, **fields)
    ws = poisoned_workspace(p, plan.num_splits, plan)
    out = attend_absorbed(*ref_args(p), ws, plan)
    o_lat = ws.get(p["q_nope"].device, p["cache"].dtype, len(lens), heads,
                   p["w_uk"].shape[-1], plan.num_splits)[1]
    assert o_lat.isnan().all() == uv  # the fused merge never writes o_lat
    assert not ws.counters(p["q_nope"].device, len(lens) * heads).any()  # left at zero
    return p, out


# 8, 16, 64 columns a program: 4, 2 and 1 column blocks at 32 columns. 128 heads at 2 blocks
# only: its head blocks are the split kernel's, whatever the columns, and the column blocks
# the other cases' (the merge's programs do the same at any head); 1536 programs at 8 columns.
UV_CASES = [(case, cols) for case in CASES for cols in (8, 16, 64)
            if not case.startswith("h128") or cols == 16]


@pytest.mark.parametrize("case,cols", UV_CASES, ids=[f"{c}-{n}" for c, n in UV_CASES])
@pytest.mark.interpret
def test_merge_uv_matches_reference_and_the_unfused_path(case, cols, monkeypatch):
    monkeypatch.setattr(mla_merge_uv, "COLS", cols)
    p, got = _solve(case, uv=True)
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL
    _, unfused = _solve(case, uv=False)
    assert rel_err(got, unfused) < 1e-5  # fp32 here: only the summation order differs


@pytest.mark.interpret
def test_merge_uv_reads_only_the_splits_a_row_reaches():
    """Rows of 1, 15, 17 and 100 keys reach 1, 2, 3 and 7 of 9 splits (as in
    test_kernels_mla's tile-merge test); the others' lse and partials are NaN here, so a merge
    that read them would give NaN."""
    assert mla_merge.ACTIVE_MIN_SPLITS <= 9
    p = make_problem([0, 14, 16, 99], [1] * 4, 4, SMALL, seed=11)
    plan = replace(plan_decode(4, 128, 4, 4), num_splits=9, block_n=8)
    t, h = p["q_nope"].shape[:2]
    q_lat = torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"])
    o_lat = torch.full((h, t, 32), NAN, device=DEV)
    part_o = torch.full((t, h, 9, 32), NAN, device=DEV)
    part_lse = torch.full((t, h, 9), NAN, device=DEV)
    mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"], p["positions"],
               p["scale"], plan, o_lat, part_o, part_lse, merge=False)
    assert o_lat.isnan().all()  # the merge was left to the caller
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    for row, n in enumerate((1, 15, 17, 100)):
        used = cdiv(n, cdiv(cdiv(n, 9), 8) * 8)  # split_chunk
        assert used < 9
        part_lse[row, :, used:] = NAN
        assert part_o[row, :, used:].isnan().all()
    out = torch.full((t, h, p["w_uv"].shape[1]), NAN, device=DEV)
    merge_uv(part_o, part_lse, p["positions"], p["w_uv"], out, plan.block_n, False,
             *_scratch(t, h, 32, p["w_uv"].shape[1]))
    assert rel_err(out, ref.attend_absorbed(*ref_args(p))) < TOL


def test_merge_uv_writes_into_a_strided_output():
    """The output may be a view (o_proj's input buffer); nothing outside it is written."""
    p = make_problem([5, 40], [1] * 2, 16, SMALL, seed=3, max_pages=20)
    plan = replace(plan_decode(2, 320, 4, 4), num_splits=4, block_n=16, uv=True)
    t, h, v = 2, p["q_nope"].shape[1], p["w_uv"].shape[1]
    big = torch.full((t + 3, h, v + 4), NAN, device=DEV)
    got = attend_absorbed(*ref_args(p), poisoned_workspace(p, 4, plan), plan,
                          out=big[:t, :, :v])
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < TOL
    assert big[t:].isnan().all() and big[:, :, v:].isnan().all()


def test_merge_uv_needs_split_partials():
    po, pl = torch.zeros(1, 4, 1, 32), torch.zeros(1, 4, 1)
    with pytest.raises(ValueError, match="single split"):
        merge_uv(po, pl, torch.zeros(1, dtype=torch.int32), torch.zeros(4, 16, 32),
                 torch.zeros(1, 4, 16), 16, False, *_scratch(1, 4, 32, 16))
