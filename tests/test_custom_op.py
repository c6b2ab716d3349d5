"""`mla_func.custom_op`: eager calls skip the dispatcher, traced calls record the op."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import mla_func as mf
from mla_func import custom_op as co
from mla_func.custom_op import EagerOp
from mla_func.kernels.plan import KernelOptions


@co.custom_op("mla_func_test::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + y


@scale_add.register_fake
def _(x, y, s):
    return torch.empty_like(x)


@co.custom_op("mla_func_test::write_rows", mutates_args=("dst",))
def write_rows(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    dst[: src.shape[0]] = src
    return src.sum(0)


@write_rows.register_fake
def _(dst, src):
    return src.new_empty(src.shape[1:])


class _Refused:
    """Stands in for the registered op: a call through it fails the test."""

    def __call__(self, *args):
        raise AssertionError("went through the dispatcher")


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_an_eager_call_runs_the_function_without_the_dispatcher(monkeypatch):
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    want = torch.ops.mla_func_test.scale_add(x, y, 2.5)
    monkeypatch.setattr(scale_add, "op", _Refused())
    assert torch.equal(scale_add(x, y, 2.5), want)
    assert torch.equal(scale_add(x, y=y, s=2.5), want)  # keywords too


def test_a_mutating_op_writes_the_same_rows_either_way(monkeypatch):
    src = torch.randn(3, 4)
    via_op, direct = torch.zeros(6, 4), torch.zeros(6, 4)
    total = torch.ops.mla_func_test.write_rows(via_op, src)
    monkeypatch.setattr(write_rows, "op", _Refused())
    assert torch.equal(write_rows(direct, src), total)
    assert torch.equal(direct, via_op)


def test_tracing_records_one_op_node():
    """make_fx (what the capture compiler runs) sees the op, not the function's aten ops."""
    gm = make_fx(lambda x, y: scale_add(x, y, 2.0), tracing_mode="symbolic")(
        torch.randn(4, 3), torch.randn(4, 3))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.mla_func_test.scale_add.default]


def test_dispatch_modes_fake_and_meta_tensors_go_through_the_op(monkeypatch):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    with _Seen() as seen:
        scale_add(x, y, 1.0)
    assert seen.ops == ["mla_func_test.scale_add.default"]
    out = scale_add(x.to("meta"), y.to("meta"), 1.0)  # the fake implementation
    assert out.is_meta and out.shape == (2, 3)
    monkeypatch.setattr(scale_add, "op", _Refused())
    with pytest.raises(AssertionError, match="dispatcher"):
        scale_add(x.to("meta"), y.to("meta"), 1.0)
    with pytest.raises(AssertionError, match="dispatcher"):
        scale_add.dispatch(x, y, 1.0)


@pytest.mark.interpret
def test_the_model_gives_the_same_bits_through_the_dispatcher_or_not(monkeypatch):
    """The fused path's ops (norms, small projections, attention, logits) run on CPU through
    the Triton interpreter: direct calls give the dispatcher's logits to the bit, and the
    dispatcher path does go through the dispatcher."""
    calls = []
    real = EagerOp.dispatch

    def counted(self, *args, **kwargs):
        calls.append(self.__name__)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EagerOp, "dispatch", counted)  # a spy: counts, changes nothing
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=3)
    prompt = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(4))
    outs = []
    for direct in (False, True):
        opts = KernelOptions(fused=True, eager_direct=direct)
        state = mf.init_state(cfg, num_pages=16, page_size=4)
        pages = state.allocator.reserve(0, 10)
        first, state = mf.forward(params, state, mf.make_batch(
            [mf.SeqWork(prompt.tolist(), 0, pages)], 4, 4, kernels=opts))
        then, state = mf.forward(params, state, mf.make_batch([mf.SeqWork([7], 9, pages)], 4,
                                                              4, kernels=opts))
        outs.append((first, then, state.cache.clone()))
        assert bool(calls) == (not direct), calls
        calls.clear()
    for via_op, direct in zip(*outs, strict=True):
        assert torch.equal(direct, via_op)


def test_errors_and_plans_name_the_callers_line():
    """The wrapper's frame hides itself (`__tracebackhide__`): an error raised by the
    dispatcher (here: an argument the schema refuses) is placed at the line that called the
    op, as plans place the op's node."""
    from mla_func.capture.errors import user_frame_of_exception

    x = torch.randn(2, 3)
    # Under a dispatch mode the registered op is called, and checks its arguments.
    with _Seen(), pytest.raises(RuntimeError, match="Expected a value of type .float.") as info:
        scale_add(x, x, "not a float")
    where = user_frame_of_exception(info.value)
    assert where is not None and "test_custom_op.py" in where and "scale_add(x, x" in where
