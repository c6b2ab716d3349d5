"""The step's collectives, as custom ops: one node each for tracers, inside captured graphs.

`all_reduce(x, tp, opts, counters)` sums x over the ranks of `tp`. Its form is the plan's
(`kernels.plan.all_reduce_form`, from x's bytes): decode-sized sums on CUDA run the pushed
one-shot sum (`kernels.collective.push_sum`: every rank stores its rows into the others'
symmetric buffers over NVLink and reads theirs from its own, one launch, no barrier, no
NVLink multicast), the rest NCCL's all-reduce (gloo's on the CPU). Both are capturable, so
these ops live inside piecewise segments and full decode graphs and are not splitting points.
The symmetric buffer belongs to the state's runtime (`Runtime.resource`): made collectively by
`prepare` before any graph is captured. `all_reduce_add_norm` pushes the same sum and adds the
residual and the norm in the same launch, where the plan fuses them
(`kernels.plan.reduce_norm_fused`). `gather_cols` lays the ranks' column blocks side by side
(the logits' vocabulary shards). Every rank receives the same bits: every form adds the ranks
in one order for all, so greedy choices agree across ranks. On one device (`tp.sharded`
False) the ops are the identity and launch nothing.
"""

from typing import Any

import torch
import torch.distributed as dist
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.collective import push_sum
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.linear import norm as fused_norm
from mla_func.kernels.plan import (
    KernelOptions,
    all_reduce_form,
    one_shot_max_bytes,
    reduce_norm_fused,
)
from mla_func.ops.norm import rmsnorm
from mla_func.parallel.group import TensorParallel

# The step's collective ops, as the capture plan names them.
COLLECTIVES = ("mla_func::all_reduce", "mla_func::all_reduce_add_norm")


def _group(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _push_buffer(runtime: Runtime, group: str, dtype: torch.dtype
                 ) -> tuple[Tensor, int, int, int, Tensor]:
    """This runtime's push buffer of `dtype` for `group` (`push_sum.buffer_elements`: a slot
    of the largest one-shot sum for each rank in each of two halves, empty), the device address of
    the ranks' buffer addresses, this rank, the ranks, and the launches' phase (int32 zeros,
    read and flipped by them): `push_sum`'s arguments. Made and exchanged with the other
    ranks at the first call: every rank must call it together, and not while a graph is
    being captured (`prepare` makes it before)."""
    def make() -> tuple[Tensor, Any, Tensor]:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the one-shot all-reduce's symmetric buffer is made while a "
                               "graph is captured: call parallel.comm.prepare first")
        import torch.distributed._symmetric_memory as symm_mem

        pg = _group(group)
        world = dist.get_world_size(pg)
        slot = one_shot_max_bytes(world) // dtype.itemsize
        size = push_sum.buffer_elements(slot, world)
        buf = push_sum.empty_buffer(symm_mem.empty(size, dtype=dtype, device=runtime.device))
        torch.cuda.synchronize(runtime.device)  # empty before any peer may push into it
        handle = symm_mem.rendezvous(buf, group)
        dist.barrier(group=pg)  # every rank's buffer is empty before the first push
        return buf, handle, torch.zeros(2, dtype=torch.int32, device=runtime.device)

    buf, handle, phase = runtime.resource(f"push_sum:{group}:{dtype}", make)
    return buf, handle.buffer_ptrs_dev, handle.rank, handle.world_size, phase


def _ranks(group: str) -> int:
    return dist.get_world_size(_group(group))


def _sum(x: Tensor, owner: Tensor, group: str, one_shot: bool) -> Tensor:
    """The sum of x over the ranks, in the plan's form for x's bytes."""
    nbytes = x.numel() * x.element_size()
    if all_reduce_form(nbytes, x.is_cuda, one_shot, _ranks(group)) == "one_shot":
        return push_sum.push_all_reduce(x, *_push_buffer(Runtime.of(owner), group, x.dtype))
    out = x.clone()
    dist.all_reduce(out, group=_group(group))
    return out


# `owner`: a tensor of the state (its counters, read nowhere) whose runtime holds the buffer.
@custom_op("mla_func::all_reduce", mutates_args=())
def _all_reduce(x: Tensor, owner: Tensor, group: str, one_shot: bool) -> Tensor:
    return _sum(x, owner, group, one_shot)


@_all_reduce.register_fake
def _(x, owner, group, one_shot):
    return torch.empty_like(x)


def all_reduce(x: Float[Tensor, "*rows width"], tp: TensorParallel, opts: KernelOptions,
               counters: Int[Tensor, " counters"]) -> Float[Tensor, "*rows width"]:
    """The sum of x over the ranks of `tp` (x itself on one device); `counters`: the
    state's, whose runtime holds the symmetric buffer."""
    if not tp.sharded:
        return x
    tp.require_group()  # a clear error where the shards have no group
    return _all_reduce(x, counters, tp.group, opts.one_shot)


# The form is chosen inside the op from x's bytes (a traced step serves every bucket).
@custom_op("mla_func::all_reduce_add_norm", mutates_args=())
def _all_reduce_add_norm(x: Tensor, h: Tensor, weight: Tensor, eps: float, owner: Tensor,
                         group: str, one_shot: bool, fused: bool, reduce_norm: bool
                         ) -> tuple[Tensor, Tensor]:
    rows, width = x.shape
    if reduce_norm_fused(rows, width, x.element_size(), x.is_cuda, fused, reduce_norm,
                         one_shot, _ranks(group)):
        return push_sum.push_all_reduce_add_rmsnorm(
            x, h, weight, eps, *_push_buffer(Runtime.of(owner), group, x.dtype))
    total = _sum(x, owner, group, one_shot)
    if fused:
        return fused_norm.add_rmsnorm(h, total, weight, eps)
    h = h + total
    return h, rmsnorm(h, weight, eps)


@_all_reduce_add_norm.register_fake
def _(x, h, weight, eps, owner, group, one_shot, fused, reduce_norm):
    return torch.empty_like(h), torch.empty(
        h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)


def all_reduce_add_norm(x: Float[Tensor, "tokens hidden"], h: Float[Tensor, "tokens hidden"],
                        weight: Float[Tensor, " hidden"], eps: float, tp: TensorParallel,
                        opts: KernelOptions, counters: Int[Tensor, " counters"]
                        ) -> tuple[Float[Tensor, "tokens hidden"], Float[Tensor, "tokens hidden"]]:
    """(h + the sum of x over the ranks, its rmsnorm * weight): one launch over the symmetric
    buffers where the plan says (`kernels.plan.reduce_norm_fused`:
    `kernels.collective.push_sum`), else the sum (`all_reduce`'s form), then the add and
    norm (fused or torch's, as `opts.fused`). One op either way: the choice follows x's bytes
    at run time, as `all_reduce`'s does."""
    tp.require_group()
    return _all_reduce_add_norm(x, h, weight, eps, counters, tp.group, opts.one_shot,
                                opts.fused, opts.reduce_norm)


def prepare(tp: TensorParallel, opts: KernelOptions, counters: Tensor,
            dtype: torch.dtype) -> None:
    """Make the one-shot form's push buffer of the runtime owning `counters` (every rank
    together; before a graph is captured). Nothing to do on one device, on the CPU or with
    `opts.one_shot` off."""
    if tp.sharded and counters.is_cuda and opts.one_shot:
        _push_buffer(Runtime.of(counters), tp.group, dtype)


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


__all__ = ["COLLECTIVES", "all_reduce", "all_reduce_add_norm", "gather_cols", "prepare"]
