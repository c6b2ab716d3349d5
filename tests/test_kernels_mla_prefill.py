"""Triton MLA prefill/extend kernels and the `triton` attention backend's `run` against the
torch reference (mla_func/ops/attention), on the Triton interpreter at small sizes (the decode
and cache-write kernels: test_kernels_mla.py; real sizes on a GPU: test_kernels_mla_cuda.py).
Inputs are fresh random values; outputs are NaN-poisoned before each run.
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
    mha_calls,
    poisoned_workspace,
    ref_args,
    rel_err,
)

from mla_func.attention import get_backend  # noqa: E402
from mla_func.batch import SeqWork, make_batch  # noqa: E402
from mla_func.kernels.attention.absorbed import attend_absorbed  # noqa: E402
from mla_func.kernels.attention.decode import plan_decode  # noqa: E402
from mla_func.kernels.attention.prefill import mha_prefill  # noqa: E402
from mla_func.kernels.launch.runtime import Runtime  # noqa: E402
from mla_func.kernels.plan import MHA_MIN_QUERY  # noqa: E402
from mla_func.ops import attention as ref  # noqa: E402

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


def test_prefill_out_of_resources_halves_the_tile_and_says_so(monkeypatch):
    """A launch that runs out of shared memory is retried at half the query rows a program,
    with a RuntimeWarning naming both sizes (once per size), and still matches."""
    import warnings

    from mla_helpers import TightKernel

    from mla_func.kernels.attention import prefill as mp

    tight = TightKernel(mp._mha_kernel, "BLOCK_M", 32)  # 32 rows a program do not fit
    seen = tight.seen
    monkeypatch.setattr(mp, "_mha_kernel", tight)
    p = make_problem([0, 5, 17], [20, 3, 33], 16, dict(SMALL, heads=4), seed=3)
    args = (*ref_args(p), 50, 33)
    with pytest.warns(RuntimeWarning, match="ran out of GPU resources at 32 query rows a "
                                            "program; it runs 16"):
        got = mha_prefill(*args, block_m=32, block_n=16, shrunk=(shrunk := set()))
    assert seen == [32, 16]
    assert rel_err(got, ref.attend_mha(*ref_args(p))) < TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per size and record (the backend's)
        mha_prefill(*args, block_m=32, block_n=16, shrunk=shrunk)
    assert seen == [32, 16, 32, 16]


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
        rnd(h, n, c, s=1 / 4), rnd(h, v, c, s=1 / 6), 0.25, 1.1, 1e-6, None, None, 0, 0,
        pad(batch.slot_mapping, -1), pad(batch.token_seq, s), pad(batch.positions, 0),
        table, torch.cat([batch.seq_lens, torch.ones(pad_rows, dtype=torch.int32, device=DEV)]),
        batch.host, MHA_MIN_QUERY,
    ]
    return batch, args


# Where backend_case's args (the op's, `attention.op_args` order) hold the cache and the slots.
CACHE_ARG, SLOTS_ARG = 3, 16
# The runtime the "triton" backend's workspace belongs to: the caches these tests make are
# its own (`Runtime.own`), as a state's cache is its state's.
RUNTIME = Runtime(DEV)


def run_both(args):
    want_cache, got_cache = args[CACHE_ARG].clone(), args[CACHE_ARG].clone()
    a = list(args)
    a[CACHE_ARG] = want_cache
    want = torch.ops.mla_func.mla_attention(*a, "torch")
    a[CACHE_ARG] = got_cache
    RUNTIME.own(got_cache)
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
    assert_cache_rows(got_cache, want_cache, args[CACHE_ARG], args[SLOTS_ARG])


# The backend's split partials start as torch.empty: an empty split's may hold NaN, which the
# merge multiplies by its zero weight before it discards the product (mla_merge.merged); the
# interpreter's numpy warns about that product.
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("long_prompt", [False, True])
def test_backend_mixed_decode_and_prefill(long_prompt, monkeypatch):
    mha = mha_calls(monkeypatch)
    work = [
        SeqWork([1], 9, [1, 2, 3]), SeqWork([2], 3, [4]),   # decodes first
        SeqWork(list(range(70 if long_prompt else 6)), 0, list(range(5, 12))),
        SeqWork(list(range(5)), 7, [12, 13, 14]),           # an extend after a prefix
    ]
    batch, args = backend_case(work, 16 if long_prompt else 4, seed=int(long_prompt))
    got, want, got_cache, want_cache = run_both(args)
    assert batch.num_decodes == 2 and (int(batch.host[4]) >= 64) == long_prompt
    # Each backend took the MHA form for the long prompt, and only there.
    assert {b: len(c) for b, c in mha.items()} == {"torch": long_prompt, "triton": long_prompt}
    assert rel_err(got, want) < TOL
    assert_cache_rows(got_cache, want_cache, args[CACHE_ARG], args[SLOTS_ARG])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("long_prompt", [None, False, True])  # None: pure decode
def test_out_variant_writes_the_ops_result_into_out(backend, long_prompt, monkeypatch):
    """`mla_attention_out` (the capture compiler's out variant) writes exactly what the op
    returns into a view of a larger buffer, and nothing past the view's rows."""
    from mla_func.attention import mla_attention_out

    mha = mha_calls(monkeypatch)[backend]

    if long_prompt is None:
        work = [SeqWork([5], 6, [3, 4]), SeqWork([6], 2, [5])]
    else:
        work = [SeqWork([1], 9, [1, 2, 3]),
                SeqWork(list(range(70 if long_prompt else 6)), 0, list(range(5, 12)))]
    batch, args = backend_case(work, 16 if long_prompt else 4, seed=3)
    t, h, v = batch.num_tokens, SMALL["heads"], SMALL["v"]
    a = list(args)
    a[CACHE_ARG] = want_cache = args[CACHE_ARG].clone()
    RUNTIME.own(want_cache)
    want = torch.ops.mla_func.mla_attention(*a, backend)
    buf = torch.full((t + 3, h, v), NAN, device=DEV)
    a[CACHE_ARG] = cache = args[CACHE_ARG].clone()
    RUNTIME.own(cache)
    assert mla_attention_out(*a, backend, out=buf[:t]) is None
    assert torch.equal(buf[:t], want) and buf[t:].isnan().all()
    assert torch.equal(cache, want_cache)  # the same cache writes
    assert len(mha) == (2 if long_prompt else 0)  # the op and the out variant, MHA form
    with pytest.raises(ValueError, match="attention out"):
        mla_attention_out(*a, backend, out=buf[: t + 1])


def test_backend_declares_single_token_decode_graph_support():
    from mla_func.attention import GraphSupport

    assert get_backend("triton").graph_support == GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE


def test_model_forward_triton_backend_matches_torch(monkeypatch):
    """The tiny model, a long prompt (MHA form) with a short one, then two mixed decode
    steps: logits with the triton backend equal the torch backend's."""
    import mla_func as mf
    from mla_func.state import init_state

    mha = mha_calls(monkeypatch)

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
        # The first step's 70-token prompt takes the MHA form in every layer, later ones not.
        assert {b: len(c) for b, c in mha.items()} == dict.fromkeys(mha, cfg.num_hidden_layers)
