"""`compile_plan`: a plan + real arguments -> a `CompiledStep` (captures on CUDA).

Modes (vLLM's names): `eager` (no graphs), `piecewise` (segment graphs over the piecewise
buckets, splitting ops eager; each segment as traced, or compiled by Inductor first:
`segments`), `full` (whole-function graphs over the full buckets for the steps
`full_when` accepts, eager otherwise), `full_and_piecewise` (both). Full graphs need every
splitting op to declare at least `full_level` graph support; otherwise the mode is downgraded to
`piecewise` and the reason is warned, logged and kept on the step (`step.downgrade`).
"""

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mla_func.capture.capture import (
    Progress,
    allocate,
    capture_full,
    capture_piecewise,
    frozen_gc,
)
from mla_func.capture.dispatch import MODES, CompiledStep
from mla_func.capture.errors import CudaRequiredError
from mla_func.capture.plan import (
    SUPPORT_NAMES,
    UNIFORM_SINGLE_TOKEN_DECODE,
    CapturePlan,
    leaves_of,
)
from mla_func.capture.segments import segment_runners

log = logging.getLogger("mla_func.capture")


def resolve_mode(plan: CapturePlan, mode: str, full_level: int) -> tuple[str, str | None]:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if mode in ("full", "full_and_piecewise") and plan.full_support < full_level:
        weakest = [op.name for op, s in zip(plan.ops, plan.support, strict=True)
                   if (s or 0) == plan.full_support]
        reason = (f"mode {mode!r} downgraded to 'piecewise': splitting op {weakest[0]} declares "
                  f"graph support {SUPPORT_NAMES[plan.full_support]!r}, full graphs need "
                  f"{SUPPORT_NAMES[full_level]!r}")
        return "piecewise", reason
    return mode, None


def _reserved_without_cache() -> int:
    """Reserved device memory after the caching allocator gave back what nothing holds.
    `torch.cuda.graph` empties the cache on entry, so a plain reserved-bytes difference around
    capture could even be negative; emptying it on both sides leaves the graph pool (and any
    buffer allocated for good during capture)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def compile_plan(
    plan: CapturePlan,
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    mode: str,
    bound: Sequence[int] = (0,),
    full_when: Callable[..., bool] | None = None,
    full_example: Callable[[int], tuple] | None = None,
    full_level: int = UNIFORM_SINGLE_TOKEN_DECODE,
    warmups: int = 1,
    progress: bool = True,
    emulate: bool = False,
    segments: str = "plain",
) -> CompiledStep:
    """Capture `fn` over `args` (the arguments at `bound` are fixed; the step takes the rest;
    a donating `fn` is captured as the function it wraps, its donation enforced per call).
    full_when(*all_args) -> bool: may this call use a full graph; full_example(size) -> the
    non-bound arguments of a capture-time call whose dynamic dims all equal `size`.
    emulate: run the whole capture/dispatch machinery without CUDA graphs (CPU tests).
    segments: what runs each piecewise segment, "plain" (its traced module) or "inductor"
    (compiled by Inductor before capture: `segments.py`)."""
    effective, downgrade = resolve_mode(plan, mode, full_level)
    runners = segment_runners(plan, segments)  # refuses an unknown kind before any work
    step = CompiledStep(fn, plan, effective, mode, {i: args[i] for i in bound},
                        downgrade=downgrade, full_when=full_when)
    if mode == "eager":
        return step
    if not emulate and not torch.cuda.is_available():
        raise CudaRequiredError(f"mode {mode!r} captures CUDA graphs and needs a CUDA device; "
                                "none is available (use mode='eager')")
    leaves = leaves_of(plan, args)
    step.capture_leaves = leaves
    devices = {t.device.type for t, s in zip(leaves, plan.signature.leaves, strict=True)
               if not s.host}
    if not emulate and devices != {"cuda"}:
        raise CudaRequiredError(f"mode {mode!r} needs every non-host tensor on CUDA; found "
                                f"{sorted(devices)}")
    if downgrade:
        warnings.warn(downgrade, stacklevel=2)
        log.warning(downgrade)
    use_full = effective in ("full", "full_and_piecewise")
    use_piecewise = effective in ("piecewise", "full_and_piecewise")
    if use_full and (full_when is None or full_example is None):
        raise ValueError("full graphs need `full_when` and `full_example`")
    sizes = {m: plan.buckets[m] for m, on in (("piecewise", use_piecewise), ("full", use_full))
             if on}
    top = max(max(s) for s in sizes.values())
    bound_leaves = {s.index for s in plan.signature.leaves if s.arg in step.bound}
    step.bound_ptrs = {s.index: leaves[s.index].data_ptr() for s in plan.signature.leaves
                       if not s.dynamic and not s.host and s.index not in bound_leaves}
    sync = (lambda: None) if emulate else torch.cuda.synchronize
    reserved = (lambda: 0) if emulate else _reserved_without_cache
    sync()
    step.buffers = allocate(plan, leaves, top)
    sync()
    before = reserved()
    total = (len(sizes.get("piecewise", ())) * len(plan.segments) + len(sizes.get("full", ())))
    bar = Progress(total, "capturing CUDA graphs", progress)
    start = time.perf_counter()
    pool = None if emulate else torch.cuda.graph_pool_handle()
    with frozen_gc(), torch.no_grad():
        if use_piecewise:
            step.piecewise = capture_piecewise(plan, leaves, step.buffers, pool,
                                               sizes["piecewise"], warmups, bar, emulate,
                                               runners)
        if use_full:
            step.full = capture_full(plan, step.fn, step.bound, leaves, step.buffers, pool,
                                     sizes["full"], full_example, warmups, bar, emulate)
    sync()
    step.report = {
        "mode": effective, "requested_mode": mode, "downgrade": downgrade, "segments": segments,
        "capture_seconds": round(time.perf_counter() - start, 3),
        "graph_pool_bytes": reserved() - before,
        "static_buffer_bytes": sum(b.numel() * b.element_size() for b in
                                   [*step.buffers.leaves.values(),
                                    *{id(b): b for b in step.buffers.op_out.values()}.values()]),
        "graphs": total, "buckets": {m: list(s) for m, s in sizes.items()},
    }
    log.info("captured %d graphs in %.1f s", total, step.report["capture_seconds"])
    return step
