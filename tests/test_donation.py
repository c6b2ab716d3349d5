"""`mla_func.donation`: a state a step consumed is refused by the next one, eagerly, through a
compiled step (its graphs emulated) and through an exported program; the returned state goes
on; a step that fails before writing consumes nothing."""

from dataclasses import dataclass
from typing import Annotated

import pytest
import torch

import mla_func as mf
from mla_func.donation import ConsumedError, Donated, donated_params, donating, pure


@pytest.fixture(scope="module")
def tiny():
    cfg = mf.MLAConfig.preset("tiny")
    return cfg, mf.init_params(cfg, seed=8)


def _steps(state):
    pages = state.allocator.reserve(0, 8)
    return (mf.make_batch([mf.SeqWork([5, 6, 7], 0, pages)], 4, 4),
            mf.make_batch([mf.SeqWork([8], 3, pages)], 4, 4))


@dataclass(frozen=True)
class Box:
    items: list


def test_the_marker_and_the_wrapper():
    def f(a: int, s: Annotated[Box, Donated], *, k: int = 0) -> tuple[int, Box]:
        s.items.append(a)
        return a, s

    g = donating(f)
    assert donated_params(f) == donated_params(g) == (1,) and pure(g) is f
    assert donating(pure) is pure  # declares nothing: itself
    s = Box([0])
    _, s2 = g(1, s)
    assert s2 is not s and s2.items is s.items == [0, 1]  # a new handle, the same buffers
    with pytest.raises(ConsumedError, match="`s` was consumed"):
        g(2, s)
    assert g(3, s=s2)[1].items == [0, 1, 3]  # by keyword too


def test_eager_forward_refuses_a_consumed_state(tiny):
    cfg, params = tiny
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    prefill, decode = _steps(state)
    _, after = mf.forward(params, state, prefill)
    assert after is not state and after.cache is state.cache and after.runtime is state.runtime
    with pytest.raises(ConsumedError, match="`state` was consumed by an earlier call"):
        mf.forward(params, state, decode)
    logits, _ = mf.forward(params, after, decode)  # the returned one goes on
    assert logits.shape == (1, cfg.vocab_size)


def test_a_refused_batch_consumes_nothing(tiny):
    cfg, params = tiny
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    wrong = mf.make_batch([mf.SeqWork([5], 0, [1])], page_size=8, max_pages=4)
    with pytest.raises(mf.BatchError):
        mf.forward(params, state, wrong)
    mf.forward(params, state, _steps(state)[0])


@pytest.mark.parametrize("mode", ["eager", "full_and_piecewise"])
def test_compiled_step_refuses_a_consumed_state(tiny, mode):
    from mla_func.compile_step import compile_step

    cfg, params = tiny
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    step = compile_step(params, state, mode=mode, max_tokens=4, max_seqs=2, max_pages=4,
                        emulate=True, progress=False)
    prefill, decode = _steps(state)
    _, after = step(state, prefill)
    assert after is not state and after.cache is state.cache
    with pytest.raises(ConsumedError, match="`state` was consumed"):
        step(state, decode)
    if mode != "eager":
        assert step.choose(step._merge((after, decode)))[0] == "full"
    step(after, decode)
    assert sum(step.counts.values()) == 2  # the refused call ran nothing


def test_exported_step_refuses_a_consumed_state(tiny):
    from mla_func.capture.interop import export

    cfg, params = tiny
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    prefill, decode = _steps(state)
    with torch.no_grad():
        exported = export(mf.forward, params, state, prefill)
        _, after = exported(params, state, prefill)
        with pytest.raises(ConsumedError):
            exported(params, state, decode)
        exported(params, after, decode)
