"""The same step on every rank: a check that each rank schedules what the others do.

Every rank runs its own engine over the same requests, and the scheduler is deterministic
(arrival order, host counts only), so the ranks build the same batches by construction and
replay the same graphs. Should they not (a request submitted on one rank only, a different
budget), their collectives would disagree in size and NCCL would wait forever. So before each
step every rank shares a digest of its batch over a CPU (gloo) group and compares: a
difference raises `ScheduleError` on every rank, naming the ranks that differ, before any
collective of that step is launched.
"""

import zlib
from array import array
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from mla_func.parallel.group import TensorParallel


class ScheduleError(RuntimeError):
    """The ranks of a tensor-parallel group scheduled different steps."""


def digest(values: Iterable[int]) -> int:
    """A digest of integers that every process computes alike (not Python's salted hash)."""
    return zlib.crc32(array("q", values).tobytes())


# A step group (NCCL) -> its gloo twin, made once: engines built again on the same group (a
# benchmark's, a test's) reuse it instead of adding a process group each time.
_CPU_GROUPS: dict[Any, Any] = {}


def cpu_group(group: Any) -> Any:
    """`group` where it is gloo, else a gloo group of the same ranks, made at the first call
    (by every rank of `group` together, as `dist.new_group` must be) and kept."""
    if dist.get_backend(group) == "gloo":
        return group
    found = _CPU_GROUPS.get(group)
    if found is None:
        found = _CPU_GROUPS[group] = dist.new_group(dist.get_process_group_ranks(group),
                                                    backend="gloo")
    return found


class ScheduleCheck:
    """Built by every rank of `tp` together (the first on an NCCL group creates its gloo
    twin, `cpu_group`); `check(step, values)` compares the digests of `values` across ranks."""

    def __init__(self, tp: TensorParallel) -> None:
        self.rank, self.ranks = tp.rank, tp.size
        self.group = cpu_group(tp.process_group())

    def check(self, step: int, values: Iterable[int]) -> None:
        mine = torch.tensor([step, digest(values)], dtype=torch.int64)
        seen = [torch.empty_like(mine) for _ in range(self.ranks)]
        dist.all_gather(seen, mine, group=self.group)
        if any(not torch.equal(s, seen[0]) for s in seen):
            table = ", ".join(f"rank {r}: step {int(s[0])} digest {int(s[1]):08x}"
                              for r, s in enumerate(seen))
            raise ScheduleError(f"the ranks scheduled different steps ({table}); every rank "
                                "must submit the same requests in the same order with the "
                                "same engine settings")
