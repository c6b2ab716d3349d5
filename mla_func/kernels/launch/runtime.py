"""The kernels' runtime: what they keep between launches, owned by one state.

A `Runtime` belongs to one `KVState` (one engine, one compiled step) and owns
- the arrival counters (`counters`): one int32 tensor, zero between launches, fixed address so
  that captured graphs keep it; each op that counts owns a fixed slice (`COUNTER_SLICES`) and
  receives the tensor as an argument it declares mutated;
- the side streams the MoE's shared experts run on (`side_stream`, one per device);
- the per-family resources the kernels grow at their first call and keep (`resource`): the
  decode workspace, the record of tiles that ran out of GPU resources.
Two engines in one process own two runtimes, so they never share a workspace, a counter or a
stream.

Custom ops take tensors, not objects: an op finds the runtime through a tensor of the state it
receives, the counters or the cache (`Runtime.of`), which the runtime owns.
"""

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

# (first slot, slots) of each op's counters; a launch leaves its slots zero again.
COUNTER_SLICES: dict[str, tuple[int, int]] = {
    "moe_route": (0, 256),  # one a token block of a split router launch (router.plan)
    "proj_add_rmsnorm": (256, 1),
    "moe_last_sum": (272, 1024),  # one an N-tile of the down GEMM, one for the norm
    "fp8_linear": (1296, 1024),  # one a column tile of a split few-row FP8 GEMM (fp8_tiles)
    "moe_gate_up_split": (2320, 1024),  # one an output tile of a split gate_up (moe.split_k)
    "moe_down_split": (3344, 1024),  # ... and of a split down GEMM
}
COUNTER_SLOTS = max(first + n for first, n in COUNTER_SLICES.values())

# Storage (device, address) -> the runtime that owns it: how an op finds its runtime.
_OWNERS: dict[tuple[str, int], "weakref.ref[Runtime]"] = {}


def _key(tensor: Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


class Runtime:
    """Launch resources of one state (module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.counters = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=self.device)
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._resources: dict[str, Any] = {}
        self.own(self.counters)

    def own(self, tensor: Tensor) -> None:
        """Let ops find this runtime through `tensor` (its counters, its state's cache). The
        tensor object itself holds its runtime too (the fast path of `of`, and it keeps the
        runtime alive: an op handed only the counters, a call outside a step, still finds the
        side stream and workspace that go with them); views find it by their storage."""
        tensor._mla_runtime = self
        # Not under a tracer (fake tensors have no address) nor on `meta`: no kernel runs there.
        if type(tensor) is Tensor and tensor.device.type != "meta":
            _OWNERS[_key(tensor)] = weakref.ref(self)

    @staticmethod
    def of(tensor: Tensor) -> "Runtime":
        """The runtime that owns `tensor` (or a view of it): a state's counters or cache."""
        runtime = tensor.__dict__.get("_mla_runtime")
        if runtime is not None:
            return runtime
        ref = _OWNERS.get(_key(tensor))
        runtime = None if ref is None else ref()
        if runtime is None:
            raise RuntimeError("this tensor belongs to no live runtime: pass the cache and "
                               "counters of a KVState (init_state makes one)")
        return runtime

    def resource(self, name: str, make: Callable[[], T]) -> T:
        """The resource called `name`, made by `make()` at the first call and kept."""
        found = self._resources.get(name)
        if found is None:
            found = self._resources[name] = make()
        return found

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """This runtime's second stream on `device`, made on first use and kept: cuBLAS keeps
        a workspace per stream, and a stream per call would allocate one each time (inside a
        capture too)."""
        index = torch.cuda.current_device() if device.index is None else device.index
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(index)
        return self._streams[index]


def call_counters(counters: Tensor | None, device: torch.device) -> Tensor:
    """`counters`, or, for a call outside a step (a test, a benchmark), those of a runtime of
    the call's own on `device`."""
    return Runtime(device).counters if counters is None else counters


def op_counters(counters: Tensor, op: str) -> Tensor:
    """The slice of a runtime's counters that op `mla_func::<op>` owns (made once a tensor
    object: an eager step asks for it at every layer)."""
    views = counters.__dict__.setdefault("_mla_slices", {})
    view = views.get(op)
    if view is None:
        first, n = COUNTER_SLICES[op]
        if counters.numel() < COUNTER_SLOTS:
            raise ValueError(f"the counters hold {counters.numel()} slots; the kernels use "
                             f"{COUNTER_SLOTS} (KVState.counters)")
        view = views[op] = counters[first:first + n]
    return view
