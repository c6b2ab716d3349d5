"""`capture.segments`: piecewise segments compiled by Inductor before capture
(`compile_step(..., segments="inductor")`) give eager's results, one compiled module per
distinct segment for every bucket. CPU: the capture emulated (Inductor's C++ code, one MoE
layer: compile time); GPU: real graphs over every bucket."""

import dataclasses

import pytest
import torch

import mla_func as mf
from mla_func.capture.segments import CompiledSegment, for_dynamo, segment_runners
from mla_func.compile_step import compile_step, plan_step


def _one_moe_layer():
    cfg = dataclasses.replace(mf.MLAConfig.preset("tiny"), num_hidden_layers=1,
                              first_k_dense_replace=0)
    return cfg, mf.init_params(cfg, seed=9)


def _steps(state):
    a, b = state.allocator.reserve(0, 12), state.allocator.reserve(1, 12)
    return [[mf.SeqWork([5, 6, 7, 8, 9], 0, a), mf.SeqWork([3, 4], 0, b)],  # bucket 8
            [mf.SeqWork([1], 5, a), mf.SeqWork([2], 2, b)],  # 2
            [mf.SeqWork([1, 2, 3], 6, a)],  # 4, one sequence
            [mf.SeqWork([4], 9, a)]]  # 1


def test_segments_read_their_sizes_from_tensors_and_unknown_kinds_are_refused():
    cfg, params = _one_moe_layer()
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    plan = plan_step(params, state, max_tokens=8, max_seqs=2, max_pages=4)
    seg = plan.segments[-1]
    ints = [n for n in seg.module.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)]
    assert ints  # the trace passes the token count in as an integer...
    rewritten = for_dynamo(seg.module)
    for n in rewritten.graph.nodes:  # ...which dynamo reads from a tensor's axis instead
        if n.op == "placeholder" and n.name in {i.name for i in ints}:
            assert not n.users
    assert not any(str(n.target).startswith("aten.sym_") for n in rewritten.graph.nodes)
    runners = segment_runners(plan, "inductor")  # one compiled module per distinct segment
    assert all(isinstance(r, CompiledSegment) for r in runners)
    assert len({id(r) for r in runners}) == plan.num_distinct
    with pytest.raises(ValueError, match="unknown segments 'cudagraph'"):
        segment_runners(plan, "cudagraph")


def test_inductor_segments_match_eager():
    cfg, params = _one_moe_layer()
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    ref = mf.init_state(cfg, num_pages=16, page_size=4)
    step = compile_step(params, state, mode="piecewise", max_tokens=8, max_seqs=2,
                        max_pages=4, emulate=True, progress=False, segments="inductor")
    assert step.report["segments"] == "inductor"
    kinds = []
    for work in _steps(state):
        batch = mf.make_batch(work, 4, 4)
        kinds.append(step.choose(step._merge((state, batch))))
        with torch.no_grad():
            got, state = step(state, batch)
            want, ref = mf.forward(params, ref, batch)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state.cache, ref.cache, rtol=1e-5, atol=1e-5)
    assert [k[1] for k in kinds] == [8, 2, 4, 1] and {k[0] for k in kinds} == {"piecewise"}


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_inductor_segments_capture_every_bucket_on_gpu(backend):
    """Real CUDA graphs of Inductor's kernels, every piecewise bucket against eager."""
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=10, device="cuda")
    state = mf.init_state(cfg, num_pages=64, page_size=4, device="cuda")
    ref = mf.init_state(cfg, num_pages=64, page_size=4, device="cuda")
    step = compile_step(params, state, mode="piecewise", max_tokens=32, max_seqs=4,
                        max_pages=16, backend=backend, progress=False, segments="inductor")
    assert step.report["segments"] == "inductor"
    for seq, size in enumerate(step.plan.buckets["piecewise"]):
        pages = state.allocator.reserve(seq, size)
        ids = torch.randint(cfg.vocab_size, (size,)).tolist()
        batch = mf.make_batch([mf.SeqWork(ids, 0, pages)], 4, 16, "cuda", backend=backend)
        assert step.choose(step._merge((state, batch))) == ("piecewise", size)
        got, state = step(state, batch)
        want, ref = mf.forward(params, ref, batch)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(state.cache[:, 1:], ref.cache[:, 1:], rtol=2e-3, atol=2e-3)
