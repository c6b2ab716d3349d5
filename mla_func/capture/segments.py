"""What runs a static segment in piecewise graphs: its traced module as it is ("plain"), or
the module compiled by Inductor before capture ("inductor"), as vLLM's piecewise backend does.

Inductor fuses the segment's elementwise and reduction work around the kernels the custom ops
launch (those stay opaque: their fake implementations give it shapes and strides). Each
distinct segment is compiled once for every bucket: the axes its trace holds symbolic (the
dynamic dims) are marked dynamic on the first call's inputs, so that one graph serves every
bucket size (size 1, which torch specialises, and integer inputs compile once more). Segments
with the same code and inputs (`plan.distinct`) share one compiled module, unless a segment
holds constants of its own. The compilation happens on the first call, which capture makes
in its warm-up, outside any CUDA graph; the graphs then capture Inductor's kernels.
"""

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from mla_func.capture.plan import CapturePlan
from mla_func.capture.split import op_name

SEGMENT_KINDS = ("plain", "inductor")


# The trace's size queries as the tensor methods dynamo reads them (it cannot put an ATen op
# that returns an int into its graph).
_SIZE_QUERIES = {"aten::sym_size.int": "size", "aten::sym_numel": "numel",
                 "aten::sym_stride.int": "stride", "aten::sym_storage_offset": "storage_offset"}


def for_dynamo(module: fx.GraphModule) -> fx.GraphModule:
    """A copy of `module` that dynamo compiles once for every bucket: its ATen size queries as
    tensor method calls, and each integer input that is a dynamic dim read from the first
    tensor input that has it as an axis (dynamo would take the integer for a constant and
    pin the tensors' axes to it)."""
    module = fx.GraphModule(module, copy.deepcopy(module.graph), module.__class__.__name__)
    graph = module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    axis_of: dict[Any, tuple[fx.Node, int]] = {}
    for n in placeholders:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            for a, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    axis_of.setdefault(size.node.expr, (n, a))
    last = placeholders[-1] if placeholders else None
    for n in placeholders:
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr in axis_of:
            src, a = axis_of[val.node.expr]
            with graph.inserting_after(last):
                size = graph.call_method("size", (src, a))
            n.replace_all_uses_with(size)
    for n in graph.nodes:
        method = _SIZE_QUERIES.get(op_name(n.target)) if n.op == "call_function" else None
        if method is not None:
            n.op, n.target = "call_method", method
    module.recompile()
    return module


def _symbolic_axes(module: fx.GraphModule) -> list[tuple[int, int]]:
    """(input position, axis) of each input axis the trace holds symbolic."""
    axes = []
    inputs = [n for n in module.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(inputs):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            axes += [(i, a) for a, s in enumerate(val.shape) if isinstance(s, torch.SymInt)]
    return axes


class CompiledSegment:
    """A segment module compiled by Inductor (`torch.compile`, one graph, no breaks), its
    symbolic axes marked dynamic on each call's inputs (a no-op once compiled)."""

    def __init__(self, module: fx.GraphModule) -> None:
        self.module = for_dynamo(module)
        self.axes = _symbolic_axes(module)
        self.compiled = torch.compile(self.module, backend="inductor", fullgraph=True)

    def __call__(self, *inputs: Any) -> Any:
        for i, axis in self.axes:
            if inputs[i].shape[axis] >= 2:  # torch specialises sizes 0 and 1
                torch._dynamo.maybe_mark_dynamic(inputs[i], axis)
        return self.compiled(*inputs)


def segment_runners(plan: CapturePlan, kind: str) -> list[Callable[..., Any]]:
    """Per segment, what piecewise capture runs: `kind` "plain" (its module) or "inductor"."""
    if kind not in SEGMENT_KINDS:
        raise ValueError(f"unknown segments {kind!r}; expected one of {SEGMENT_KINDS}")
    if kind == "plain":
        return [seg.module for seg in plan.segments]
    shared: dict[int, CompiledSegment] = {}
    runners: list[Callable[..., Any]] = []
    for seg in plan.segments:
        own_constants = any(n.op == "get_attr" for n in seg.module.graph.nodes)
        if own_constants:
            runners.append(CompiledSegment(seg.module))
            continue
        d = plan.distinct[seg.index]
        if d not in shared:
            shared[d] = CompiledSegment(seg.module)
        runners.append(shared[d])
    return runners
