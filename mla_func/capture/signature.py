"""Stage 1, signature: the dim table, read from jaxtyping annotations before any tracing.

For every tensor leaf of the arguments (directly or as dataclass fields, nested) and every axis:
its name from the annotation and its kind from the vocabulary (static / capacity: bound to the
example's size, per dataclass instance as jaxtyping binds them; dynamic: a range 1..max and a
bucket policy, one size across all arguments). Unknown names, conflicting bindings, unnamed
axes: a `SignatureError` naming the argument path and the axis. No axis is assumed to be "the
token axis": dynamic axes are found wherever the annotation puts them. Arguments annotated
`Annotated[..., Donated]` (`mla_func.donation`) are donated: the function may write their
tensors in place (`purity`), and a compiled step consumes them per call.
"""

import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mla_func.capture.errors import SignatureError
from mla_func.capture.tree import TreeDef, flatten
from mla_func.donation import donated_params


@dataclass(frozen=True)
class DimEntry:
    name: str
    kind: str  # "static" | "capacity" | "dynamic" | "literal"
    size: int | None  # static, capacity, literal: the bound size (first binding)
    max_size: int | None  # dynamic: the largest size captured
    policy: str | None  # dynamic: the bucket policy's name
    bound_at: str  # first leaf axis that names it: "path[axis]"
    # Static names bind per dataclass instance (jaxtyping's rule): other sizes seen elsewhere,
    # e.g. two instances of one dataclass that bind the same name to different sizes.
    other_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class LeafSpec:
    index: int
    path: str
    arg: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    dims: tuple[str, ...]
    dynamic: tuple[tuple[int, str], ...]  # (axis, dim name) of each dynamic axis
    pad: Any  # field metadata "pad": the value of padded rows
    host: bool  # field metadata "host": never padded, always passed live
    donated: bool = False  # a leaf of a donated argument: the function may write it


@dataclass(frozen=True)
class Signature:
    arg_names: tuple[str, ...]
    treedefs: tuple[TreeDef, ...]
    leaves: tuple[LeafSpec, ...]
    dims: Mapping[str, DimEntry]
    donated: tuple[int, ...] = ()  # the donated arguments' positions

    @property
    def dynamic(self) -> tuple[str, ...]:
        return tuple(n for n, d in self.dims.items() if d.kind == "dynamic")

    @functools.cached_property
    def _first_dynamic(self) -> tuple[tuple[str, int, int], ...]:
        """(dim name, leaf index, axis) of the first leaf axis naming each dynamic dim."""
        first: dict[str, tuple[int, int]] = {}
        for spec in self.leaves:
            for axis, name in spec.dynamic:
                first.setdefault(name, (spec.index, axis))
        return tuple((name, i, axis) for name, (i, axis) in first.items())

    def dynamic_sizes(self, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
        """The real size of each dynamic dim in a flat list of leaves (first leaf naming it)."""
        if len(tensors) != len(self.leaves):
            raise ValueError(f"{len(tensors)} leaves, the signature has {len(self.leaves)}")
        return {name: int(tensors[i].shape[axis]) for name, i, axis in self._first_dynamic}


def _axis_names(path: str, tensor: torch.Tensor, ann: Any) -> tuple[str, ...]:
    if ann is None:
        raise SignatureError(f"tensor `{path}` has no jaxtyping annotation: the compiler reads "
                             "each axis's name from it")
    names = []
    for axis, dim in enumerate(ann.dims):
        kind = type(dim).__name__
        if kind == "_NamedDim":
            names.append(dim.name)
        elif kind == "_FixedDim":
            names.append(str(dim.size))
        else:
            raise SignatureError(f"`{path}` axis {axis} is annotated `{kind}`: argument axes "
                                 "must be named dims or literal sizes (no `*x`, `_`, `a*b`)")
    if len(names) != tensor.dim():
        raise SignatureError(f"`{path}` has {tensor.dim()} axes but its annotation names "
                             f"{len(names)}: {' '.join(names)!r}")
    return tuple(names)


def analyze(
    fn: Callable[..., Any],
    args: Sequence[Any],
    vocabulary: Mapping[str, Any],
    max_sizes: Mapping[str, int] | None = None,
) -> Signature:
    """Build the dim table of `fn(*args)`; `vocabulary` maps a dim name to an object with
    `kind`, `max_size` and `policy` (like `mla_func.dims.DimSpec`)."""
    params = list(inspect.signature(fn).parameters)
    if len(args) > len(params):
        raise SignatureError(f"{len(args)} example arguments for {len(params)} parameters")
    hints = typing.get_type_hints(fn)
    max_sizes = dict(max_sizes or {})
    for name in max_sizes:
        if name not in vocabulary or vocabulary[name].kind != "dynamic":
            raise SignatureError(f"max size given for {name!r}, which is not a dynamic dim")
    donated = tuple(i for i in donated_params(fn) if i < len(args))
    dims: dict[str, DimEntry] = {}
    seen_dynamic: dict[str, tuple[int, str]] = {}
    scoped: dict[tuple[str, str], tuple[int, str]] = {}
    leaves: list[LeafSpec] = []
    treedefs: list[TreeDef] = []
    for arg_index, (pname, value) in enumerate(zip(params, args, strict=False)):
        flat, td = flatten(value, pname, hints.get(pname))
        treedefs.append(td)
        for path, tensor, ann, meta in flat:
            names = _axis_names(path, tensor, ann)
            dynamic = []
            for axis, name in enumerate(names):
                where, size = f"{path}[{axis}]", int(tensor.shape[axis])
                if name.isdigit():
                    if size != int(name):
                        raise SignatureError(f"{where} has size {size}, annotated {name}")
                    continue
                spec = vocabulary.get(name)
                if spec is None:
                    raise SignatureError(f"{where} is named {name!r}, which is not in the dim "
                                         f"vocabulary (known: {', '.join(sorted(vocabulary))})")
                if spec.kind == "dynamic":
                    dynamic.append((axis, name))
                    first = seen_dynamic.setdefault(name, (size, where))
                    if first[0] != size:
                        raise SignatureError(f"dynamic dim {name!r} is {first[0]} at {first[1]} "
                                             f"but {size} at {where}")
                    if name not in dims:
                        top = int(max_sizes.get(name, spec.max_size or 0))
                        if top < 1:
                            raise SignatureError(f"dynamic dim {name!r} has no max size")
                        dims[name] = DimEntry(name, "dynamic", None, top, spec.policy, where)
                    continue
                # jaxtyping binds a name once per call across the function's own tensor
                # arguments, and once per dataclass instance across its fields.
                owner = path.rsplit(".", 1)[0] if "." in path else None
                first = scoped.setdefault((owner or "", name), (size, where))
                if first[0] != size:
                    what = "one call's arguments" if owner is None else f"fields of {owner}"
                    raise SignatureError(f"dim {name!r} is {first[0]} at {first[1]} but {size} "
                                         f"at {where} ({what} bind one size)")
                entry = dims.get(name)
                if entry is None:
                    dims[name] = DimEntry(name, spec.kind, size, None, None, where)
                elif entry.size != size and size not in entry.other_sizes:
                    dims[name] = replace(entry, other_sizes=entry.other_sizes + (size,))
            leaves.append(LeafSpec(
                index=len(leaves), path=path, arg=arg_index, shape=tuple(tensor.shape),
                stride=tuple(tensor.stride()), dtype=tensor.dtype, device=tensor.device,
                dims=names, dynamic=tuple(dynamic), pad=meta.get("pad"),
                host=bool(meta.get("host", False)), donated=arg_index in donated,
            ))
    for leaf in leaves:
        if leaf.host and leaf.dynamic:
            raise SignatureError(f"`{leaf.path}` is a host tensor with dynamic axes: host "
                                 "tensors are passed live and never padded")
    return Signature(tuple(params[: len(args)]), tuple(treedefs), tuple(leaves), dims, donated)
