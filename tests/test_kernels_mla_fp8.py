"""The Triton MLA kernels on the FP8 latent cache (mla_func/cache_fp8.py) against the torch
reference on the same cache: the cache write (bit for bit `pack_rows`), the split-KV decode,
and the "triton" backend's whole op (fused prologue write, decode, the MHA form's dequantising
gather). CPU runs use the Triton interpreter at small sizes; the `cuda` test runs V2-Lite's
sizes. Inputs are fresh random values; workspaces are NaN-poisoned."""

import os
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import DEV, NAN, SMALL, TOL, make_problem, ref_args, rel_err  # noqa: E402

from mla_func.cache_fp8 import fp8_layout, pack_rows, unpack_rows  # noqa: E402
from mla_func.kernels.attention.absorbed import attend_absorbed  # noqa: E402
from mla_func.kernels.attention.cache_write import reference_write, write_cache  # noqa: E402
from mla_func.kernels.attention.decode import (  # noqa: E402
    DecodeWorkspace,
    mla_decode,
    num_sms,
    plan_decode,
)
from mla_func.ops import attention as ref  # noqa: E402

# The FP8 cache against the float cache it was packed from: e4m3 keeps 3 mantissa bits (2.5%
# relative error a value, cache_fp8's measurement), and the attention output moves by about as
# much relative to its largest value.
LOOSE = 0.06


def fp8_problem(p: dict) -> dict:
    """`p` with its cache packed into FP8 rows (kv_lora c_kv values a row)."""
    return dict(p, cache=pack_rows(p["cache"], p["w_uk"].shape[-1]))


def fp8_workspace(p: dict, splits: int) -> DecodeWorkspace:
    """A workspace whose buffers (in the query's dtype: the FP8 tiles' dots run in it) hold
    NaN."""
    ws = DecodeWorkspace()
    t, h = p["q_nope"].shape[:2]
    for buf in ws.get(p["q_nope"].device, p["q_nope"].dtype, t, h, p["w_uk"].shape[-1], splits):
        buf.fill_(NAN)
    return ws


@pytest.mark.parametrize("kv_lora, rope", [(32, 16), (256, 64)])  # one group; two of 128
def test_fp8_cache_write_is_pack_rows(kv_lora, rope):
    """Every byte of a written row is `pack_rows`'s (c_kv, its scales, the bf16 rope values),
    an all-zero row included; padding rows (slot -1) write nothing."""
    g = torch.Generator().manual_seed(kv_lora)
    lay = fp8_layout(kv_lora, rope)
    cache = torch.randint(0, 256, (6, 4, lay.row_bytes), generator=g, dtype=torch.uint8)
    want = cache.clone()
    kv = torch.randn(9, kv_lora + rope, generator=g) * torch.randn(9, 1, generator=g).exp()
    kv[2] = 0
    slots = torch.randperm(24, generator=g)[:9].to(torch.int32)
    slots[[1, 5]] = -1
    cache, want, kv, slots = (t.to(DEV) for t in (cache, want, kv, slots))
    write_cache(cache, kv, slots, kv_lora)
    reference_write(want, kv, slots, kv_lora)
    assert torch.equal(cache, want)
    with pytest.raises(ValueError, match="kv_lora"):
        write_cache(cache, kv, slots)


# Two groups of 128 c_kv values a row: each group's scale enters the scores apart.
GROUPED = dict(SMALL, kv_lora=256)


# decode_fp8.py's float16 products round p * scale / top to float16 (2**-11).
F16_TOL = 2e-3


@pytest.mark.parametrize("group_scores, f16", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("page_size, splits, dims", [(4, 1, SMALL), (16, 5, SMALL),
                                                     (1, 3, SMALL), (16, 2, GROUPED)])
def test_fp8_decode_matches_reference(page_size, splits, dims, group_scores, f16):
    """The FP8 forms of the split kernel (the tile dequantised; the group scales on the
    scores, decode_fp8.py, in the query's dtype or float16): tight against the reference
    reading the same FP8 cache (the same dequantised values, float32 products; F16_TOL for
    float16 ones), loose (LOOSE) against the float cache the rows were packed from."""
    lens = [1, 5, 23, 40]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), page_size, dims, seed=splits)
    f = fp8_problem(p)
    plan = replace(plan_decode(len(lens), 64, 4, dims["heads"], fp8=True), num_splits=splits,
                   block_n=16, group_scores=group_scores, f16=f16)
    got = attend_absorbed(*ref_args(f), fp8_workspace(f, splits), plan)
    assert rel_err(got, ref.attend_absorbed(*ref_args(f))) < (F16_TOL if f16 else TOL)
    assert rel_err(got, ref.attend_absorbed(*ref_args(p))) < LOOSE


@pytest.mark.parametrize("power", [-24, 24])
def test_fp8_decode_f16_products_keep_any_query_range(power):
    """Queries far outside float16's range (|q| ~ 2**24 overflows it, 2**-24 lies below its
    subnormals), the softmax scale divided by as much: float16 products match the reference,
    finite, since one power of two moves the query into range first."""
    lens = [3, 17, 40]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), 16, GROUPED, seed=3)
    p = dict(p, q_nope=p["q_nope"] * 2.0**power, scale=p["scale"] * 2.0**-power)
    f = fp8_problem(p)
    plan = replace(plan_decode(len(lens), 64, 4, GROUPED["heads"], fp8=True), num_splits=2,
                   block_n=16, f16=True)
    got = attend_absorbed(*ref_args(f), fp8_workspace(f, 2), plan)
    assert torch.isfinite(got).all()
    assert rel_err(got, ref.attend_absorbed(*ref_args(f))) < F16_TOL


def test_fp8_plans_pick_the_kernel_by_heads_a_program():
    """Up to 16 heads the plan runs decode_fp8.py's kernel, above them the dequantising one
    (64 heads a program); neither is the warp-specialised kernel, which reads bf16 rows."""
    small = plan_decode(32, 4096, 132, 16, ws=True, fp8=True)
    large = plan_decode(32, 4096, 132, 128, ws=True, fp8=True)
    assert (small.group_scores, small.block_h, small.fp8, small.ws) == (True, 16, True, False)
    assert (large.group_scores, large.block_h, large.fp8, large.ws) == (False, 64, True, False)
    # float16 products for 16-bit queries only, and only in decode_fp8.py's kernel
    assert small.f16 and not large.f16
    assert not plan_decode(32, 4096, 132, 16, fp8=True, dtype=torch.float32).f16
    assert not plan_decode(1, 4096, 132, 16, fp8=True).f16  # under F16_MIN_ROWS


def test_fp8_decode_refuses_a_plan_that_does_not_say_fp8():
    p = fp8_problem(make_problem([3], [1], 4, SMALL))
    t, h = p["q_nope"].shape[:2]
    bufs = DecodeWorkspace().get(torch.device(DEV), torch.float32, t, h, 32, 1)
    with pytest.raises(ValueError, match="fp8"):
        mla_decode(bufs[0], p["q_pe"], p["cache"], p["page_table"], p["token_seq"],
                   p["positions"], p["scale"], plan_decode(1, 16, 4, h), *bufs[1:])
    float_plan = replace(plan_decode(1, 16, 4, h), group_scores=True)
    with pytest.raises(ValueError, match="group_scores"):  # on a bf16 cache
        mla_decode(bufs[0], p["q_pe"], p["cache"].float(), p["page_table"], p["token_seq"],
                   p["positions"], p["scale"], float_plan, *bufs[1:])


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("long_prompt", [False, True])
def test_fp8_backend_matches_torch_backend(long_prompt):
    """The "triton" backend's op on an FP8 cache against the "torch" backend's: a pure decode
    step (the fused absorb + prologue launch writes the quantised rows) or a step with a
    70-token prompt (prologue, Triton cache write, the MHA form's dequantising gather): the
    outputs agree, and so do the rows each wrote (dequantised: the two norms differ in the
    last bit, and a group's scale with them), every other row untouched."""
    from test_kernels_mla_prefill import (
        CACHE_ARG,
        SLOTS_ARG,
        assert_cache_rows,
        backend_case,
        run_both,
    )

    from mla_func.batch import SeqWork

    if long_prompt:
        work = [SeqWork([1], 9, [1, 2, 3]), SeqWork(list(range(70)), 0, list(range(5, 12)))]
    else:
        work = [SeqWork([1], 9, [1, 2, 3]), SeqWork([2], 3, [4]), SeqWork([7], 40, [5, 6, 7])]
    batch, args = backend_case(work, 16, seed=7 + long_prompt)
    args[CACHE_ARG] = pack_rows(args[CACHE_ARG], SMALL["kv_lora"])
    got, want, got_cache, want_cache = run_both(args)
    assert rel_err(got, want) < TOL
    rows = [unpack_rows(c, SMALL["kv_lora"]) for c in (got_cache, want_cache, args[CACHE_ARG])]
    assert_cache_rows(*rows, args[SLOTS_ARG])


@pytest.mark.cuda
@pytest.mark.parametrize("form", ["plan", "f16", "dequantised"])
def test_cuda_fp8_decode_v2_lite_sizes(form):
    """16 heads, V2-Lite's latent (512 + 64) in bf16 on the GPU: the written rows are
    `pack_rows`'s, and the FP8 decode matches the reference on the same cache, and the bf16
    cache within LOOSE: the plan's (decode_fp8.py in bf16 products at these 4 rows), its
    float16 products, and the dequantising kernel."""
    dims = {"heads": 16, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
    lens = [1, 1000, 4097, 300]
    p = make_problem([n - 1 for n in lens], [1] * len(lens), 64, dims, "cuda",
                     dtype=torch.bfloat16)
    f = fp8_problem(p)
    rows = torch.randn(8, 576, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(8, device="cuda", dtype=torch.int32) * 3
    got_cache, want_cache = f["cache"].clone(), f["cache"].clone()
    write_cache(got_cache, rows, slots, 512)
    reference_write(want_cache, rows, slots, 512)
    assert torch.equal(got_cache, want_cache)
    plan = plan_decode(len(lens), p["page_table"].shape[1] * 64, num_sms(torch.device("cuda")),
                       16, page_size=64, fp8=True)
    assert plan.group_scores and not plan.f16
    if form != "plan":
        plan = replace(plan, f16=form == "f16", group_scores=form == "f16")
    got = attend_absorbed(*ref_args(f), fp8_workspace(f, plan.num_splits), plan)
    f32 = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
           for k, v in f.items()}
    assert rel_err(got, ref.attend_absorbed(*ref_args(f32), chunk=1)) < 2e-2  # bf16 dots
    assert rel_err(got, ref.attend_absorbed(*ref_args(p), chunk=1)) < LOOSE
