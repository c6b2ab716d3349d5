"""`plan_capture`: stages 1-4 without a GPU (signature -> trace -> split + validate -> buckets).

The plan is everything the GPU capture needs to know and everything a reader needs to trust it:
the dim table, the segments with their inputs and outputs, the splitting ops and their graph
support, and the bucket sizes of each mode with their padding-waste bound.

This module owns `CapturePlan`, `plan_capture` and what the later stages (capture, dispatch)
ask of a plan: the dims' sizes at a bucket (`sizes_at`) and the tensor leaves of call
arguments, checked against the traced structure (`leaves_of`). Writing a plan out is
artifacts.py's (`save_plan`, `plan_json`): the plan knows no later stage.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from mla_func.capture.buckets import BucketPolicy, bucket_sizes
from mla_func.capture.errors import BindingError, CaptureError
from mla_func.capture.signature import Signature, analyze
from mla_func.capture.split import (
    Segment,
    SplitOp,
    default_splitting_ops,
    op_base_name,
    split_graph,
)
from mla_func.capture.trace import Traced, trace
from mla_func.capture.tree import TreeDef
from mla_func.capture.validate import validate
from mla_func.donation import pure

# vLLM's graph-support levels, generic: how much of a splitting op a CUDA graph may hold.
NEVER, UNIFORM_SINGLE_TOKEN_DECODE, UNIFORM_BATCH, ALWAYS = 0, 1, 2, 3
SUPPORT_NAMES = ("never", "uniform_single_token_decode", "uniform_batch", "always")

SupportFn = Callable[[tuple], int]
# An op's "out variant": called as fn(*op_args, out=buffer, **op_kwargs), it writes what the op
# would return into `buffer` (the next segment's static input, real rows) and returns nothing.
OutFn = Callable[..., None]


@dataclass(eq=False)
class CapturePlan:
    fn_name: str
    signature: Signature
    traced: Traced
    segments: list[Segment]
    ops: list[SplitOp]
    support: list[int | None]  # per splitting op; None: not declared
    buckets: dict[str, tuple[int, ...]]  # mode ("piecewise", "full") -> sizes
    mode_dims: dict[str, str]  # mode -> the dynamic dim its buckets are keyed by
    distinct: list[int] = field(default_factory=list)  # per segment: its distinct index
    meta: dict[str, Any] = field(default_factory=dict)
    meta_cache: dict[str, Any] = field(default_factory=dict, repr=False)  # derived lookups
    policies: dict[str, str] = field(default_factory=dict)  # dim -> bucket policy used
    out_fns: list[OutFn | None] = field(default_factory=list)  # per splitting op

    def placeholder_index(self) -> dict[fx.Node, int]:
        """Graph placeholder -> leaf index (cached: dispatch asks every step)."""
        cached = self.meta_cache.get("placeholders")
        if cached is None:
            cached = {p: i for i, p in enumerate(
                n for n in self.traced.gm.graph.nodes if n.op == "placeholder")}
            self.meta_cache["placeholders"] = cached
        return cached

    def output_node(self) -> fx.Node:
        cached = self.meta_cache.get("output")
        if cached is None:
            cached = next(n for n in reversed(self.traced.gm.graph.nodes) if n.op == "output")
            self.meta_cache["output"] = cached
        return cached

    @property
    def full_support(self) -> int:
        """The least graph support over splitting ops (ALWAYS when there are none)."""
        levels = [s if s is not None else NEVER for s in self.support]
        return min(levels, default=ALWAYS)

    @property
    def num_distinct(self) -> int:
        return max(self.distinct, default=-1) + 1


def sizes_at(plan: CapturePlan, size: int) -> dict[str, int]:
    """Each dynamic dim's size at bucket `size`: the bucket, capped at the dim's own maximum.
    A dim with a smaller range (`seqs` <= 512 beside `tokens` <= 8192) is never padded past
    it, so what depends on it alone (logits rows) stays that small in every graph."""
    dims = plan.signature.dims
    return {n: min(size, dims[n].max_size or size) for n in plan.traced.symbols}


def bind_leaves(td: TreeDef, obj: Any, out: list[torch.Tensor], path: str,
                identity: bool = True) -> None:
    """Collect `obj`'s tensor leaves in `td`'s order; BindingError naming the first field
    whose structure or static value differs from the traced one. `identity`: a static object
    without value equality (an allocator) must be the traced one itself; else one of its
    type will do (a program that baked in no such object)."""
    if td.kind == "leaf":
        if not isinstance(obj, torch.Tensor):
            raise BindingError(f"`{path}` is not a tensor")
        out.append(obj)
    elif td.kind == "const":
        same_type = type(obj) is type(td.obj)
        by_type = same_type and not identity and type(obj).__eq__ is object.__eq__
        if not (obj is td.obj or by_type or (same_type and obj == td.obj)):
            raise BindingError(
                f"static field `{path}` differs from the traced one ({obj!r}): a compiled "
                "step is bound to one state and to the static fields it was traced with")
    elif td.kind in ("tuple", "list"):
        if not isinstance(obj, (tuple, list)) or len(obj) != len(td.children):
            raise BindingError(f"`{path}` differs in structure from the traced one")
        for (name, c), item in zip(td.children, obj, strict=True):
            bind_leaves(c, item, out, f"{path}.{name}", identity)
    else:
        if type(obj) is not type(td.obj):
            raise BindingError(f"`{path}` is a {type(obj).__name__}, traced with "
                               f"{type(td.obj).__name__}")
        for name, c in td.children:
            bind_leaves(c, getattr(obj, name), out, f"{path}.{name}", identity)


def leaves_of(plan: CapturePlan, args: Sequence[Any],
              known: dict[int, list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
    """Every tensor leaf of `args`; `known` gives the leaves of some arguments (bound ones),
    so that a step does not walk a large parameter tree on every call."""
    out: list[torch.Tensor] = []
    for i, (name, td, arg) in enumerate(zip(plan.signature.arg_names, plan.signature.treedefs,
                                            args, strict=True)):
        if known is not None and i in known:
            out += known[i]
        else:
            bind_leaves(td, arg, out, name)
    return out


def _value(node_or_value: Any) -> Any:
    if isinstance(node_or_value, fx.Node):
        return node_or_value.meta.get("val")
    return node_or_value


def plan_capture(
    fn: Callable[..., Any],
    *example_args: Any,
    dims: Mapping[str, Any] | None = None,
    max_sizes: Mapping[str, int] | None = None,
    policies: Mapping[str, "BucketPolicy | str"] | None = None,
    splitting_ops: "Mapping[str, SupportFn | None] | list[str] | None" = None,
    piecewise_dim: str | None = None,
    full_dim: str | None = None,
    meta: Mapping[str, Any] | None = None,
    out_variants: Mapping[str, OutFn] | None = None,
) -> CapturePlan:
    """Plan the capture of `fn(*example_args)` (no GPU needed; raises `CaptureError`).

    dims: the dim vocabulary (name -> object with kind, max_size, policy); default: the
      package's table, `mla_func.dims.VOCABULARY` (the plain public call passes none). The
      compiler holds no names of its own. max_sizes / policies override the dynamic dims'
      entries.
    splitting_ops: op names ("ns::name") -> a function from the op's call arguments to its
      graph-support level (0 never .. 3 always), or None; default: every custom op that mutates
      an argument, support unknown (never).
    piecewise_dim / full_dim: the dims whose buckets key piecewise and full graphs (default: the
      dynamic dims with the largest / smallest max size).
    out_variants: op names -> a function that runs the op into a given buffer (`OutFn`): in
      piecewise replay the op then writes straight into the next segment's static input, where
      its result would otherwise be copied. Only for ops with one tensor output.
    """
    if dims is None:
        from mla_func.dims import VOCABULARY as dims
    sig = analyze(fn, example_args, dims, max_sizes)
    if not sig.dynamic:
        raise CaptureError("no dynamic dims in the signature: nothing to bucket")
    traced = trace(pure(fn), sig, example_args)  # donation is enforced around the graphs
    if splitting_ops is None:
        splitting_ops = dict.fromkeys(default_splitting_ops(traced.gm))
    elif not isinstance(splitting_ops, Mapping):
        splitting_ops = dict.fromkeys(splitting_ops)
    segments, ops = split_graph(traced.gm, splitting_ops)
    absent = sorted(set(splitting_ops) - {op.name for op in ops})
    if absent:  # a misspelt name would leave the op inside the graphs
        names = {op_base_name(n.target) for n in traced.gm.graph.nodes
                 if n.op == "call_function"}
        present = sorted(n for n in names if n and not n.startswith(("aten::", "prims::")))
        raise CaptureError(f"splitting ops {absent} do not occur in the traced function "
                           f"(its custom ops: {present})")
    validate(traced.gm, sig, segments)
    support: list[int | None] = []
    for op in ops:
        fn_support = splitting_ops.get(op.name)
        args = tuple(_value(a) for a in op.node.args)
        support.append(None if fn_support is None else int(fn_support(args)))
    out_variants = dict(out_variants or {})
    unknown = sorted(set(out_variants) - set(splitting_ops))
    if unknown:
        raise CaptureError(f"out variants given for {unknown}, which are not splitting ops")
    out_fns: list[OutFn | None] = []
    for op in ops:
        fn_out = out_variants.get(op.name)
        if fn_out is not None and (op.outputs != [op.node]
                                   or not isinstance(op.node.meta.get("val"), torch.Tensor)):
            raise CaptureError(f"splitting op {op.name} has an out variant but does not return "
                               "one tensor")
        out_fns.append(fn_out)
    dyn = sorted(sig.dynamic, key=lambda n: (-sig.dims[n].max_size, n))
    mode_dims = {"piecewise": piecewise_dim or dyn[0], "full": full_dim or dyn[-1]}
    policies = dict(policies or {})
    buckets, used = {}, {}
    for mode, name in mode_dims.items():
        if name not in sig.dims or sig.dims[name].kind != "dynamic":
            raise CaptureError(f"{mode} buckets keyed by {name!r}, which is not a dynamic dim")
        entry = sig.dims[name]
        policy = policies.get(name, entry.policy)
        buckets[mode] = bucket_sizes(entry.max_size, policy)
        used[name] = policy if isinstance(policy, str) or policy is None else policy.name
    keys: dict[str, int] = {}
    distinct = [keys.setdefault(seg.key, len(keys)) for seg in segments]
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    plan = CapturePlan(name, sig, traced, segments, ops, support, buckets, mode_dims,
                       distinct, dict(meta or {}), out_fns=out_fns,
                       policies={k: v or "bounded" for k, v in used.items()})
    for mode, sizes in buckets.items():
        for size in sizes:
            at = sizes_at(plan, size)
            failed = traced.failing_at(at)
            if failed:
                raise CaptureError(f"the traced code assumes {failed[0]}, which fails at the "
                                   f"{mode} bucket {size} (dims {at}): that graph would be "
                                   "wrong")
    return plan
