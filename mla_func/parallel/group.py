"""`TensorParallel`: which shard of the model this process holds, and the group that sums them.

A sharded `Params` carries one (its `tp` field; on one device `SINGLE`): the rank, the group's
size and the name under which `torch.distributed` knows the process group, so that the step,
a frozen dataclass of tensors and static values, can name its collectives (custom ops take
the name, not the group object). The group comes from a 1-D `DeviceMesh`
(`torch.distributed.device_mesh.init_device_mesh`), a `ProcessGroup`, or, for a process that
`torchrun` started, `init_from_env()`.
"""

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class ParallelError(ValueError):
    """A sharding, mesh or rank mismatch a user can cause."""


@dataclass(frozen=True)
class TensorParallel:
    """Rank `rank` of `size`; `group`: the process group's name ("" where no group exists:
    one device, or shards built for loading or inspection only)."""

    rank: int = 0
    size: int = 1
    group: str = ""

    def __post_init__(self) -> None:
        if not (self.size >= 1 and 0 <= self.rank < self.size):
            raise ParallelError(f"rank {self.rank} of a group of {self.size}")

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def part(self, n: int) -> slice:
        """This rank's share of n (an axis split evenly, n divisible by size)."""
        local = n // self.size
        return slice(self.rank * local, (self.rank + 1) * local)

    def require_group(self) -> str:
        """The group's name (ParallelError where there is none): a string check, cheap enough
        for every collective of an eager step."""
        if not self.group:
            raise ParallelError(f"these parameters are sharded over {self.size} ranks with no "
                                "process group: shard them with a mesh (shard_params(params, "
                                "mesh)) to run them")
        return self.group

    def process_group(self) -> Any:
        """The torch.distributed process group (ParallelError where there is none)."""
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(self.require_group())


SINGLE = TensorParallel()


def tensor_parallel(mesh: Any) -> TensorParallel:
    """This process's `TensorParallel` in `mesh`: a 1-D DeviceMesh, a ProcessGroup, or a
    TensorParallel (returned as is)."""
    if isinstance(mesh, TensorParallel):
        return mesh
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh, DeviceMesh):
        if mesh.ndim != 1:
            raise ParallelError(f"tensor parallelism takes a 1-D mesh; got {mesh.ndim} "
                                f"dims {mesh.mesh_dim_names}: pass mesh['tp'] or its 1-D slice")
        mesh = mesh.get_group()
    if not isinstance(mesh, dist.ProcessGroup):
        raise TypeError(f"mesh must be a 1-D DeviceMesh, a ProcessGroup or a TensorParallel; "
                        f"got {type(mesh).__name__}")
    return TensorParallel(dist.get_rank(mesh), dist.get_world_size(mesh), mesh.group_name)


def init_from_env(device: str = "auto") -> tuple[TensorParallel, torch.device]:
    """The group of a process `torchrun` started (RANK, WORLD_SIZE, LOCAL_RANK set): the
    default process group (NCCL on CUDA, gloo on CPU) as a 1-D mesh, and this rank's device
    (cuda:LOCAL_RANK, or the CPU). Without torchrun's variables: `SINGLE` and the device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if "WORLD_SIZE" not in os.environ:
        return SINGLE, torch.device(device)
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device(device)
    if dev.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ParallelError(f"local rank {local} but {torch.cuda.device_count()} CUDA "
                                "devices: --nproc-per-node must not exceed the GPUs")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():  # a step may wait long for a rank that captures graphs
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=30))
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("tp",))
    return tensor_parallel(mesh), dev


def finish(tp: TensorParallel) -> None:
    """The end of a `torchrun` process's work: every rank waits for the others, then the
    process groups close (a rank that exits while another still talks to it aborts)."""
    if tp.sharded and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def is_main(tp: TensorParallel) -> bool:
    """Whether this rank prints, shows progress and writes artifacts (rank 0)."""
    return tp.rank == 0
