"""Stage 6, dispatch and replay: `CompiledStep(*args) -> output`, per step from host metadata.

Per call: FULL when the mode has full graphs, the caller's predicate says the step has the
shape they were captured for (e.g. uniform single-token decode), and the padded size fits a
bucket; else PIECEWISE when it fits a piecewise bucket; else eager, with identical results
(same function, same kernels, no padding). Every dynamic dim is padded to the bucket size,
capped at its own maximum (`plan.sizes_at`); a dim beyond its maximum runs eagerly. Real rows
come first, padded rows get the fields' "pad" values. Splitting ops run eagerly on the
real rows only; their results go into the next segment's static inputs (written there by the
op's out variant where the plan has one, else copied), whose padded rows keep what an earlier
step left. Host leaves are passed live to the eager splitting ops (full graphs froze the
capture-time values: that is what the graph-support level of the ops vouches for).

A compiled step is bound to the tensors its graphs read by address: the bound arguments
(parameters) and every non-dynamic leaf of the others (e.g. a state's cache, written in place).
Calling it with other such tensors raises `BindingError`. Outputs are copied out of the graph
pool (their memory is reused by the next replay); a splitting op's result that only the
function's output reads (no buffer, no copy) is returned as the op made it.

Donated arguments (`mla_func.donation`) are enforced around every call, whatever runs it: an
argument a call consumed raises `ConsumedError`, and the call hands back a new handle in its
place. The step runs the function itself (`donation.pure`), never a donating wrapper of it.
`run` (benchmarks forcing a kind) leaves donation to its caller.
"""

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from mla_func.capture.buckets import pad_to
from mla_func.capture.capture import Buffers, FullBucket, PiecewiseBucket, narrow_to
from mla_func.capture.errors import BindingError
from mla_func.capture.plan import CapturePlan, bind_leaves, leaves_of, sizes_at
from mla_func.capture.tree import unflatten
from mla_func.donation import check_live, consume, donated_params, pure

MODES = ("eager", "piecewise", "full", "full_and_piecewise")
# `_fill`'s copy plans kept per step (one per bucket and input shapes; cleared when full).
FILL_PLANS_KEPT = 256
# `_real`'s evaluated shapes kept per step (one per graph value and real sizes).
REAL_SHAPES_KEPT = 4096


@dataclass(eq=False)
class CompiledStep:
    fn: Callable[..., Any]
    plan: CapturePlan | None  # None: eager only, nothing traced
    mode: str  # the mode in effect (after any downgrade)
    requested_mode: str
    bound: dict[int, Any]  # argument index -> the bound value (e.g. parameters)
    downgrade: str | None = None  # why `mode` differs from `requested_mode`
    full_when: Callable[..., bool] | None = None
    buffers: Buffers | None = None
    piecewise: dict[int, PiecewiseBucket] = field(default_factory=dict)
    full: dict[int, FullBucket] = field(default_factory=dict)
    bound_ptrs: dict[int, int] = field(default_factory=dict)  # leaf index -> data_ptr
    report: dict[str, Any] = field(default_factory=dict)
    capture_leaves: list[torch.Tensor] = field(default_factory=list)  # the args' leaves
    bound_leaves: dict[int, list[torch.Tensor]] | None = None
    # Per-call host work is GPU idle time for a caller that waits on each step: what depends
    # only on the plan is worked out once (static axes to check), and the copy targets once per
    # bucket and input shapes (`_fill`).
    static_axes: list[tuple[int, int, int]] | None = field(default=None, repr=False)
    fill_plans: dict[tuple, tuple[list[torch.Tensor], list[tuple[torch.Tensor, Any]]]] = field(
        default_factory=dict, repr=False)
    real_shapes: dict[tuple, list[int]] = field(default_factory=dict, repr=False)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("eager", "piecewise", "full"), 0))
    # The donated arguments' positions among all arguments, and the parameters' names.
    donated: tuple[int, ...] = field(default=(), init=False)
    names: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.donated = donated_params(self.fn)
        self.fn = pure(self.fn)
        self.names = list(inspect.signature(self.fn).parameters)

    def __call__(self, *args: Any) -> Any:
        full_args = self._merge(args)
        donated = [full_args[i] for i in self.donated]
        for i, obj in zip(self.donated, donated, strict=True):
            check_live(obj, self.names[i])
        return consume(self._call(full_args), donated)

    def _call(self, full_args: list[Any]) -> Any:
        if self.mode == "eager":
            self.counts["eager"] += 1
            return self.fn(*full_args)
        leaves = self._leaves_of(full_args)
        # Before dispatch: a call that runs eagerly must be bound to the same tensors too (it
        # writes the caller's state, which later graph replays would not see).
        self._check(leaves)
        kind, size = self._choose(full_args, leaves)
        return self._run(kind, size, full_args, leaves)

    def _leaves_of(self, full_args: Sequence[Any]) -> list[torch.Tensor]:
        if self.bound_leaves is None:
            self.bound_leaves = {}
            for i in self.bound:
                sub: list[torch.Tensor] = []
                bind_leaves(self.plan.signature.treedefs[i], self.bound[i], sub, "bound")
                self.bound_leaves[i] = sub
        return leaves_of(self.plan, full_args, self.bound_leaves)

    def _merge(self, args: Sequence[Any]) -> list[Any]:
        it = iter(args)
        n = len(args) + len(self.bound)
        return [self.bound[i] if i in self.bound else next(it) for i in range(n)]

    def choose(self, full_args: Sequence[Any]) -> tuple[str, int]:
        """("full" | "piecewise" | "eager", bucket size) for one call."""
        if self.mode == "eager":
            return "eager", 0
        return self._choose(full_args, self._leaves_of(full_args))

    def _choose(self, full_args: Sequence[Any], leaves: list[torch.Tensor]) -> tuple[str, int]:
        sizes = self.plan.signature.dynamic_sizes(leaves)
        n = max(sizes.values())
        dims = self.plan.signature.dims
        if any(v > (dims[k].max_size or v) for k, v in sizes.items()):
            return "eager", 0  # a dim beyond its own range: no graph holds it

        if self.full and self.full_when is not None and self.full_when(*full_args):
            size = pad_to(n, self.plan.buckets["full"])
            if size in self.full:
                return "full", size
        if self.piecewise:
            size = pad_to(n, self.plan.buckets["piecewise"])
            if size in self.piecewise:
                return "piecewise", size
        return "eager", 0

    def run(self, kind: str, size: int, full_args: Sequence[Any]) -> Any:
        """Run one call as `kind` at bucket `size` (benchmarks force a kind this way)."""
        leaves = [] if kind == "eager" else self._leaves_of(full_args)
        if leaves:
            self._check(leaves)
        return self._run(kind, size, full_args, leaves)

    def _run(self, kind: str, size: int, full_args: Sequence[Any],
             leaves: list[torch.Tensor]) -> Any:
        """One checked call (`_check`) as `kind` at bucket `size`."""
        self.counts[kind] += 1
        if kind == "eager":
            return self.fn(*full_args)
        real = self.plan.signature.dynamic_sizes(leaves)
        # Piecewise graphs read only the leaves segments use (the splitting ops get the live
        # ones); full graphs read them all.
        self._fill(leaves, size, None if kind == "full" else self._segment_leaves())
        fresh: set[fx.Node] = set()
        if kind == "full":
            bucket = self.full[size]
            bucket.graph.replay()
            outs = list(bucket.outputs)
        else:
            outs, fresh = self._replay_piecewise(self.piecewise[size], leaves, real)
        return self._outputs(outs, leaves, real, full_args, fresh)

    def _check(self, leaves: Sequence[torch.Tensor]) -> None:
        """BindingError unless the bound tensors and every static axis are the captured ones."""
        self._check_bound(leaves)
        self._check_static(leaves)

    def _check_bound(self, leaves: Sequence[torch.Tensor]) -> None:
        for i, ptr in self.bound_ptrs.items():
            if leaves[i].data_ptr() != ptr:
                raise BindingError(
                    f"`{self.plan.signature.leaves[i].path}` is not the tensor the graphs were "
                    "captured with: a compiled step is bound to one state (compile again)")

    def _check_static(self, leaves: Sequence[torch.Tensor]) -> None:
        # The bound arguments' leaves are the compiled step's own: check only the caller's.
        if self.static_axes is None:
            self.static_axes = [
                (spec.index, axis, want) for spec in self.plan.signature.leaves
                if spec.arg not in self.bound
                for axis, want in enumerate(spec.shape) if axis not in dict(spec.dynamic)]
        for i, axis, want in self.static_axes:
            got = leaves[i].shape[axis]
            if got != want:
                spec = self.plan.signature.leaves[i]
                raise BindingError(
                    f"`{spec.path}` axis {axis} ({spec.dims[axis]}) is {got}; the graphs "
                    f"were captured with {want}")

    def _segment_leaves(self) -> set[int]:
        cached = self.plan.meta_cache.get("segment_leaves")
        if cached is None:
            index = self.plan.placeholder_index()
            cached = {index[n] for seg in self.plan.segments for n in seg.inputs if n in index}
            self.plan.meta_cache["segment_leaves"] = cached
        return cached

    def _fill(self, leaves: Sequence[torch.Tensor], size: int, only: set[int] | None) -> None:
        """Copy the live leaves into the static buffers at bucket `size` and pad the rest."""
        indices = [i for i in self.buffers.leaves if only is None or i in only]
        key = (size, only is None, *(leaves[i].shape for i in indices))
        fill_plan = self.fill_plans.get(key)
        if fill_plan is None:
            if len(self.fill_plans) >= FILL_PLANS_KEPT:  # token counts vary step to step
                self.fill_plans.clear()
            fill_plan = self.fill_plans[key] = self._fill_plan(leaves, size, indices)
        dsts, pads = fill_plan
        # One launch for all the copies where torch can (a decode step has ~10 small inputs:
        # one copy each cost ~10 us of host time a step).
        torch._foreach_copy_(dsts, [leaves[i] for i in indices])
        for view, value in pads:
            view.fill_(value)

    def _fill_plan(self, leaves: Sequence[torch.Tensor], size: int, indices: list[int]
                   ) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, Any]]]:
        """(the copy targets of leaves `indices`, (padding view, pad value) pairs) at bucket
        `size` for leaves of these shapes: views of the static buffers, which never move."""
        at = sizes_at(self.plan, size)
        dsts, pads = [], []
        for i in indices:
            spec, t, buf = self.plan.signature.leaves[i], leaves[i], self.buffers.leaves[i]
            names = dict(spec.dynamic)
            target = narrow_to(buf, [at[names[a]] if a in names else s
                                     for a, s in enumerate(buf.shape)])
            dsts.append(narrow_to(target, t.shape))
            for axis, name in spec.dynamic:
                n = t.shape[axis]
                if n < at[name]:
                    pads.append((target.narrow(axis, n, at[name] - n), spec.pad or 0))
        return dsts, pads

    def _real(self, node: fx.Node, t: torch.Tensor, real: dict[str, int]) -> torch.Tensor:
        """`t` (node's value at a bucket size) narrowed to its size at the `real` sizes."""
        key = (node, *real.values())  # the dims in signature order: a fixed key layout
        shape = self.real_shapes.get(key)
        if shape is None:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                return t
            if len(self.real_shapes) >= REAL_SHAPES_KEPT:
                self.real_shapes.clear()
            # A sympy substitution per value: a third of a decode step's `_outputs` host time
            # (CPU, 27 layers of the tiny preset, 2026-11-24).
            shape = self.real_shapes[key] = [self.plan.traced.evaluate(s, real)
                                             for s in val.shape]
        return narrow_to(t, shape)

    def _replay_piecewise(self, bucket: PiecewiseBucket, leaves: Sequence[torch.Tensor],
                          real: dict[str, int]) -> tuple[list[torch.Tensor], set[fx.Node]]:
        """The function's outputs, and which of them are splitting-op results that nothing
        else reads (fresh tensors of the real size, the caller's to keep)."""
        plan = self.plan
        placeholders = plan.placeholder_index()
        op_results: dict[fx.Node, torch.Tensor] = {}
        out_buf = self.buffers.op_out
        fresh: set[fx.Node] = set()

        def value(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            if a in placeholders:
                return leaves[placeholders[a]]
            if a in op_results:
                return op_results[a]
            val = a.meta.get("val")
            if isinstance(val, torch.SymInt):
                return plan.traced.evaluate(val, real)
            if a.op == "get_attr":
                return getattr(plan.traced.gm, a.target)
            return self._real(a, bucket.values[a], real)

        for k, graph in enumerate(bucket.graphs):
            if graph is not None:
                graph.replay()
            if k < len(plan.ops):
                op = plan.ops[k]
                args = fx.node.map_aggregate(op.node.args, value)
                kwargs = fx.node.map_aggregate(op.node.kwargs, value)
                out_fn = plan.out_fns[k] if plan.out_fns else None
                if out_fn is not None and (op.index, 0) in out_buf:  # into the next input
                    dst = self._real(op.node, out_buf[(op.index, 0)], real)
                    out_fn(*args, out=dst, **kwargs)
                    op_results[op.node] = dst
                    continue
                result = op.node.target(*args, **kwargs)
                results = [result] if op.outputs == [op.node] else [result[
                    o.args[1]] for o in op.outputs]
                for j, (node, r) in enumerate(zip(op.outputs, results, strict=True)):
                    op_results[node] = r
                    if (op.index, j) in out_buf:  # else only the function returns it
                        narrow_to(out_buf[(op.index, j)], r.shape).copy_(r)
                        continue
                    fresh.add(node)
        return [value(n) for n in plan.output_node().args[0]], fresh

    def _outputs(self, outs: list[torch.Tensor], leaves: Sequence[torch.Tensor],
                 real: dict[str, int], full_args: Sequence[Any], fresh: set[fx.Node]) -> Any:
        placeholders = self.plan.placeholder_index()
        final = []
        for node, t in zip(self.plan.output_node().args[0], outs, strict=True):
            if node in placeholders:
                final.append(leaves[placeholders[node]])
            elif node in fresh:  # an eager op's own result: no graph pool behind it
                final.append(t)
            else:
                final.append(self._real(node, t, real).clone())
        return unflatten(self.plan.traced.out_treedef, iter(final), tuple(full_args))
