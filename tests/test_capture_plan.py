"""CPU tests of the capture compiler: dim table, tracing errors, split, emulated dispatch."""

from dataclasses import dataclass, field
from typing import Annotated

import pytest
import torch
from jaxtyping import Float, Int
from torch import Tensor

import mla_func as mf
from mla_func.capture import CaptureError, SignatureError, plan_capture
from mla_func.capture.artifacts import plan_json
from mla_func.dims import TOKENS_MAX_CAPTURED, DimSpec
from mla_func.donation import Donated

VOCAB = {
    "tokens": DimSpec("tokens", "dynamic", "", 64, "bounded"),
    "seqs": DimSpec("seqs", "dynamic", "", 16, "bounded"),
    "hidden": DimSpec("hidden", "static", ""),
    "pages": DimSpec("pages", "capacity", ""),
}


@dataclass(frozen=True)
class Inner:
    w: Float[Tensor, "hidden hidden"]


@dataclass(frozen=True)
class Outer:
    inner: Inner
    x: Float[Tensor, "hidden tokens"]  # the dynamic axis is not the leading one
    host: Int[Tensor, " 2"] = field(metadata={"host": True})


def toy(o: Outer, y: Float[Tensor, "seqs hidden"]) -> Float[Tensor, "tokens hidden"]:
    return (o.inner.w @ o.x).T.relu() + y.sum(0)


def _toy_args(tokens: int = 5, seqs: int = 3) -> tuple:
    o = Outer(Inner(torch.randn(8, 8)), torch.randn(8, tokens), torch.tensor([tokens, seqs]))
    return o, torch.randn(seqs, 8)


def test_public_call_takes_the_package_vocabulary():
    """The public call, `plan_capture(fn, *example_args)`: no `dims` means the
    package's table (`mla_func.dims.VOCABULARY`), with its ranges, not the test's."""
    from mla_func.dims import VOCABULARY

    plan = plan_capture(toy, *_toy_args())
    assert plan.signature.dims["tokens"].max_size == VOCABULARY["tokens"].max_size != 64
    assert plan.signature.dims["seqs"].max_size == VOCABULARY["seqs"].max_size != 16
    assert plan.signature.dims["hidden"].size == 8


def _host_read(x: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
    return x * x.sum().item()


def test_public_call_refuses_unsafe_code():
    with pytest.raises(CaptureError, match=r"test_capture_plan\.py:\d+"):  # the user's line
        plan_capture(_host_read, torch.randn(4, 8))


def test_dim_table_nested_dataclasses_and_non_leading_axis():
    plan = plan_capture(toy, *_toy_args(), dims=VOCAB)
    sig = plan.signature
    assert [leaf.path for leaf in sig.leaves] == ["o.inner.w", "o.x", "o.host", "y"]
    assert sig.dims["tokens"].kind == "dynamic" and sig.dims["tokens"].bound_at == "o.x[1]"
    assert sig.dims["hidden"].size == 8 and sig.dims["hidden"].bound_at == "o.inner.w[0]"
    assert dict(sig.leaves[1].dynamic) == {1: "tokens"} and sig.leaves[2].host
    assert len(plan.segments) == 1 and not plan.ops
    # The one segment is symbolic: it runs at any size, matching the function.
    seg = plan.segments[0]
    for tokens, seqs in ((1, 1), (7, 2), (33, 16)):
        o, y = _toy_args(tokens, seqs)
        by_path = {"o.inner.w": o.inner.w, "o.x": o.x, "y": y}
        names = [p for p in plan.traced.gm.graph.nodes if p.op == "placeholder"]
        inputs = [by_path[sig.leaves[names.index(n)].path] if n in names
                  else plan.traced.evaluate(n.meta["val"], {"tokens": tokens, "seqs": seqs})
                  for n in seg.inputs]
        (out,) = seg.module(*inputs)
        torch.testing.assert_close(out, toy(o, y))


def test_signature_errors_name_path_and_axis():
    o, y = _toy_args()
    with pytest.raises(SignatureError, match=r"o\.inner\.w\[0\].*'hidden'.*not in the dim"):
        plan_capture(toy, o, y, dims={k: v for k, v in VOCAB.items() if k != "hidden"})

    def bad(o: Outer, y: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
        return y

    with pytest.raises(SignatureError, match=r"'tokens' is 5 at o\.x\[1\] but 3 at y\[0\]"):
        plan_capture(bad, o, y, dims=VOCAB)

    def two(x: Float[Tensor, "tokens hidden"], z: Float[Tensor, "tokens hidden"]):
        return x + z

    # A static name binds one size across a call's own arguments, as jaxtyping binds it.
    with pytest.raises(SignatureError, match=r"'hidden' is 8 at x\[1\] but 4 at z\[1\] \(one "
                                             r"call's arguments bind one size\)"):
        plan_capture(two, torch.randn(5, 8), torch.randn(5, 4), dims=VOCAB)


def _vec(tokens: int = 5) -> Tensor:
    return torch.randn(tokens, 8)


def f_item(x: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
    n = int(x.sum().item())
    return x * n


def f_nonzero(x: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
    idx = torch.nonzero(x[:, 0] > 0)
    return x + idx.sum()


def f_branch(x: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
    if x.sum() > 0:
        return x * 2
    return x


def f_specialised(x: Float[Tensor, "tokens hidden"]) -> Float[Tensor, "tokens hidden"]:
    if x.shape[0] == 61:  # 61: the trace's example size for `tokens`
        return x * 2
    return x


@dataclass(frozen=True)
class WithHost:
    x: Float[Tensor, "tokens hidden"]
    host: Int[Tensor, " 2"] = field(metadata={"host": True})


def f_host(b: WithHost) -> Float[Tensor, "tokens hidden"]:
    return b.x * b.host[0]


@pytest.mark.parametrize("fn, arg, match, line", [
    (f_item, _vec, r"item", "n = int(x.sum().item())"),
    (f_nonzero, _vec, r"aten::nonzero", "idx = torch.nonzero(x[:, 0] > 0)"),
    (f_branch, _vec, r"branch on a tensor value", "if x.sum() > 0:"),
    (f_specialised, _vec, r"tokens", "x.shape[0] == 61"),
    (f_host, lambda: WithHost(_vec(), torch.tensor([5, 1])), r"CPU tensor `b\.host`",
     "return b.x * b.host[0]"),
])
def test_capture_errors_name_op_and_line(fn, arg, match, line):
    with pytest.raises(CaptureError, match=match) as info:
        plan_capture(fn, arg(), dims=VOCAB)
    assert "test_capture_plan.py:" in str(info.value) and line in str(info.value)


@torch.library.custom_op("capture_test::accumulate", mutates_args=("buf",))
def accumulate(x: Tensor, buf: Tensor, host: Tensor) -> Tensor:
    buf.add_(x.sum())
    return x * float(host[0])  # reads host metadata: fine, splitting ops run eagerly


@accumulate.register_fake
def _(x, buf, host):
    return torch.empty_like(x)


@dataclass(frozen=True)
class Acc:
    buf: Float[Tensor, " 1"]


def f_split(a: Annotated[Acc, Donated], b: WithHost
            ) -> tuple[Float[Tensor, "tokens hidden"], Acc]:
    h = b.x.relu()
    h = accumulate(h, a.buf, b.host) + 1
    h = accumulate(h.tanh(), a.buf, b.host)
    return h * 2, a


def test_split_at_custom_op_and_host_tensor_only_in_op():
    a, b = Acc(torch.zeros(1)), WithHost(_vec(), torch.tensor([2, 1]))
    for ops in (None, {"capture_test::accumulate": lambda args: 3}):
        plan = plan_capture(f_split, a, b, dims=VOCAB, splitting_ops=ops)
        assert len(plan.segments) == 3 and [op.name for op in plan.ops] == [
            "capture_test::accumulate"] * 2
    assert plan.support == [3, 3] and plan.full_support == 3
    assert plan.traced.out_treedef.children[1][1].kind == "input"  # `a` is returned as is


def test_splitting_op_that_never_occurs_is_an_error():
    """A misspelt name would leave the cache-mutating op inside the graphs."""
    a, b = Acc(torch.zeros(1)), WithHost(_vec(), torch.tensor([2, 1]))
    with pytest.raises(CaptureError, match=r"\['capture_test::acumulate'\] do not occur.*"
                                           r"capture_test::accumulate"):
        plan_capture(f_split, a, b, dims=VOCAB, splitting_ops=["capture_test::acumulate"])


CALLS = {"op": 0, "out": 0}


@torch.library.custom_op("capture_test::mix_rows", mutates_args=())
def mix_rows(x: Tensor, host: Tensor) -> Tensor:
    CALLS["op"] += 1
    return x.flip(0).cumsum(0) * float(host[1])  # rows mix: a wrong row count shows


@mix_rows.register_fake
def _(x, host):
    return torch.empty_like(x)


def mix_rows_out(x: Tensor, host: Tensor, *, out: Tensor) -> None:
    CALLS["out"] += 1
    torch.cumsum(x.flip(0), 0, out=out).mul_(float(host[1]))


def f_out(b: WithHost) -> Float[Tensor, "tokens hidden"]:
    h = mix_rows(b.x.relu(), b.host)
    g = mix_rows(h, b.host)  # the op reads the one before it straight, not through a segment
    return (g * 2).tanh() + 1


def test_out_variant_writes_next_segment_input():
    """Piecewise replay runs an op with an out variant into the next segment's static buffer
    (real rows only) and never calls the op; results equal eager at every padded size."""
    from mla_func.capture.compile import compile_plan

    example = WithHost(_vec(6), torch.tensor([6, 3]))
    ops = {"capture_test::mix_rows": lambda args: 3}
    with pytest.raises(CaptureError, match="not splitting ops"):
        plan_capture(f_out, example, dims=VOCAB, splitting_ops=ops,
                     out_variants={"capture_test::other": mix_rows_out})
    plan = plan_capture(f_out, example, dims=VOCAB, splitting_ops=ops,
                        out_variants={"capture_test::mix_rows": mix_rows_out})
    assert plan_json(plan)["splitting_ops"][0]["writes_next_input"] is True
    step = compile_plan(plan, f_out, [example], mode="piecewise", bound=(), emulate=True,
                        progress=False)
    # The second op reads the first's buffer while writing its own: never the same one.
    assert step.buffers.op_out[(0, 0)] is not step.buffers.op_out[(1, 0)]
    for tokens in (1, 3, 6, 11):
        b = WithHost(torch.randn(tokens, 8), torch.tensor([tokens, 3]))
        assert step.choose([b])[0] == "piecewise"
        CALLS.update(op=0, out=0)
        got = step(b)
        assert CALLS == {"op": 0, "out": 2}
        torch.testing.assert_close(got, f_out(b))
        real = step.buffers.op_out[(1, 0)][:tokens]
        torch.testing.assert_close(real, mix_rows(mix_rows(b.x.relu(), b.host), b.host))


@pytest.fixture(scope="module")
def tiny_plan():
    from scripts.capture import build_plan

    return build_plan("tiny")


def test_tiny_model_splits_once_per_layer(tiny_plan):
    cfg = mf.MLAConfig.preset("tiny")
    plan = tiny_plan
    # One attention op a layer, then the logits projection, which ends the step: no segment
    # after it.
    names = [op.name for op in plan.ops]
    assert names == ["mla_func::mla_attention"] * cfg.num_hidden_layers + ["mla_func::logits"]
    assert len(plan.segments) == cfg.num_hidden_layers + 1
    # Only the logits op reads each sequence's row index: no graph holds seqs-padded rows.
    index = plan.placeholder_index()
    leaf = next(n for n in index if plan.signature.leaves[index[n]].path == "batch.logits_index")
    assert list(leaf.users) == [plan.ops[-1].node]
    assert plan.signature.dynamic == ("tokens", "seqs")
    assert plan.mode_dims == {"piecewise": "tokens", "full": "seqs"}
    # The buckets stop at what the state holds (64 pages of 4 slots, the scratch page apart).
    assert plan.buckets["piecewise"][-1] == 252 < TOKENS_MAX_CAPTURED
    assert plan.buckets["full"][-1] == 63 and plan.meta["state_bounds"] == {
        "slots": 252, "pages": 63, "max_tokens": 252, "max_seqs": 63}
    assert plan.full_support == 1  # the torch backend: uniform single-token decode
    host = [leaf for leaf in plan.signature.leaves if leaf.host]
    assert [leaf.path for leaf in host] == ["batch.host"]
    # The host tensor reaches only the splitting ops.
    node = [n for n in plan.traced.gm.graph.nodes if n.op == "placeholder"][host[0].index]
    assert {u.target for u in node.users} == {plan.ops[0].node.target}


def test_v3_shapes_plan_on_meta():
    from mla_func.compile_step import plan_step

    # V3's shapes (q_lora, noaux_tc routing), layers cut to 3 dense + 2 MoE to stay quick.
    cfg = mf.MLAConfig.preset("v3").with_(num_hidden_layers=5)
    params = mf.init_params(cfg, device="meta", dtype=torch.bfloat16)
    state = mf.init_state(cfg, num_pages=1024, page_size=16, device="meta",
                          dtype=torch.bfloat16)
    plan = plan_step(params, state, max_pages=64)
    # Dense layers repeat one segment; the MoE layer and the final one differ.
    assert len(plan.segments) == 6 and plan.distinct == [0, 1, 1, 1, 2, 3]
    assert plan.signature.dims["heads"].size == 128 and plan.signature.dims["q_lora"].size == 1536


def test_emulated_dispatch_matches_eager():
    """The capture/dispatch machinery without CUDA graphs: padding, buckets, eager splitting
    ops on real rows, full graphs for pure decode, eager above the largest bucket."""
    from mla_func.compile_step import compile_step

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=1)
    state = mf.init_state(cfg, num_pages=32, page_size=4)
    ref = mf.init_state(cfg, num_pages=32, page_size=4)
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=16, max_seqs=4,
                        max_pages=8, emulate=True, progress=False)
    alloc = state.allocator
    p = [alloc.reserve(i, 7) for i in range(3)]
    steps = [
        [mf.SeqWork([5, 6, 7, 8, 9], 0, p[0]), mf.SeqWork([1, 2], 0, p[1])],  # piecewise 8
        [mf.SeqWork([3], 5, p[0]), mf.SeqWork([4], 2, p[1])],  # full 2
        [mf.SeqWork([3], 6, p[0]), mf.SeqWork(list(range(20)), 0, alloc.reserve(2, 21))],
    ]
    expect = ["piecewise", "full", "eager"]
    for work, kind in zip(steps, expect, strict=True):
        batch = mf.make_batch(work, 4, 8)
        assert step.choose(step._merge((state, batch)))[0] == kind
        logits, out_state = step(state, batch)
        want, ref = mf.forward(params, ref, batch)
        assert out_state is not state and out_state.cache is state.cache  # a new handle
        state = out_state
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        # Live pages equal; padded rows touched only the scratch page 0.
        torch.testing.assert_close(state.cache[:, 1:], ref.cache[:, 1:], rtol=1e-5, atol=1e-5)
    assert step.counts == {"eager": 1, "piecewise": 1, "full": 1}
    # The logits op's result is the step's output only: no static buffer (its rows are the
    # real sequences, not a bucket's).
    last = step.plan.ops[-1]
    assert last.name == "mla_func::logits" and (last.index, 0) not in step.buffers.op_out


def test_dispatch_copy_plans_repad_and_stay_bounded(monkeypatch):
    """The copy targets kept per bucket and input shapes (`CompiledStep._fill`): steps of
    different token counts in one bucket, in turn, each pad their own rows again (a longer
    step wrote real ones there) and match eager; the kept plans never pass their bound. The
    values' shapes at real sizes (`CompiledStep._real`) are kept too, and the repeated token
    counts (5, 7) take theirs from that cache."""
    from mla_func.capture import dispatch
    from mla_func.compile_step import compile_step

    monkeypatch.setattr(dispatch, "FILL_PLANS_KEPT", 2)
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=3)
    state = mf.init_state(cfg, num_pages=32, page_size=4)
    step = compile_step(params, state, mode="piecewise", max_tokens=16, max_seqs=4,
                        max_pages=4, emulate=True, progress=False)
    alloc = state.allocator
    g = torch.Generator().manual_seed(0)
    for seq, n in enumerate([7, 5, 6, 5, 7, 8]):  # bucket 8 each time, three shapes
        ref = mf.init_state(cfg, num_pages=32, page_size=4)
        work = [mf.SeqWork(torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist(), 0,
                           alloc.reserve(seq, n))]
        batch = mf.make_batch(work, 4, 4)
        assert step.choose(step._merge((state, batch))) == ("piecewise", 8)
        shapes_before = dict(step.real_shapes)
        logits, state = step(state, batch)
        want, _ = mf.forward(params, ref, mf.make_batch(work, 4, 4))
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        assert 1 <= len(step.fill_plans) <= 2
        assert {key[1:] for key in step.real_shapes} >= {(n, 1)}  # (tokens, seqs)
        if (n, 1) in {key[1:] for key in shapes_before}:  # a repeated count: nothing new
            assert step.real_shapes == shapes_before
        # The segments' copy of the token ids: this step's, then the pad value 0.
        ids = next(step.buffers.leaves[sp.index] for sp in step.plan.signature.leaves
                   if sp.path == "batch.token_ids")
        assert torch.equal(ids[:n], batch.token_ids) and ids[n:8].eq(0).all()


def test_piecewise_logits_run_on_real_sequences():
    """In a piecewise step whose bucket pads `seqs`, the logits projection sees the real
    sequences' rows only, and the step returns its result as it is."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from mla_func.compile_step import compile_step

    class Spy(TorchDispatchMode):  # records each logits call: its rows and its result
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[int, torch.Tensor]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.mla_func.logits.default:
                self.calls.append((args[1].shape[0], out))
            return out

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=2)
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    ref = mf.init_state(cfg, num_pages=16, page_size=4)
    step = compile_step(params, state, mode="piecewise", max_tokens=16, max_seqs=8,
                        max_pages=4, emulate=True, progress=False)
    alloc = state.allocator
    work = [mf.SeqWork([5, 6, 7, 8, 9], 0, alloc.reserve(0, 5)),
            mf.SeqWork([1, 2], 0, alloc.reserve(1, 2))]  # 7 tokens, 2 sequences: bucket 8
    batch = mf.make_batch(work, 4, 4)
    assert step.choose(step._merge((state, batch))) == ("piecewise", 8)
    with Spy() as spy:
        logits, _ = step(state, batch)
    want, _ = mf.forward(params, ref, mf.make_batch(work, 4, 4))
    assert [rows for rows, _ in spy.calls] == [2] and logits.shape == (2, cfg.vocab_size)
    assert logits is spy.calls[0][1]  # handed over, not copied
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


def test_graph_modes_need_cuda():
    from mla_func.compile_step import compile_step

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    cfg = mf.MLAConfig.preset("tiny")
    params, state = mf.init_params(cfg), mf.init_state(cfg, num_pages=8, page_size=4)
    with pytest.raises(RuntimeError, match="CUDA"):
        compile_step(params, state, mode="piecewise")
    step = compile_step(params, state, mode="eager")
    assert step.mode == "eager"


def test_downgrade_is_reported_and_binding_checked():
    from mla_func.attention import AttentionBackend, GraphSupport, register_backend, torch_attention
    from mla_func.capture import BindingError
    from mla_func.compile_step import compile_step

    register_backend(AttentionBackend("capture_test_never", GraphSupport.NEVER, torch_attention))
    cfg = mf.MLAConfig.preset("tiny")
    params, state = mf.init_params(cfg), mf.init_state(cfg, num_pages=16, page_size=4)
    with pytest.warns(UserWarning, match="downgraded to 'piecewise'.*'never'"):
        step = compile_step(params, state, mode="full", max_tokens=4, max_seqs=2, max_pages=4,
                            backend="capture_test_never", emulate=True, progress=False)
    assert (step.mode, step.requested_mode) == ("piecewise", "full") and step.downgrade
    assert not step.full and step.report["downgrade"] == step.downgrade
    batch = mf.make_batch([mf.SeqWork([1, 2], 0, [1])], 4, 4, backend="capture_test_never")
    other = mf.init_state(cfg, num_pages=16, page_size=4)
    with pytest.raises(BindingError, match="`state.allocator` differs.*bound to one state"):
        step(other, batch)
    wide = mf.make_batch([mf.SeqWork([1, 2], 0, [1])], 4, 6, backend="capture_test_never")
    with pytest.raises(BindingError, match="max_pages"):
        step(state, wide)
    # Another cache behind the same allocator, in a call that graphs hold and in one too large
    # for any bucket (eager): both refused, and neither counted.
    import dataclasses

    twin = dataclasses.replace(state, cache=state.cache.clone())
    large = mf.make_batch([mf.SeqWork(list(range(1, 7)), 0, [1, 2])], 4, 4,
                          backend="capture_test_never")
    assert step.choose(step._merge((state, large)))[0] == "eager"
    for b in (batch, large):
        with pytest.raises(BindingError, match="`state.cache` is not the tensor"):
            step(twin, b)
    assert step.counts == {"eager": 0, "piecewise": 0, "full": 0}


@torch.library.custom_op("capture_test::flip_add", mutates_args=())
def _flip_add(x: Tensor) -> Tensor:
    return x.flip(0) + 1


@_flip_add.register_fake
def _(x):
    return torch.empty_like(x)


def returns_early_value(x: Float[Tensor, "tokens hidden"]):
    a = x * 3  # piece 0; only the function returns it
    b = _flip_add(x.sin())
    return a, (b * 5).exp().cos() + 1


def op_reads_early_value(x: Float[Tensor, "tokens hidden"]):
    a = x * 3  # piece 0; only the second op reads it, after piece 1
    c = (_flip_add(x.sin()) * 5).exp().cos() + 1
    return _flip_add(a) + c


@pytest.mark.parametrize("fn, want", [(returns_early_value, "never"), (op_reads_early_value, 1)])
def test_release_after_counts_op_readers_and_outputs(fn, want):
    """Pool memory of a piece's output may go to later pieces only after its last reader: a
    splitting op k reads it after piece k; the function's output after the last piece (the
    CUDA test test_values_read_late_survive_later_pieces shows the wrong results otherwise)."""
    from mla_func.capture.capture import release_after

    plan = plan_capture(fn, torch.randn(40, 8), dims=VOCAB,
                        splitting_ops=["capture_test::flip_add"])
    early = next(n for n in plan.segments[0].outputs if "mul" in n.name)
    got = release_after(plan)[early]
    assert got == (len(plan.segments) if want == "never" else want)


def two_ops_in_a_row(x: Float[Tensor, "tokens hidden"]):
    return _flip_add(_flip_add(x.sin())) * 2


def test_empty_segment_between_two_ops_is_not_captured():
    from mla_func.capture.compile import compile_plan

    x = torch.randn(5, 8)
    plan = plan_capture(two_ops_in_a_row, x, dims=VOCAB,
                        splitting_ops=["capture_test::flip_add"])
    assert [len(s.nodes) > 0 for s in plan.segments] == [True, False, True]
    step = compile_plan(plan, two_ops_in_a_row, [x], mode="piecewise", bound=(),
                        progress=False, emulate=True)
    assert all((g is None) == (not seg.nodes) for bucket in step.piecewise.values()
               for g, seg in zip(bucket.graphs, plan.segments, strict=True))
    y = torch.randn(7, 8)
    assert step.choose([y])[0] == "piecewise"
    torch.testing.assert_close(step(y), two_ops_in_a_row(y))


def branch_on_size(x: Float[Tensor, "tokens hidden"]):
    if x.shape[0] != 8:  # holds at the trace's sizes, not at bucket 8
        return x * 2
    return x


def test_shape_assumption_failing_at_a_bucket_is_an_error():
    """The assumption tokens != 8 holds at the probe sizes but not at the bucket 8, whose graph
    would compute x * 2 for an 8-token call (eager: x)."""
    with pytest.raises(CaptureError, match=r"assumes Ne\(tokens, 8\).*piecewise bucket 8"):
        plan_capture(branch_on_size, torch.randn(5, 4), dims=VOCAB)


def _flip_add_out(x, *, out):
    out.copy_(x.flip(0) + 1)


def returns_an_op_result_read_on(x: Float[Tensor, "tokens hidden"]):
    a = _flip_add(x.sin())  # op 0, written into a static buffer: piece 1 reads it
    d = _flip_add(_flip_add(a * 2) * 3) * 5  # op 2's buffer (piece 3 reads it) could be op 0's
    return a, d


def test_returned_op_buffer_is_not_reused():
    """An op result the next piece reads and the function returns is handed out from its
    static buffer: no later op may write there."""
    from mla_func.capture.compile import compile_plan

    x = torch.randn(5, 8)
    plan = plan_capture(returns_an_op_result_read_on, x, dims=VOCAB,
                        splitting_ops=["capture_test::flip_add"],
                        out_variants={"capture_test::flip_add": _flip_add_out})
    step = compile_plan(plan, returns_an_op_result_read_on, [x], mode="piecewise", bound=(),
                        progress=False, emulate=True)
    assert step.buffers.op_out[(0, 0)] is not step.buffers.op_out[(2, 0)]
    y = torch.randn(7, 8)
    for got, want in zip(step(y), returns_an_op_result_read_on(y), strict=True):
        torch.testing.assert_close(got, want)


def test_full_example_larger_than_its_buffers_is_refused():
    """A full example whose leaf outgrows its static buffer (here twice the bucket's rows, past
    `tokens`' maximum) is refused by name before anything is copied or captured."""
    from mla_func.capture.compile import compile_plan

    example = WithHost(_vec(6), torch.tensor([6, 3]))
    plan = plan_capture(f_out, example, dims=VOCAB, full_dim="tokens",
                        splitting_ops={"capture_test::mix_rows": lambda args: 3})

    def full_example(size: int) -> tuple:
        return (WithHost(torch.randn(2 * size, 8), torch.tensor([2 * size, 3])),)

    with pytest.raises(ValueError, match=r"`.*x` is \(128, 8\), larger than its buffer \(64, 8\)"):
        compile_plan(plan, f_out, [example], mode="full", bound=(), emulate=True,
                     full_when=lambda b: True, full_example=full_example, progress=False)


def test_full_graphs_stay_within_max_tokens():
    """A decode step holds a token a sequence: `max_seqs` above `max_tokens` is refused by
    name, and by default the full graphs stop at `max_tokens` sequences (they had crashed
    in `narrow` at the default 512), replaying a pure decode of that many rows as eager does."""
    from mla_func.compile_step import compile_step, seqs_within_tokens

    assert seqs_within_tokens(None, None) is None
    assert seqs_within_tokens(8, None) == 8 and seqs_within_tokens(8, 4) == 4
    assert seqs_within_tokens(4096, None) is None  # the vocabulary's 512 stays
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=2)
    state = mf.init_state(cfg, num_pages=32, page_size=4)
    with pytest.raises(ValueError, match="max_seqs=8 is more than max_tokens=4"):
        compile_step(params, state, mode="full", max_tokens=4, max_seqs=8, max_pages=4,
                     emulate=True, progress=False)
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=4, max_pages=4,
                        emulate=True, progress=False)
    assert step.plan.buckets["full"][-1] == 4 and sorted(step.full)[-1] == 4
    ref = mf.init_state(cfg, num_pages=32, page_size=4)
    g = torch.Generator().manual_seed(5)
    pages = [state.allocator.reserve(i, 3) for i in range(4)]
    prompt = [mf.SeqWork(torch.randint(0, cfg.vocab_size, (2,), generator=g).tolist(), 0, p)
              for p in pages]
    _, state = mf.forward(params, state, mf.make_batch(prompt, 4, 4))  # the same prompts in
    _, ref = mf.forward(params, ref, mf.make_batch(prompt, 4, 4))  # both caches, eagerly
    batch = mf.make_batch([mf.SeqWork([7 + i], 2, p) for i, p in enumerate(pages)], 4, 4)
    assert step.choose(step._merge((state, batch))) == ("full", 4)
    logits, _ = step(state, batch)
    want, _ = mf.forward(params, ref, batch)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_tokens, max_seqs", [(16, 1), (2, None), (2, 2), (1, None)])
def test_smallest_ranges_compile_and_match_eager(max_tokens, max_seqs):
    """A batch-1 server (`max_seqs=1`) or a token range of 1–2 has no prime example size of
    its own for the tracer: it traces at a larger one, and the graphs (emulated) match eager
    at every size they cover; larger steps run eagerly."""
    from mla_func.compile_step import compile_step

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=6)
    state = mf.init_state(cfg, num_pages=32, page_size=4)
    ref = mf.init_state(cfg, num_pages=32, page_size=4)
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=max_tokens,
                        max_seqs=max_seqs, max_pages=4, emulate=True, progress=False)
    assert step.plan.buckets["piecewise"][-1] == max_tokens
    assert step.plan.buckets["full"][-1] == (max_seqs or max_tokens)
    alloc = state.allocator
    pages = [alloc.reserve(i, 8) for i in range(2)]
    steps = [([mf.SeqWork([5], 0, pages[0])], "piecewise"),  # one-token prompt
             ([mf.SeqWork([6], 1, pages[0])], "full"),
             ([mf.SeqWork([7, 8, 9], 0, pages[1])], "eager" if max_tokens < 3 else "piecewise"),
             ([mf.SeqWork([1], 2, pages[0]), mf.SeqWork([2], 3, pages[1])],
              # two sequences: past a 1-sequence range every graph is too small
              "full" if (max_seqs or max_tokens) >= 2 else "eager")]
    for work, kind in steps:
        batch = mf.make_batch(work, 4, 4)
        assert step.choose(step._merge((state, batch)))[0] == kind, work
        logits, state = step(state, batch)
        want, ref = mf.forward(params, ref, batch)
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state.cache[:, 1:], ref.cache[:, 1:], rtol=1e-5, atol=1e-5)
