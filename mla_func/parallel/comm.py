"""The step's collectives, as custom ops: one node each for tracers, inside captured graphs.

`all_reduce(x, tp)` sums x over the ranks of `tp` (NCCL on CUDA, gloo on the CPU; NCCL's
launches are capturable, so these ops live inside piecewise segments and full decode graphs
and are not splitting points). `all_gather_cols` lays the ranks' column blocks side by side
(the logits' vocabulary shards). Every rank receives the same bits: the collectives reduce
in one order for all (NCCL's ring and tree, gloo's ring), so greedy choices agree across
ranks. On one device (`tp.sharded` False) both are the identity and launch nothing.
"""

import torch
import torch.distributed as dist
from jaxtyping import Float
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.parallel.group import TensorParallel

# The step's collective ops, as the capture plan names them.
COLLECTIVES = ("mla_func::all_reduce",)


def _group(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


@custom_op("mla_func::all_reduce", mutates_args=())
def _all_reduce(x: Tensor, group: str) -> Tensor:
    out = x.clone()
    dist.all_reduce(out, group=_group(group))
    return out


@_all_reduce.register_fake
def _(x, group):
    return torch.empty_like(x)


def all_reduce(x: Float[Tensor, "*rows width"], tp: TensorParallel
               ) -> Float[Tensor, "*rows width"]:
    """The sum of x over the ranks of `tp` (x itself on one device)."""
    if not tp.sharded:
        return x
    tp.process_group()  # a clear error where the shards have no group
    return _all_reduce(x, tp.group)


def gather_cols(local: Tensor, group: str, ranks: int) -> Tensor:
    """[rows, cols] on every rank -> [rows, ranks * cols], rank r's block at r * cols."""
    pg = _group(group)
    rows, cols = local.shape
    local = local.contiguous()
    if local.is_cuda:
        stacked = local.new_empty(ranks * rows, cols)
        dist.all_gather_into_tensor(stacked, local, group=pg)
        blocks = stacked.view(ranks, rows, cols)
    else:  # gloo: the list form
        parts = [torch.empty_like(local) for _ in range(ranks)]
        dist.all_gather(parts, local, group=pg)
        blocks = torch.stack(parts)
    return blocks.permute(1, 0, 2).reshape(rows, ranks * cols)


__all__ = ["COLLECTIVES", "all_reduce", "gather_cols"]
