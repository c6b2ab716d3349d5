"""Stage 3b, purity: the traced function writes nothing but its donated arguments.

A captured graph replays the writes it recorded, on every replay and during capture's
warm-ups, into the very buffers it was captured with: a write to an argument the caller still
owns would change the caller's tensor (in a static input buffer, not even the caller's), and a
write to a tensor the function closes over, or a draw from a random generator, would repeat
once per warm-up, capture and replay. So every write must land in a donated argument
(`Annotated[..., Donated]`, `mla_func.donation`) or in a tensor the function made itself.
Rejected, with the op and the user's source line:
- an in-place op, an `out=` op or a custom op that mutates an argument (its schema's `(a!)`),
  whose written tensor is, through any chain of views, an argument the function does not
  donate, or a constant of the trace (a global or closed-over tensor);
- an op that draws from a random generator (`torch.Tag.nondeterministic_seeded`).
A write that the tracer itself saw land on a real tensor (a global one, which tracing would
otherwise change) is refused while tracing (trace.py), with the same message.
"""

import operator

import torch
import torch.fx as fx

from mla_func.capture.errors import CaptureError
from mla_func.capture.signature import Signature
from mla_func.capture.split import op_name
from mla_func.capture.trace import WRITES_CONSTANT


def _arg(n: fx.Node, index: int, name: str) -> object:
    return n.args[index] if index < len(n.args) else n.kwargs.get(name)


def written(n: fx.Node) -> list[fx.Node]:
    """The argument nodes that `n` writes (its schema's mutable arguments)."""
    schema = getattr(n.target, "_schema", None)
    if n.op != "call_function" or schema is None:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = _arg(n, i, a.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [v for v in values if isinstance(v, fx.Node)]
    return out


def _aliased(n: fx.Node) -> fx.Node | None:
    """The input node whose memory `n`'s result aliases (a view, or an in-place op's self),
    or None."""
    if n.op != "call_function":
        return None
    if n.target is operator.getitem:  # an element of a list of views (split, unbind)
        src = n.args[0]
        return src if isinstance(src, fx.Node) and _aliased(src) is not None else None
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        return None
    sets = set()
    for r in schema.returns:
        if r.alias_info is not None:
            sets |= set(r.alias_info.before_set)
    if not sets:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and sets & set(a.alias_info.before_set):
            value = _arg(n, i, a.name)
            return value if isinstance(value, fx.Node) else None
    return None


def root(n: fx.Node) -> fx.Node:
    """The node that owns `n`'s memory: through views and in-place results to the tensor
    they alias (a placeholder, a constant, or a tensor the function made)."""
    while (up := _aliased(n)) is not None:
        n = up
    return n


def check_purity(gm: fx.GraphModule, sig: Signature) -> None:
    """`CaptureError` at the first write outside the donated arguments, or random draw."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    leaf_of = dict(zip(placeholders, sig.leaves, strict=True))
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        where = n.meta.get("user_frame")
        tags = getattr(n.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags:
            raise CaptureError(
                "draws from a random generator, whose state every warm-up, capture and replay "
                "would advance again (pass the random values in as an argument)",
                op=op_name(n.target), where=where)
        for target in written(n):
            owner = root(target)
            if owner.op == "get_attr":
                raise CaptureError(WRITES_CONSTANT, op=op_name(n.target), where=where)
            spec = leaf_of.get(owner)
            if spec is not None and not spec.donated:
                raise CaptureError(
                    f"writes the argument `{spec.path}` in place, which the function does not "
                    f"donate: the caller's tensor would change (declare the argument "
                    f"`Annotated[..., Donated]`, or write a copy)",
                    op=op_name(n.target), where=where)
