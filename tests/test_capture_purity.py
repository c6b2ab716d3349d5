"""`capture.purity`: at plan time, a write outside the donated arguments or a random draw is a
`CaptureError` naming the op and the line; writes to donated arguments and to the function's
own tensors plan, and the plan records what is donated."""

from dataclasses import dataclass
from typing import Annotated

import pytest
import torch
from jaxtyping import Float
from torch import Tensor

from mla_func.capture import CaptureError, plan_capture
from mla_func.capture.artifacts import plan_json
from mla_func.dims import DimSpec
from mla_func.donation import Donated

VOCAB = {"tokens": DimSpec("tokens", "dynamic", "", 16, "bounded"),
         "hidden": DimSpec("hidden", "static", "")}
Rows = Float[Tensor, "tokens hidden"]

COUNTER = torch.zeros(1)
TABLE = torch.zeros(8)


@dataclass(frozen=True)
class Acc:
    total: Float[Tensor, " hidden"]


@torch.library.custom_op("purity_test::add_rows", mutates_args=("dst",))
def add_rows(dst: Tensor, x: Tensor) -> None:
    dst.add_(x.sum(0))


@add_rows.register_fake
def _(dst, x):
    return None


def writes_input(x: Rows) -> Rows:
    x.mul_(2)
    return x + 1


def writes_a_view_of_input(x: Rows) -> Rows:
    x[:, :2].zero_()
    return x + 1


def bumps_a_global(x: Rows) -> Rows:
    COUNTER.add_(1)
    return x * 2


def _closing_over(buf: Tensor):
    def writes_closed_over(x: Rows) -> Rows:
        torch.sum(x, 0, out=buf)
        return x * 2

    return writes_closed_over


def op_writes_input(x: Rows, acc: Acc) -> Rows:
    add_rows(acc.total, x)
    return x * 2


def op_writes_a_global(x: Rows) -> Rows:
    add_rows(TABLE, x)
    return x * 2


def draws(x: Rows) -> Rows:
    return x + torch.rand_like(x)


CASES = [
    (writes_input, "writes the argument `x` in place, which the function does not donate",
     "aten::mul_", "x.mul_(2)"),
    (writes_a_view_of_input, "argument `x` in place", "aten::zero_", "x[:, :2].zero_()"),
    (bumps_a_global, "closes over or a global", "Tensor.add_", "COUNTER.add_(1)"),
    (_closing_over(torch.zeros(8)), "closes over or a global", "torch.sum", "torch.sum(x, 0"),
    (op_writes_input, "argument `acc.total` in place", "purity_test::add_rows",
     "add_rows(acc.total, x)"),
    (op_writes_a_global, "closes over or a global", "purity_test::add_rows",
     "add_rows(TABLE, x)"),
    (draws, "draws from a random generator", "aten::rand_like", "torch.rand_like(x)"),
]


@pytest.mark.parametrize("fn, message, op, line", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_violation_names_op_and_line(fn, message, op, line):
    x = torch.randn(5, 8)
    args = (x, Acc(torch.zeros(8))) if fn is op_writes_input else (x,)
    with pytest.raises(CaptureError, match=message) as info:
        plan_capture(fn, *args, dims=VOCAB)
    assert info.value.op is not None and info.value.op.startswith(op), info.value.op
    assert "test_capture_purity.py:" in info.value.where and line in info.value.where


def test_a_global_is_refused_before_it_is_written():
    before = COUNTER.clone()
    with pytest.raises(CaptureError):
        plan_capture(bumps_a_global, torch.randn(5, 8), dims=VOCAB)
    assert torch.equal(COUNTER, before)


def donates(x: Rows, acc: Annotated[Acc, Donated]) -> tuple[Rows, Acc]:
    add_rows(acc.total, x)  # the donated argument's tensor, through a custom op
    acc.total[:2].mul_(0.5)  # and in place, through a view
    local = torch.zeros_like(x)
    local[:, 1:].copy_(x[:, :-1])  # the function's own tensor
    return local * 2, acc


def test_donated_and_local_writes_plan_and_are_recorded():
    plan = plan_capture(donates, torch.randn(5, 8), Acc(torch.zeros(8)), dims=VOCAB)
    assert plan.signature.donated == (1,)
    assert [leaf.donated for leaf in plan.signature.leaves] == [False, True]
    assert plan_json(plan)["donated"] == ["acc"]


def test_the_models_plan_donates_its_state():
    import mla_func as mf
    from mla_func.compile_step import plan_step

    cfg = mf.MLAConfig.preset("tiny")
    params, state = mf.init_params(cfg, device="meta"), mf.init_state(cfg, 8, 4, "meta")
    plan = plan_step(params, state, max_tokens=8, max_seqs=4, max_pages=4)
    assert plan_json(plan)["donated"] == ["state"]
    assert {leaf.path for leaf in plan.signature.leaves if leaf.donated} == {
        "state.cache", "state.counters"}
