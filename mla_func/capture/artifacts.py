"""Artifacts: `plan.json` and one readable `segment_NN.py` per distinct segment.

A pure consumer of the plan: `save_plan(plan, directory)` writes a plan out, `plan_json(plan)`
is its JSON. No stage imports this module; the package face, scripts and tests do.

Deterministic by construction (no timestamps, no absolute paths, symbols renamed to dim
names) so that the plan of a small preset can be kept in git as a golden file; what differs
between machines (torch/triton/python versions) sits in the "environment" field only.
"""

import json
import os
import platform
import re
from typing import Any

import torch
import torch.fx as fx

from mla_func.capture.errors import relative_path
from mla_func.capture.plan import SUPPORT_NAMES, CapturePlan
from mla_func.capture.split import Segment, op_name

FORMAT = 1


def environment() -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = "none"
    return {"torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version()}


def _renamer(plan: CapturePlan):
    names = {str(sym): name for name, sym in plan.traced.symbols.items()}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None

    def rename(text: str) -> str:
        return pattern.sub(lambda m: names[m.group(1)], text) if pattern else text

    return rename


def _val_str(val: Any, rename) -> str:
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).replace("torch.", "")
        return rename(f"{dtype}[{', '.join(str(s) for s in val.shape)}]")
    if isinstance(val, torch.SymInt):
        return rename(f"int {val}")
    return type(val).__name__


def _source(plan: CapturePlan, n: fx.Node) -> str:
    if n.op == "placeholder":
        return plan.signature.leaves[plan.placeholder_index()[n]].path
    if n.op == "get_attr":
        return f"constant {n.target}"
    for op in plan.ops:
        if n in op.outputs:
            return f"op {op.index} ({op.name})" + (
                f" output {op.outputs.index(n)}" if len(op.outputs) > 1 else "")
    for seg in plan.segments:
        if n in seg.outputs:
            return f"segment {seg.index} output {seg.outputs.index(n)}"
    return n.name


def _consumers(plan: CapturePlan, seg: Segment, n: fx.Node) -> list[str]:
    out = []
    for other in plan.segments[seg.index + 1:]:
        if n in other.inputs:
            out.append(f"segment {other.index}")
    for op in plan.ops:
        if n in op.node.all_input_nodes:
            out.append(f"op {op.index}")
    if any(u.op == "output" for u in n.users):
        out.append("result")
    return out


def segment_json(plan: CapturePlan, seg: Segment) -> dict:
    rename = _renamer(plan)
    return {
        "index": seg.index,
        "distinct": plan.distinct[seg.index],
        "file": f"segment_{plan.distinct[seg.index]:02d}.py",
        "inputs": [f"{_source(plan, n)}: {_val_str(n.meta.get('val'), rename)}"
                   for n in seg.inputs],
        "outputs": [f"{_val_str(n.meta.get('val'), rename)} -> "
                    f"{', '.join(_consumers(plan, seg, n))}" for n in seg.outputs],
        "num_ops": sum(seg.op_counts().values()),
        "op_counts": seg.op_counts(),
    }


def plan_json(plan: CapturePlan) -> dict:
    from mla_func.capture.buckets import summary

    sig = plan.signature
    dims = {}
    for name, d in sig.dims.items():
        entry = {"kind": d.kind, "bound_at": d.bound_at}
        if d.kind == "dynamic":
            entry.update(max=d.max_size, policy=plan.policies.get(name, d.policy),
                         trace_hint=plan.traced.hints[name])
        else:
            entry["size"] = d.size
        dims[name] = entry
    modes = {}
    for mode, sizes in plan.buckets.items():
        modes[mode] = {"dim": plan.mode_dims[mode], **summary(sizes)}
    modes["piecewise"]["graphs"] = len(plan.buckets["piecewise"]) * len(plan.segments)
    modes["piecewise"]["distinct_segment_graphs"] = (
        len(plan.buckets["piecewise"]) * plan.num_distinct)
    return {
        "format": FORMAT,
        "function": plan.fn_name,
        **plan.meta,
        "dims": dims,
        "dynamic_dims": list(sig.dynamic),
        "leaves": {leaf.path: " ".join(leaf.dims) for leaf in sig.leaves},
        "padding": {leaf.path: leaf.pad for leaf in sig.leaves if leaf.dynamic},
        "host_leaves": [leaf.path for leaf in sig.leaves if leaf.host],
        "donated": [sig.arg_names[i] for i in sig.donated],
        "shape_assumptions": list(plan.traced.assumptions),
        "splitting_ops": [
            {"index": op.index, "op": op.name, "after_segment": op.index,
             "graph_support": None if s is None else SUPPORT_NAMES[s],
             "writes_next_input": bool(plan.out_fns and plan.out_fns[op.index]),
             "where": op.node.meta.get("user_frame")}
            for op, s in zip(plan.ops, plan.support, strict=True)],
        "full_graph_support": SUPPORT_NAMES[plan.full_support],
        "modes": modes,
        "segments": [segment_json(plan, seg) for seg in plan.segments],
        "distinct_segments": plan.num_distinct,
        "environment": environment(),
    }


def segment_source(plan: CapturePlan, seg: Segment) -> str:
    """Readable Python for one segment: its inputs, outputs and the ATen code, with the user's
    source line of each op as a comment."""
    rename = _renamer(plan)
    same = [s.index for s in plan.segments if plan.distinct[s.index] == plan.distinct[seg.index]]
    lines = [f'"""Segment {seg.index} of {plan.fn_name}, generated by mla_func.capture.',
             "", f"The same code runs as segments {same}." if len(same) > 1 else "",
             "Inputs (of this first occurrence):"]
    for i, n in enumerate(seg.inputs):
        lines.append(f"    in_{i}: {_source(plan, n)}: {_val_str(n.meta.get('val'), rename)}")
    lines.append("Outputs:")
    for i, n in enumerate(seg.outputs):
        lines.append(f"    {i}: {_val_str(n.meta.get('val'), rename)} -> "
                     f"{', '.join(_consumers(plan, seg, n))}")
    lines += ['"""', "", "import torch", "", ""]
    body = []
    by_name = {n.name: n for n in seg.module.graph.nodes}
    last_where = None
    code = seg.module.code.strip("\n")
    for line in code.splitlines():
        target = line.strip().split(" = ", 1)[0]
        node = by_name.get(target)
        where = node.meta.get("user_frame") if node else None
        if where and where != last_where:
            indent = line[: len(line) - len(line.lstrip())]
            body.append(f"{indent}# {where}")
            last_where = where
        body.append(re.sub(r";\s+[\w\s=,]+= None$", "", line))
    return rename("\n".join(lines) + "\n".join(body) + "\n")


def save_plan(plan: CapturePlan, directory: str) -> list[str]:
    """Write plan.json and one segment_NN.py per distinct segment into `directory`; segment
    files an earlier, larger plan left there are removed (they would read as this plan's)."""
    os.makedirs(directory, exist_ok=True)
    keep = {f"segment_{d:02d}.py" for d in set(plan.distinct)}
    for name in os.listdir(directory):
        if re.fullmatch(r"segment_\d+\.py", name) and name not in keep:
            os.remove(os.path.join(directory, name))
    written = []
    path = os.path.join(directory, "plan.json")
    with open(path, "w") as f:
        json.dump(plan_json(plan), f, indent=1, default=str)
        f.write("\n")
    written.append(path)
    done: set[int] = set()
    for seg in plan.segments:
        d = plan.distinct[seg.index]
        if d in done:
            continue
        done.add(d)
        path = os.path.join(directory, f"segment_{d:02d}.py")
        with open(path, "w") as f:
            f.write(segment_source(plan, seg))
        written.append(path)
    return written


__all__ = ["environment", "plan_json", "save_plan", "segment_source", "relative_path",
           "op_name"]
