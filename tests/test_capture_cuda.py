"""GPU tests of captured graphs (`pytest -m cuda`): every bucket of every mode equals eager.

Real CUDA graphs, tiny preset in float32 with small bucket ranges (every bucket is checked).
Piecewise graphs run matmuls at the padded size, so kernels may differ from eager: a tight
tolerance. Full graphs froze the worst-case host metadata at capture, and the torch attention
backend gathers as many page-table columns as that says (eager gathers only what the longest
real sequence reaches): the same math over a longer masked row, equal within the tolerance but
not bitwise. Eager fallback (beyond the captured ranges) must be bitwise equal.
"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import mla_func as mf

pytestmark = pytest.mark.cuda

PAGE, MAX_PAGES, NUM_PAGES = 4, 16, 256
TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def setup():
    from mla_func.compile_step import compile_step

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=3, device="cuda")
    state = mf.init_state(cfg, NUM_PAGES, PAGE, device="cuda")
    state.cache.normal_()  # stale values everywhere: padded rows must not read live pages
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=64, max_seqs=16,
                        max_pages=MAX_PAGES, progress=False)
    return cfg, params, SimpleNamespace(state=state), step  # the live state: each step's


def _check(params, live, step, work, kind, backend="torch"):
    """One step of `work` against eager on a copy of the cache; `live.state`: the state the
    step consumes, replaced by the one it returns."""
    state = live.state
    batch = mf.make_batch(work, PAGE, MAX_PAGES, device="cuda", backend=backend)
    assert step.choose(step._merge((state, batch)))[0] == kind
    twin = dataclasses.replace(state, cache=state.cache.clone())
    want, _ = mf.forward(params, twin, batch)
    got, live.state = step(state, batch)
    assert live.state is not state and live.state.cache is state.cache
    if kind == "eager":
        # The same function on the same batch: bitwise.
        assert torch.equal(got, want) and torch.equal(state.cache[:, 1:], twin.cache[:, 1:])
    else:
        tol = TRITON_TOL if backend == "triton" else TOL
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(state.cache[:, 1:], twin.cache[:, 1:], **tol)
    return batch


def _pages(n_seqs, length, first=1):
    per = -(-length // PAGE)
    return [list(range(first + i * per, first + (i + 1) * per)) for i in range(n_seqs)]


def test_every_piecewise_bucket(setup):
    cfg, params, live, step = setup
    for size in step.plan.buckets["piecewise"]:
        for tokens in sorted({size, max(1, size - 1)}):
            pages = _pages(1, tokens)
            ids = torch.randint(cfg.vocab_size, (tokens,)).tolist()
            _check(params, live, step, [mf.SeqWork(ids, 0, pages[0])], "piecewise")


def test_every_full_bucket(setup):
    cfg, params, live, step = setup
    for size in step.plan.buckets["full"]:
        for seqs in sorted({size, max(1, size - 1)}):
            pages = _pages(seqs, 9)
            work = [mf.SeqWork([int(torch.randint(cfg.vocab_size, ()))], 8, p) for p in pages]
            _check(params, live, step, work, "full")


def test_mixed_batch_and_above_largest_bucket(setup):
    cfg, params, live, step = setup
    pages = _pages(4, 40)
    mixed = [mf.SeqWork([1], 11, pages[0]), mf.SeqWork([2], 30, pages[1]),
             mf.SeqWork(list(range(9)), 5, pages[2]), mf.SeqWork(list(range(17)), 0, pages[3])]
    _check(params, live, step, mixed, "piecewise")
    big = [mf.SeqWork(list(range(40)), 0, pages[0]), mf.SeqWork(list(range(30)), 0, pages[1])]
    _check(params, live, step, big, "eager")  # 70 tokens > 64
    many = [mf.SeqWork([3], 2, p) for p in _pages(20, 3, first=100)]
    _check(params, live, step, many, "eager")  # 20 sequences > max_seqs 16: no graph holds them
    fewer = [mf.SeqWork([3], 2, p) for p in _pages(12, 3, first=100)]
    fewer.append(mf.SeqWork(list(range(9)), 0, _pages(1, 9, first=200)[0]))
    _check(params, live, step, fewer, "piecewise")  # 21 tokens, 13 sequences: piecewise


def test_decode_loop_reuses_state(setup):
    """Repeated replays with growing sequence lengths, new pages, changing batch sizes."""
    cfg, params, live, step = setup
    state = live.state
    twin = dataclasses.replace(state, cache=state.cache.clone())
    lens, caps = [5, 9, 2], [30, 20, 40]  # seq 1 stops early: the batch shrinks
    pages = _pages(3, 64, first=120)
    prompt = [mf.SeqWork(list(range(n)), 0, p) for n, p in zip(lens, pages, strict=True)]
    for work in [prompt] + [None] * 24:
        if work is None:
            alive = [i for i in range(3) if lens[i] < caps[i]]
            work = [mf.SeqWork([7 + i], lens[i], pages[i]) for i in alive]
            for i in alive:
                lens[i] += 1
        batch = mf.make_batch(work, PAGE, MAX_PAGES, device="cuda")
        want, twin = mf.forward(params, twin, batch)
        got, state = step(state, batch)
        torch.testing.assert_close(got, want, **TOL)
    live.state = state
    torch.testing.assert_close(state.cache[:, 1:], twin.cache[:, 1:], **TOL)
    assert step.counts["full"] > 10 and step.counts["piecewise"] >= 1


def test_capture_report_and_bound_state(setup):
    cfg, params, live, step = setup
    report = step.report
    assert report["graphs"] == (len(step.plan.buckets["piecewise"]) * len(step.plan.segments)
                                + len(step.plan.buckets["full"]))
    assert report["capture_seconds"] > 0 and report["graph_pool_bytes"] >= 0
    other = mf.init_state(cfg, NUM_PAGES, PAGE, device="cuda")
    batch = mf.make_batch([mf.SeqWork([1, 2], 0, [1])], PAGE, MAX_PAGES, device="cuda")
    from mla_func.capture import BindingError

    with pytest.raises(BindingError, match="bound to one state"):
        step(other, batch)


# Each mode alone, and the triton backend, over smaller ranges (the fixture above is the torch
# backend's full_and_piecewise). Triton's float32 products run in tf32, and a full graph's
# decode plan (from the worst-case metadata it froze) may split the keys differently from an
# eager call's: a looser tolerance there.
MODE_CASES = [("piecewise", "torch"), ("full", "torch"), ("piecewise", "triton"),
              ("full", "triton"), ("full_and_piecewise", "triton")]
TRITON_TOL = {"rtol": 2e-3, "atol": 2e-3}


@pytest.fixture(scope="module", params=MODE_CASES, ids=["-".join(c) for c in MODE_CASES])
def mode_setup(request):
    from mla_func.compile_step import compile_step

    mode, backend = request.param
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=4, device="cuda")
    state = mf.init_state(cfg, NUM_PAGES, PAGE, device="cuda")
    state.cache.normal_()
    step = compile_step(params, state, mode=mode, max_tokens=16, max_seqs=8,
                        max_pages=MAX_PAGES, backend=backend, progress=False)
    return cfg, params, SimpleNamespace(state=state), step, mode, backend


def test_every_bucket_of_each_mode_and_backend(mode_setup):
    """Every bucket of the mode's graphs against eager; what the mode leaves out runs eagerly
    (a prefill in `full`, a decode past the full range), bitwise equal."""
    cfg, params, live, step, mode, backend = mode_setup
    g = torch.Generator().manual_seed(7)
    has_piecewise, has_full = mode != "full", mode != "piecewise"
    assert bool(step.piecewise) == has_piecewise and bool(step.full) == has_full
    for size in step.plan.buckets["piecewise"] if has_piecewise else ():
        for tokens in sorted({size, max(1, size - 1)}):
            ids = torch.randint(cfg.vocab_size, (tokens,), generator=g).tolist()
            _check(params, live, step, [mf.SeqWork(ids, 0, _pages(1, tokens)[0])],
                   "piecewise", backend)
    for size in step.plan.buckets["full"] if has_full else ():
        for seqs in sorted({size, max(1, size - 1)}):
            work = [mf.SeqWork([int(torch.randint(cfg.vocab_size, (), generator=g))], 8, p)
                    for p in _pages(seqs, 9)]
            _check(params, live, step, work, "full", backend)
    decode = [mf.SeqWork([5], 8, p) for p in _pages(4, 9)]
    _check(params, live, step, decode, "full" if has_full else "piecewise", backend)
    prompt = [mf.SeqWork(list(range(6)), 0, _pages(1, 6, first=150)[0])]
    _check(params, live, step, prompt, "piecewise" if has_piecewise else "eager", backend)
    big = [mf.SeqWork(list(range(20)), 0, _pages(1, 20, first=160)[0])]
    _check(params, live, step, big, "eager", backend)  # 20 tokens > 16


@pytest.mark.parametrize("max_tokens, max_seqs", [(16, 1), (2, 2)])
def test_smallest_ranges_capture(max_tokens, max_seqs):
    """Ranges with no prime example size of their own (traced at a larger one): real graphs
    at every bucket against eager."""
    from mla_func.compile_step import compile_step

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=5, device="cuda")
    state = mf.init_state(cfg, NUM_PAGES, PAGE, device="cuda")
    state.cache.normal_()
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=max_tokens,
                        max_seqs=max_seqs, max_pages=MAX_PAGES, progress=False)
    live = SimpleNamespace(state=state)
    for size in step.plan.buckets["piecewise"]:
        _check(params, live, step,
               [mf.SeqWork(list(range(3, 3 + size)), 0, _pages(1, size, first=180)[0])],
               "piecewise")
    for size in step.plan.buckets["full"]:
        work = [mf.SeqWork([4], 8, p) for p in _pages(size, 9, first=190)]
        _check(params, live, step, work, "full")


def test_non_leading_dynamic_axis_graph():
    from test_capture_plan import VOCAB, Inner, Outer, toy

    from mla_func.capture import plan_capture
    from mla_func.capture.compile import compile_plan

    def args(tokens, seqs):
        o = Outer(Inner(w), torch.randn(8, tokens, device="cuda"), torch.tensor([tokens, seqs]))
        return o, torch.randn(seqs, 8, device="cuda")

    w = torch.randn(8, 8, device="cuda")
    plan = plan_capture(toy, *args(5, 3), dims=VOCAB)
    step = compile_plan(plan, toy, args(5, 3), mode="piecewise", bound=(), progress=False)
    for tokens, seqs in ((1, 1), (5, 3), (33, 16), (64, 2), (70, 2)):
        a = args(tokens, seqs)
        torch.testing.assert_close(step(*a), toy(*a), **TOL)


@pytest.mark.parametrize("name", ["returns_early_value", "op_reads_early_value"])
def test_values_read_late_survive_later_pieces(name):
    """A piece's output read only by a later splitting op, or only returned, must keep its
    pool memory until then (later pieces reused it: results off by ~13 on an H100)."""
    import test_capture_plan
    from test_capture_plan import VOCAB

    from mla_func.capture import plan_capture
    from mla_func.capture.compile import compile_plan

    fn = getattr(test_capture_plan, name)
    x = torch.randn(40, 8, device="cuda")
    plan = plan_capture(fn, x, dims=VOCAB, splitting_ops=["capture_test::flip_add"])
    step = compile_plan(plan, fn, [x], mode="piecewise", bound=(), progress=False)
    y = torch.randn(40, 8, device="cuda")
    assert step.choose([y])[0] == "piecewise"
    got, want = step(y), fn(y)
    for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want)), strict=True):
        torch.testing.assert_close(g, w, **TOL)
