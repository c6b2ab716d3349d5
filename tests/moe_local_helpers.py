"""Expert-parallel inputs of the MoE tests (test_moe_local.py on CPU, test_moe_local_cuda.py on
a GPU): a rank's slice of the routed experts and of the shared MLP, as an even split over `tp`
ranks holds them, and the sum of the ranks' partial results."""

from collections.abc import Callable

from torch import Tensor

from mla_func.ops.moe import local_experts
from mla_func.params import DenseMLP


def rank_slice(gate_up: Tensor, down: Tensor, mlp: DenseMLP | None, tp: int, rank: int
               ) -> tuple[int, Tensor, Tensor, DenseMLP | None]:
    """(first_expert, gate_up, down, shared) of rank `rank` of `tp`: its routed experts (views)
    and its tensor-parallel slice of the shared MLP's intermediate width (copies: a rank holds
    its own)."""
    first, n = local_experts(gate_up.shape[0], tp, rank)
    shared = None
    if mlp is not None:
        w = mlp.gate_up.shape[1] // tp
        cols = slice(rank * w, (rank + 1) * w)
        shared = DenseMLP(mlp.gate_up[:, cols].contiguous(), mlp.down[:, cols].contiguous())
    return first, gate_up[first:first + n], down[first:first + n], shared


def ranks_sum(run: Callable[..., Tensor], gate_up: Tensor, down: Tensor, mlp: DenseMLP | None,
              tp: int, check: Callable[[int, Tensor], None] | None = None) -> Tensor:
    """The sum over the ranks of `run(first_expert, gate_up, down, shared)` in float32 (what
    the all-reduce adds), each rank's result passed to `check` first."""
    total = None
    for rank in range(tp):
        part = run(*rank_slice(gate_up, down, mlp, tp, rank))
        if check is not None:
            check(rank, part)
        total = part.float() if total is None else total + part.float()
    return total


def owned(ids: Tensor, first: int, n: int) -> Tensor:
    """Which of the pairs `ids` (global) fall to the experts first .. first + n - 1."""
    return (ids >= first) & (ids < first + n)
