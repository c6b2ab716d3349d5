"""Stage 3a, split: cut the traced graph at the splitting ops into static segments.

Node order is kept: segment k holds the nodes between splitting op k-1 and k (segment 0 the
nodes before the first one, the last segment the nodes after the last one; none when a
splitting op is the function's last computation), like vLLM's split at its attention ops.
Each segment becomes a standalone `GraphModule` whose inputs are function leaves, outputs of
earlier segments, or splitting-op outputs; its code is what `plan.save` writes as
`segment_NN.py`, and segments with the same code (and input shapes) are one "distinct" segment.
"""

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.fx as fx


@dataclass(eq=False)
class SplitOp:
    index: int
    node: fx.Node
    name: str
    outputs: list[fx.Node]  # the node itself, or its getitem users for tuple outputs


@dataclass(eq=False)
class Segment:
    index: int
    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    module: fx.GraphModule | None = None
    key: str = ""  # code + input shapes: equal keys = one distinct segment

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.op == "call_function":
                name = op_name(n.target)
                counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))


def op_name(target: object) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        overload = schema.overload_name
        return schema.name + (f".{overload}" if overload else "")
    return getattr(target, "__name__", str(target))


def op_base_name(target: object) -> str | None:
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else None


def default_splitting_ops(gm: fx.GraphModule) -> list[str]:
    """Custom (non-aten, non-prims) ops that mutate an argument: kernels with side effects on
    the caller's buffers, which a piecewise graph runs eagerly."""
    names = []
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or schema.name.split("::")[0] in ("aten", "prims"):
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            if schema.name not in names:
                names.append(schema.name)
    return names


def split_graph(gm: fx.GraphModule, splitting: Mapping[str, object]
                ) -> tuple[list[Segment], list[SplitOp]]:
    segments = [Segment(0)]
    ops: list[SplitOp] = []
    where: dict[fx.Node, int] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr", "output"):
            continue
        if n.op == "call_function" and op_base_name(n.target) in splitting:
            ops.append(SplitOp(len(ops), n, op_base_name(n.target), [n]))
            segments.append(Segment(len(segments)))
            continue
        if (n.op == "call_function" and n.target is operator.getitem and ops
                and n.args[0] is ops[-1].node):
            if ops[-1].outputs == [ops[-1].node]:
                ops[-1].outputs = []
            ops[-1].outputs.append(n)
            continue
        segments[-1].nodes.append(n)
        where[n] = segments[-1].index
    if ops and not segments[-1].nodes:  # the function ends with a splitting op
        segments.pop()
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for seg in segments:
        members = set(seg.nodes)
        for n in seg.nodes:
            for inp in n.all_input_nodes:
                if inp not in members and inp not in seg.inputs:
                    seg.inputs.append(inp)
            if any(u not in members or u is output for u in n.users):
                seg.outputs.append(n)
    for seg in segments:
        seg.module = _build_module(gm, seg)
        shapes = [str(_val_desc(i)) for i in seg.inputs]
        seg.key = seg.module.code + "\n".join(shapes)
    return segments, ops


def _val_desc(n: fx.Node) -> object:
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (tuple(str(s) for s in val.shape), str(val.dtype), str(val.device))
    return type(val).__name__


def _build_module(gm: fx.GraphModule, seg: Segment) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    root: dict[str, object] = {}
    for i, inp in enumerate(seg.inputs):
        if inp.op == "get_attr":
            name = f"const_{len(root)}"
            root[name] = getattr(gm, inp.target)
            env[inp] = graph.get_attr(name)
        else:
            env[inp] = graph.placeholder(f"in_{i}")
        env[inp].meta = dict(inp.meta)
    for n in seg.nodes:
        new = graph.create_node(n.op, n.target, fx.map_arg(n.args, env.__getitem__),
                                fx.map_arg(n.kwargs, env.__getitem__))
        new.meta = dict(n.meta)
        env[n] = new
    graph.output(tuple(env[o] for o in seg.outputs))
    return fx.GraphModule(root, graph, class_name=f"Segment{seg.index}")
