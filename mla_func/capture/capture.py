"""Stage 5, capture (CUDA): piecewise graphs per segment and bucket, full graphs per bucket.

This module owns the static buffers (`allocate`, `Buffers`), the capture of both kinds of
graphs and the buckets they fill (`PiecewiseBucket`, `FullBucket`); it reads the plan and knows
nothing of dispatch, which replays what it captured.

After vLLM's piecewise backend and nano-vllm's runner: static input buffers sized to the largest
bucket (real rows first, padded rows filled with the fields' "pad" values), warm-up then capture
per bucket, largest first, every graph in one shared memory pool, the garbage collector frozen.
Between segments the splitting ops run eagerly, outside the graphs (dispatch.py), on the real
unpadded rows; their outputs land in static buffers the next segment's graph reads: written
there by the op's out variant when the plan has one, else copied.
Segment outputs are kept as weak references (no ownership). Within a bucket, a value's pool
memory goes back to the pool once its last reader has been captured (`release_after`: a
later piece, a splitting op, or the function's output, read after the last piece), and later
pieces reuse it; across buckets, the next bucket's capture reuses all of it. Both are safe
because one step replays one bucket's graphs, in capture order, with each splitting op
between its two pieces.

Full graphs run the whole function (splitting ops included) on example arguments that the
caller builds per bucket (e.g. worst-case decode batches whose padded rows touch only scratch
memory), so they need splitting ops whose graph support allows it.
"""

import gc
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from mla_func.capture.errors import CaptureError
from mla_func.capture.plan import CapturePlan, leaves_of, sizes_at
from mla_func.capture.tree import flatten_output, object_paths, unflatten


def weak_ref(t: torch.Tensor) -> torch.Tensor:
    """A tensor aliasing `t`'s memory without keeping it allocated (vLLM's weak_ref_tensor)."""
    make = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
    if make is None or not t.is_cuda:
        return t
    storage = t.untyped_storage()
    meta = {"nbytes": storage.nbytes(), "data_ptr": storage.data_ptr(), "size": t.shape,
            "stride": t.stride(), "dtype": t.dtype, "device": t.device,
            "storage_offset": t.storage_offset()}
    return make(meta, torch._C._construct_storage_from_data_pointer(
        meta["data_ptr"], meta["device"], meta["nbytes"]))


class EmulatedGraph:
    """CPU stand-in for `torch.cuda.CUDAGraph` (tests of split, padding and dispatch without a
    GPU): "capture" runs the function once and keeps its outputs as the static outputs;
    "replay" runs it again on the same inputs and copies into them."""

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[Any]) -> None:
        self.fn, self.inputs, self.outs = fn, list(inputs), None

    def capture(self) -> Any:
        self.outs = self.fn(*self.inputs)
        return self.outs

    def replay(self) -> None:
        new, _ = flatten_output(self.fn(*self.inputs), {})
        old, _ = flatten_output(self.outs, {})
        for o, n in zip(old, new, strict=True):
            if o is not n:
                o.copy_(n)


def run_captured(fn: Callable[..., Any], inputs: Sequence[Any], pool: Any, warmups: int,
                 emulate: bool) -> tuple[Any, Any]:
    """Warm up, capture `fn(*inputs)` into a graph (or an emulated one); (graph, outputs)."""
    if emulate:
        g = EmulatedGraph(fn, inputs)
        return g, g.capture()
    for _ in range(warmups):
        fn(*inputs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        outs = fn(*inputs)
    return g, outs


@contextmanager
def frozen_gc():
    """No collection during capture: freeing a captured tensor mid-capture is a use-after-free
    at replay, and collections slow capture down (vLLM does the same)."""
    gc.collect()
    gc.freeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


class Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled, self.done = total, label, enabled, 0
        self.start = self.shown = time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.enabled and (now - self.shown > 0.25 or self.done == self.total):
            self.shown = now
            secs = now - self.start
            sys.stderr.write(f"\r{self.label}: {self.done}/{self.total} {what} ({secs:.1f} s)  ")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass(eq=False)
class Buffers:
    """Static device buffers: one per dynamic leaf (at the largest bucket), one per splitting
    op output (shared between ops whose lifetimes do not overlap)."""

    leaves: dict[int, torch.Tensor] = field(default_factory=dict)
    op_out: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


def narrow_to(t: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    for axis, n in enumerate(sizes):
        if t.shape[axis] != n:
            t = t.narrow(axis, 0, n)
    return t


def shape_at(plan: CapturePlan, val: Any, size: "int | dict[str, int]") -> list[int]:
    sizes = size if isinstance(size, dict) else sizes_at(plan, size)
    return [plan.traced.evaluate(s, sizes) for s in val.shape]


def allocate(plan: CapturePlan, leaves: Sequence[torch.Tensor], top: int) -> Buffers:
    buf = Buffers()
    for spec, t in zip(plan.signature.leaves, leaves, strict=True):
        if spec.dynamic and not spec.host:
            shape = list(spec.shape)
            for axis, name in spec.dynamic:
                shape[axis] = sizes_at(plan, top)[name]
            b = torch.empty(shape, dtype=spec.dtype, device=t.device)
            b.fill_(spec.pad if spec.pad is not None else 0)
            buf.leaves[spec.index] = b
    device = next(t.device for s, t in zip(plan.signature.leaves, leaves, strict=True)
                  if not s.host)
    # Splitting-op outputs: a buffer is free again after its last reader (a later segment, or
    # a later op straight: given an out variant, an op must not write into the buffer it
    # reads); never, if the function also returns it (dispatch hands out the buffer).
    free: list[tuple[int, torch.Tensor]] = []  # (free from segment index, buffer)
    readers, returned = last_readers(plan), set(plan.output_node().all_input_nodes)
    for op in plan.ops:
        for j, node in enumerate(op.outputs):
            val = node.meta["val"]
            if node not in readers:  # only the function's output: dispatch returns the result
                continue
            last = len(plan.segments) if node in returned else readers[node]
            shape = shape_at(plan, val, top)
            reuse = next((f for f in free if f[0] <= op.index and list(f[1].shape) == shape
                          and f[1].dtype == val.dtype), None)
            if reuse is not None:
                free.remove(reuse)
                b = reuse[1]
            else:
                b = torch.zeros(shape, dtype=val.dtype, device=device)
            buf.op_out[(op.index, j)] = b
            free.append((last + 1, b))
    return buf


@dataclass(eq=False)
class PiecewiseBucket:
    graphs: list[Any]  # torch.cuda.CUDAGraph (or EmulatedGraph); None: an empty segment
    # Tensors that dispatch reads after replay: op inputs and the function's outputs.
    values: dict[fx.Node, torch.Tensor]


@dataclass(eq=False)
class FullBucket:
    graph: Any  # torch.cuda.CUDAGraph (or EmulatedGraph)
    outputs: list[torch.Tensor]
    host: dict[int, torch.Tensor]  # host leaves frozen at capture (kept alive)


def segment_inputs(plan: CapturePlan, seg_index: int, size: int, leaves: Sequence[torch.Tensor],
                   buf: Buffers, produced: dict[fx.Node, Any]) -> list[Any]:
    """The tensors a segment's graph reads at bucket `size`."""
    seg = plan.segments[seg_index]
    placeholders = plan.placeholder_index()
    out: list[Any] = []
    for n in seg.inputs:
        val = n.meta.get("val")
        if n in placeholders:
            i = placeholders[n]
            t = buf.leaves.get(i)
            out.append(leaves[i] if t is None else narrow_to(t, shape_at(plan, val, size)))
        elif n.op == "get_attr":
            out.append(getattr(plan.traced.gm, n.target))
        elif isinstance(val, torch.SymInt):
            out.append(plan.traced.evaluate(val, sizes_at(plan, size)))
        elif n in produced:
            out.append(produced[n])
        else:
            op, j = next((op, op.outputs.index(n)) for op in plan.ops if n in op.outputs)
            out.append(narrow_to(buf.op_out[(op.index, j)], shape_at(plan, val, size)))
    return out


def last_readers(plan: CapturePlan) -> dict[fx.Node, int]:
    """Per value that pieces or splitting ops read: the index of the last piece after which
    none of them reads it any more (op k runs after piece k, before piece k+1)."""
    last = {n: seg.index for seg in plan.segments for n in seg.inputs}
    for op in plan.ops:
        for n in op.node.all_input_nodes:
            last[n] = max(last.get(n, -1), op.index)
    return {n: i for n, i in last.items() if n.op not in ("placeholder", "get_attr")}


def release_after(plan: CapturePlan) -> dict[fx.Node, int]:
    """Per value a piece produces: the index of the last piece after which nothing reads it
    any more, so that later pieces may reuse its pool memory: `last_readers`, and what the
    function returns, read after the last piece (never released within a bucket)."""
    last = last_readers(plan)
    for n in plan.output_node().all_input_nodes:
        if n.op not in ("placeholder", "get_attr"):
            last[n] = len(plan.segments)
    return last


def capture_piecewise(plan: CapturePlan, leaves: Sequence[torch.Tensor], buf: Buffers,
                      pool: Any, sizes: Sequence[int], warmups: int, progress: Progress,
                      emulate: bool = False,
                      runners: Sequence[Callable[..., Any]] | None = None
                      ) -> dict[int, PiecewiseBucket]:
    """`runners`: what runs each segment (`segments.segment_runners`; default its module)."""
    needed = {a for op in plan.ops for a in op.node.all_input_nodes}
    needed |= set(plan.output_node().all_input_nodes)
    last_read = release_after(plan)
    buckets: dict[int, PiecewiseBucket] = {}
    for size in sorted(sizes, reverse=True):
        produced: dict[fx.Node, Any] = {}
        values: dict[fx.Node, torch.Tensor] = {}
        graphs = []
        for seg in plan.segments:
            if not seg.nodes:  # two splitting ops in a row: an empty graph would only warn
                graphs.append(None)
                progress.step(f"piecewise {plan.mode_dims['piecewise']}={size}")
                continue
            inputs = segment_inputs(plan, seg.index, size, leaves, buf, produced)
            try:
                run = seg.module if runners is None else runners[seg.index]
                g, outs = run_captured(run, inputs, pool, warmups, emulate)
            except Exception as exc:
                raise CaptureError(f"capturing segment {seg.index} (segment_"
                                   f"{plan.distinct[seg.index]:02d}.py) at bucket {size} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            g.replay()  # real values for the next segment's warm-up
            graphs.append(g)
            produced.update(zip(seg.outputs, outs, strict=True))
            # Let go of what no later piece reads: the pool hands that memory to later pieces,
            # which replay only after its readers (this piece's splitting op, the next piece)
            # have run. Dispatch keeps a weak alias (vLLM's weak-ref outputs, per piece).
            for n in [n for n in produced if last_read.get(n, -1) <= seg.index]:
                if n in needed:
                    values[n] = weak_ref(produced[n])
                del produced[n]
            progress.step(f"piecewise {plan.mode_dims['piecewise']}={size}")
        if not emulate:
            torch.cuda.synchronize()
        values.update({n: weak_ref(t) for n, t in produced.items() if n in needed})
        buckets[size] = PiecewiseBucket(graphs, values)
        del produced
    return buckets


def capture_full(plan: CapturePlan, fn: Callable[..., Any], bound: dict[int, Any],
                 leaves: Sequence[torch.Tensor], buf: Buffers, pool: Any,
                 sizes: Sequence[int], example: Callable[[int], tuple], warmups: int,
                 progress: Progress, emulate: bool = False) -> dict[int, FullBucket]:
    """`example(size)` returns the non-bound arguments of a capture-time call at that size."""
    sig = plan.signature
    buckets: dict[int, FullBucket] = {}
    for size in sorted(sizes, reverse=True):
        call = list(example(size))
        args = [bound[i] if i in bound else call.pop(0) for i in range(len(sig.treedefs))]
        ex_leaves = leaves_of(plan, args)
        static: list[Any] = []
        host: dict[int, torch.Tensor] = {}
        for spec, t in zip(sig.leaves, ex_leaves, strict=True):
            if spec.index in buf.leaves:
                room = tuple(buf.leaves[spec.index].shape)
                if len(room) != t.dim() or any(n > m for n, m in zip(t.shape, room, strict=True)):
                    raise ValueError(f"full example for size {size}: `{spec.path}` is "
                                     f"{tuple(t.shape)}, larger than its buffer {room} (the "
                                     f"largest bucket, each dim capped at its own maximum)")
                view = narrow_to(buf.leaves[spec.index], t.shape)
                view.copy_(t)
                static.append(view)
            elif spec.host:
                host[spec.index] = t
                static.append(t)
            else:
                static.append(leaves[spec.index])  # bound by address (params, state)
        it = iter(static)
        built = [unflatten(td, it) for td in sig.treedefs]
        try:
            g, out = run_captured(fn, built, pool, warmups, emulate)
        except Exception as exc:
            raise CaptureError(f"capturing the full graph at bucket {size} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        inputs: dict[int, tuple] = {}
        for i, obj in enumerate(built):
            inputs.update(object_paths(obj, i))
        outs, _ = flatten_output(out, inputs)
        buckets[size] = FullBucket(g, [weak_ref(t) for t in outs], host)
        del out, outs
        progress.step(f"full {plan.mode_dims['full']}={size}")
    return buckets



def dump_graph(step: Any, size: int, path: str) -> str:
    """Capture segment 0 (inputs: function leaves only) at bucket `size` once more, with debug
    mode on, and write its CUDA-graph DOT dump (torch.cuda.CUDAGraph.debug_dump) to `path`."""
    inputs = segment_inputs(step.plan, 0, size, step.capture_leaves, step.buffers, {})
    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        step.plan.segments[0].module(*inputs)
    g.debug_dump(path)
    return path
