"""Frozen host metadata, checked (`pytest -m cuda`): a full decode graph froze the host tensor
(counts, longest sequence) of its capture-time batch, and only the backend's declared graph
support vouches that replay does not depend on it. For every attention backend that declares
full-graph support, each full bucket is replayed on many random decode compositions (sequence
counts that leave padding rows, lengths from 1 to the page table's reach, scattered page
tables over stale cache contents) and compared with eager on a copy of the cache: logits and
every live page. A backend whose replay read the frozen values (a grid sized from them, a
gather that stops at the capture-time length) would differ here.
"""

import dataclasses
import random

import pytest
import torch

import mla_func as mf
from mla_func.attention import BACKENDS, GraphSupport

pytestmark = pytest.mark.cuda

PAGE, MAX_PAGES, NUM_PAGES, MAX_SEQS = 4, 12, 160, 8
COMPOSITIONS = 8  # per bucket
TOL = {"torch": {"rtol": 1e-4, "atol": 1e-4}, "triton": {"rtol": 2e-3, "atol": 2e-3}}
FULL = [name for name, b in BACKENDS.items()
        if b.graph_support >= GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE]


def _composition(rng: random.Random, low: int, high: int) -> list[tuple[int, list[int]]]:
    """(cached tokens, pages) of low..high decode sequences: random lengths, each sequence's
    pages drawn at random from the whole cache (never the scratch page 0)."""
    n = rng.randint(low, high)
    free = rng.sample(range(1, NUM_PAGES), n * MAX_PAGES)
    out = []
    for i in range(n):
        cached = rng.randint(1, MAX_PAGES * PAGE - 1)  # a decode has a cached prefix
        need = cached // PAGE + 1
        out.append((cached, free[i * MAX_PAGES: i * MAX_PAGES + need]))
    return out


@pytest.mark.parametrize("backend", FULL)
def test_full_buckets_replay_random_decodes_as_eager(backend):
    from mla_func.compile_step import compile_step

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=11, device="cuda")
    state = mf.init_state(cfg, NUM_PAGES, PAGE, device="cuda")
    state.cache.normal_()  # stale values everywhere: lengths decide what is read
    step = compile_step(params, state, mode="full", max_tokens=MAX_SEQS, max_seqs=MAX_SEQS,
                        max_pages=MAX_PAGES, backend=backend, progress=False)
    assert step.mode == "full" and step.full, step.downgrade
    rng = random.Random(12)
    sizes = sorted(step.full)
    for low, size in zip([1] + [s + 1 for s in sizes[:-1]], sizes, strict=True):
        for _ in range(COMPOSITIONS):
            seqs = _composition(rng, low, size)  # pads to `size`: size - n padding rows
            work = [mf.SeqWork([rng.randrange(cfg.vocab_size)], cached, pages)
                    for cached, pages in seqs]
            batch = mf.make_batch(work, PAGE, MAX_PAGES, device="cuda", backend=backend)
            assert step.choose(step._merge((state, batch))) == ("full", size)
            twin = dataclasses.replace(state, cache=state.cache.clone())
            want, twin = mf.forward(params, twin, batch)
            got, state = step(state, batch)
            torch.testing.assert_close(got, want, **TOL[backend])
            torch.testing.assert_close(state.cache[:, 1:], twin.cache[:, 1:], **TOL[backend])
    assert step.counts["full"] == COMPOSITIONS * len(sizes)
