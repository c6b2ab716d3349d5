"""Flattening argument pytrees (tuples, lists, frozen dataclasses) into tensor leaves.

Our dataclasses are not registered torch pytrees, and they carry static parts (a config, a
page allocator, a backend name): this module splits any such tree into its tensor leaves, each
with its dotted path and its jaxtyping annotation, and a `TreeDef` that rebuilds the tree from
new leaves (equinox's `partition`/`combine`, without the registration).
"""

import copy
import dataclasses
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, eq=False)
class TreeDef:
    kind: str  # "leaf" | "tuple" | "list" | "dataclass" | "const" | "input"
    # The dataclass template, the constant, or for "input" (an output that is an argument
    # object, returned as is): (argument index, field names down to it).
    obj: Any = None
    children: tuple[tuple[str, "TreeDef"], ...] = ()


def array_annotation(ann: Any, tensor: torch.Tensor | None = None) -> Any:
    """The jaxtyping array type inside `ann` (unwrapping `X | None`), or None. In a union of
    array types, the first that takes `tensor`'s dtype (each may name its axes otherwise:
    float rows of values, or rows of bytes), else the first."""
    if ann is None:
        return None
    if hasattr(ann, "dims") and hasattr(ann, "dtypes"):
        return ann
    found = [a for a in map(array_annotation, typing.get_args(ann)) if a is not None]
    if tensor is not None:
        name = str(tensor.dtype).removeprefix("torch.")
        found = [a for a in found if name in a.dtypes] + found
    return found[0] if found else None


def _element_annotation(ann: Any, index: int) -> Any:
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if not args:
        return None
    if typing.get_origin(ann) in (tuple, typing.Tuple):  # noqa: UP006
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[index] if index < len(args) else None
    if typing.get_origin(ann) in (list, typing.List):  # noqa: UP006
        return args[0]
    for a in args:  # a Union of tuples: take the first tuple member
        if typing.get_origin(a) in (tuple, list):
            return _element_annotation(a, index)
    return None


Leaf = tuple[str, torch.Tensor, Any, dict]  # path, tensor, annotation, field metadata


def flatten(obj: Any, path: str, ann: Any = None, meta: dict | None = None
            ) -> tuple[list[Leaf], TreeDef]:
    """Tensor leaves of `obj` (depth first, field order) and the TreeDef to rebuild it."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj, array_annotation(ann, obj), dict(meta or {}))], TreeDef("leaf")
    if isinstance(obj, (tuple, list)):
        leaves, children = [], []
        for i, item in enumerate(obj):
            sub, td = flatten(item, f"{path}.{i}", _element_annotation(ann, i), meta)
            leaves += sub
            children.append((str(i), td))
        return leaves, TreeDef(type(obj).__name__, None, tuple(children))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        hints = typing.get_type_hints(type(obj))
        leaves, children = [], []
        for f in dataclasses.fields(obj):
            sub, td = flatten(getattr(obj, f.name), f"{path}.{f.name}", hints.get(f.name),
                              dict(f.metadata))
            leaves += sub
            children.append((f.name, td))
        if not leaves:  # no tensor inside (a config, options): one static value, compared whole
            return [], TreeDef("const", obj)
        return leaves, TreeDef("dataclass", obj, tuple(children))
    return [], TreeDef("const", obj)


def unflatten(td: TreeDef, leaves: Iterator[Any], args: tuple = ()) -> Any:
    """Rebuild a tree from leaves (in flatten order); dataclasses are copied, not re-validated.
    "input" nodes are taken from `args` (the call's arguments)."""
    if td.kind == "leaf":
        return next(leaves)
    if td.kind == "const":
        return td.obj
    if td.kind == "input":
        arg, names = td.obj
        return select(args[arg], names)
    if td.kind in ("tuple", "list"):
        items = [unflatten(c, leaves, args) for _, c in td.children]
        return tuple(items) if td.kind == "tuple" else items
    out = copy.copy(td.obj)
    for name, child in td.children:
        object.__setattr__(out, name, unflatten(child, leaves, args))
    return out


def select(obj: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        obj = obj[int(name)] if isinstance(obj, (tuple, list)) else getattr(obj, name)
    return obj


def object_paths(obj: Any, arg: int, names: tuple[str, ...] = ()) -> dict[int, tuple]:
    """id -> (argument, field names) of every tuple, list and dataclass inside `obj`."""
    if isinstance(obj, (tuple, list)):
        out = {id(obj): (arg, names)}
        for i, item in enumerate(obj):
            out.update(object_paths(item, arg, names + (str(i),)))
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {id(obj): (arg, names)}
        for f in dataclasses.fields(obj):
            out.update(object_paths(getattr(obj, f.name), arg, names + (f.name,)))
        return out
    return {}


def flatten_output(obj: Any, inputs: dict[int, tuple]) -> tuple[list[Any], TreeDef]:
    """Like `flatten` (no annotations), but an argument object returned as is becomes an
    "input" node: the caller gets its own object back (e.g. a state consumed in place)."""
    if id(obj) in inputs:
        return [], TreeDef("input", inputs[id(obj)])
    if isinstance(obj, torch.Tensor):
        return [obj], TreeDef("leaf")
    if isinstance(obj, (tuple, list)):
        leaves, children = [], []
        for i, item in enumerate(obj):
            sub, td = flatten_output(item, inputs)
            leaves += sub
            children.append((str(i), td))
        return leaves, TreeDef(type(obj).__name__, None, tuple(children))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        leaves, children = [], []
        for f in dataclasses.fields(obj):
            sub, td = flatten_output(getattr(obj, f.name), inputs)
            leaves += sub
            children.append((f.name, td))
        if not leaves:  # no tensor inside (a config, options): one static value, compared whole
            return [], TreeDef("const", obj)
        return leaves, TreeDef("dataclass", obj, tuple(children))
    return [], TreeDef("const", obj)


def flat_call(fn: Callable[..., Any], treedefs: Sequence[TreeDef], rest: Sequence[Any] = ()
              ) -> tuple[Callable[..., list[Any]], list[TreeDef]]:
    """`fn` as a function of the tensor leaves of its first `len(treedefs)` arguments (the
    trees rebuilt around them; `rest` follow as they are), returning its output's leaves
    (`flatten_output`: an argument object returned as is is an "input" node). The second
    value receives the output's TreeDef of each call, for tracers that call it once."""
    out_defs: list[TreeDef] = []

    def flat_fn(*leaves: Any) -> list[Any]:
        it = iter(leaves)
        rebuilt = tuple(unflatten(td, it) for td in treedefs)
        inputs: dict[int, tuple] = {}
        for i, obj in enumerate(rebuilt):
            inputs.update(object_paths(obj, i))
        out_leaves, td = flatten_output(fn(*rebuilt, *rest), inputs)
        out_defs.append(td)
        return out_leaves

    return flat_fn, out_defs
