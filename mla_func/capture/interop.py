"""Torch interop from the annotations: the dim table as `torch.export` dynamic shapes and as
`torch.compile`'s dynamic marks.

The dim table (signature.py) already says which axis of which argument is dynamic, under which
name and over which range. `export_dims` turns each dynamic dim into one `torch.export.Dim` of
that name and range, shared by every axis that names it; `export` exports the function with
them. `torch.export` takes tensors and registered pytrees, and these arguments are frozen
dataclasses with static fields (a config, an allocator, options) that no pytree registration
describes: the exported program is the function's flat view (tree.py's `flat_call`: the
tensor leaves in, the output's leaves out, the static fields constants of the program), and
`Exported` takes and returns the original structures, refusing static fields other than the
exported ones (`BindingError`). `mark_dynamic` marks the dynamic axes of example arguments for
dynamo, so that `torch.compile(fn)` compiles one graph for every size of them (sizes 0 and 1
excepted: torch specialises those and compiles again).

    exported = export(fn, *example_args)      # dims: the vocabulary, as plan_capture's
    out = exported(*args)                     # any sizes within each dim's range
    mark_dynamic(fn, *example_args); out = torch.compile(fn)(*example_args)

A consumer of the signature stage, like artifacts.py of the plan: no stage imports it.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mla_func.capture.errors import BindingError
from mla_func.capture.plan import bind_leaves
from mla_func.capture.signature import Signature, analyze
from mla_func.capture.trace import no_runtime_checks
from mla_func.capture.tree import TreeDef, flat_call, unflatten
from mla_func.donation import check_live, consume, pure

# One `torch.export.Dim` (or None: static) per axis of one leaf.
LeafShapes = dict[int, Any] | None


def signature_of(fn: Callable[..., Any], args: Sequence[Any],
                 dims: Mapping[str, Any] | None = None,
                 max_sizes: Mapping[str, int] | None = None) -> Signature:
    """The dim table of `fn(*args)`; `dims` default: the package's vocabulary (as
    `plan_capture`'s)."""
    if dims is None:
        from mla_func.dims import VOCABULARY as dims
    return analyze(fn, args, dims, max_sizes)


def export_dims(sig: Signature, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One `torch.export.Dim` per dynamic dim: its name, range 1 .. its max size. Given the
    example's `sizes`, a dim of size 0 or 1 there is left out (torch specialises those: the
    program would hold it static)."""
    return {name: torch.export.Dim(name, min=1, max=sig.dims[name].max_size)
            for name in sig.dynamic if sizes is None or sizes[name] >= 2}


def dynamic_shapes(sig: Signature, dims: Mapping[str, Any]) -> tuple[LeafShapes, ...]:
    """`torch.export`'s dynamic shapes of the flat view's leaves: axis -> Dim of each axis
    named by one of `dims` (`export_dims`), None for a leaf without one."""
    return tuple({axis: dims[name] for axis, name in leaf.dynamic if name in dims} or None
                 for leaf in sig.leaves)


def leaves(sig: Signature, args: Sequence[Any]) -> list[torch.Tensor]:
    """The tensor leaves of `args` in the signature's order; `BindingError` where a static
    field or the structure differs from the signature's (static objects without value
    equality, a state's allocator, need only be of the same type: `plan.bind_leaves`)."""
    if len(args) != len(sig.treedefs):
        raise BindingError(f"{len(args)} arguments; the signature has {len(sig.treedefs)}")
    out: list[torch.Tensor] = []
    for name, td, arg in zip(sig.arg_names, sig.treedefs, args, strict=True):
        bind_leaves(td, arg, out, name, identity=False)
    return out


class _Flat(torch.nn.Module):
    """The flat view as the module `torch.export` takes."""

    def __init__(self, fn: Callable[..., list[Any]]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *leaves: torch.Tensor) -> tuple[Any, ...]:
        return tuple(self.fn(*leaves))


@dataclass(frozen=True, eq=False)
class Exported:
    """An exported program and the structures around it: called with the original
    arguments, it returns the original output structure, its donated arguments consumed as
    the function's own calls consume them (`mla_func.donation`: a new handle in place of
    each)."""

    program: Any  # torch.export.ExportedProgram
    signature: Signature
    out_treedef: TreeDef
    dims: tuple[str, ...]  # the dynamic dims the program holds symbolic

    @functools.cached_property
    def _module(self) -> torch.nn.Module:
        return self.program.module()

    def module(self) -> torch.nn.Module:
        """The program as a module of the flat leaves (`torch.export`'s `module()`, made
        once)."""
        return self._module

    def __call__(self, *args: Any) -> Any:
        donated = [args[i] for i in self.signature.donated]
        for i, obj in zip(self.signature.donated, donated, strict=True):
            check_live(obj, self.signature.arg_names[i])
        outs = self.module()(*leaves(self.signature, args))
        return consume(unflatten(self.out_treedef, iter(outs), args), donated)


def export(fn: Callable[..., Any], *args: Any, dims: Mapping[str, Any] | None = None,
           max_sizes: Mapping[str, int] | None = None, strict: bool = False) -> Exported:
    """`torch.export.export` of `fn(*args)` with every dynamic dim of its annotations a
    `torch.export.Dim` (`export_dims`), but those the example has at size 0 or 1 (static:
    `Exported.dims` lists the others). `dims` / `max_sizes`: as `plan_capture`'s."""
    sig = signature_of(fn, args, dims, max_sizes)
    flat = leaves(sig, args)
    symbolic = export_dims(sig, sig.dynamic_sizes(flat))
    flat_fn, out_defs = flat_call(pure(fn), sig.treedefs)
    with no_runtime_checks():
        program = torch.export.export(_Flat(flat_fn), tuple(flat),
                                      dynamic_shapes=(dynamic_shapes(sig, symbolic),),
                                      strict=strict)
    return Exported(program, sig, out_defs[-1], tuple(symbolic))


def mark_dynamic(fn: Callable[..., Any], *args: Any, dims: Mapping[str, Any] | None = None
                 ) -> Signature:
    """Mark every dynamic axis of `args`' tensors (the annotations' dynamic dims) dynamic for
    dynamo, where its size is at least 2 (torch specialises 0 and 1), so that
    `torch.compile(fn)` compiles them symbolic from its first call. Returns the dim table."""
    sig = signature_of(fn, args, dims)
    for spec, tensor in zip(sig.leaves, leaves(sig, args), strict=True):
        for axis, _ in spec.dynamic:
            if tensor.shape[axis] >= 2:
                torch._dynamo.mark_dynamic(tensor, axis)
    return sig


__all__ = ["Exported", "dynamic_shapes", "export", "export_dims", "leaves", "mark_dynamic",
           "signature_of"]
