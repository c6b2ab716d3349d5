"""Stage 2, trace: the function to an ATen FX graph on fake tensors, dynamic dims symbolic.

`make_fx(tracing_mode="symbolic")` over fake tensors that we build ourselves: each dynamic dim
name becomes one shape symbol shared by every axis that names it (never duck-sized by
coincidence of example sizes), static dims stay plain ints, and parameters on the `meta`
device plan a large model without its memory. Custom ops with a fake implementation (the
splitting ops) stay one node, mutations in place (no functionalization: the graph writes the
caller's buffers, as eager does).

jaxtyping runtime checks are switched off while tracing (see `no_runtime_checks`).
Data-dependent control flow or host syncs raise during tracing (`GuardOnDataDependentSymNode`):
we turn them into a `CaptureError` with the user's line. A dynamic dim that the code pins to a
constant, or a shape assumption that fails with every dynamic dim at a probe size (here) or at
any bucket's sizes (`Traced.failing_at`, which `plan_capture` asks per bucket), is an error too:
it would be a silent wrong graph (or a recompile) later.
"""

import sys
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.overrides import TorchFunctionMode

from mla_func.capture.errors import (
    CaptureError,
    is_hidden,
    is_user_file,
    user_frame,
    user_frame_of_exception,
)
from mla_func.capture.signature import Signature
from mla_func.capture.tree import TreeDef, flat_call

WRITES_CONSTANT = ("writes a tensor the function closes over or a global one: every warm-up, "
                   "capture and replay would write it again (pass it in as a donated argument, "
                   "or write a copy)")
# Tensor methods that write their tensor (besides the `name_` in-place methods).
_WRITING_DUNDERS = {f"Tensor.__i{op}__" for op in (
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
    "lshift", "rshift")} | {"Tensor.__setitem__"}

_PRIMES = (61, 59, 53, 47, 43, 41, 37, 31, 29, 23, 19, 17, 13, 11, 7, 5, 3, 2)

_HOST_SYNC = {
    "Tensor.item": "`.item()` is a host sync (aten._local_scalar_dense)",
    "Tensor.tolist": "`.tolist()` is a host sync",
    "Tensor.__bool__": "a Python branch on a tensor value",
    "Tensor.__int__": "`int(tensor)` is a host sync",
    "Tensor.__index__": "a tensor used as a Python int is a host sync",
    "Tensor.__float__": "`float(tensor)` is a host sync",
}


@dataclass(frozen=True, eq=False)
class Traced:
    gm: torch.fx.GraphModule
    shape_env: ShapeEnv
    symbols: dict[str, sympy.Symbol]  # dynamic dim name -> its shape symbol
    hints: dict[str, int]
    out_treedef: TreeDef
    assumptions: tuple[str, ...]  # shape guards on dynamic dims, in dim names
    guards: tuple[tuple[str, sympy.Basic], ...] = ()  # (text, expression) of each assumption

    def failing_at(self, sizes: dict[str, int]) -> list[str]:
        """The assumptions that fail with the dynamic dims at `sizes` (a bucket's)."""
        subs = {self.symbols[n]: sympy.Integer(v) for n, v in sizes.items()}
        return [text for text, expr in self.guards if _fails(expr, subs)]

    def evaluate(self, value: Any, sizes: dict[str, int]) -> Any:
        """A SymInt (or int) with the dynamic dims set to `sizes`."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr.xreplace(
                {self.symbols[n]: sympy.Integer(v) for n, v in sizes.items()})
            return int(expr)
        return value


def choose_hints(sig: Signature) -> dict[str, int]:
    """Distinct, non-trivial example sizes per dynamic dim (larger ranges get larger hints).
    A range with no free prime of its own (max 1, or two dims of max 2) is traced at the
    smallest free prime above it: the trace is symbolic either way, and every shape
    assumption it makes is checked at every bucket before anything is captured."""
    hints: dict[str, int] = {}
    order = sorted(sig.dynamic, key=lambda n: (-sig.dims[n].max_size, n))
    used: set[int] = set()
    for name in order:
        top = sig.dims[name].max_size
        hint = next((p for p in _PRIMES if p <= top and p not in used), None)
        if hint is None:
            hint = next(p for p in reversed(_PRIMES) if p not in used)
        hints[name] = hint
        used.add(hint)
    return hints


class _LastCall(TorchFunctionMode):
    """Remembers the last torch function called (to name the op behind a tracing error) and
    tags the graph nodes each call creates with the user's frame (`node.meta["user_frame"]`):
    make_fx's own stack traces keep only frames named `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None
        self.sync: str | None = None  # the last host-sync call (item, __bool__, ...)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
        name = name.replace("TensorBase.", "Tensor.").replace("_VariableFunctionsClass.",
                                                              "torch.")
        if _writes_real_tensor(func, name, args, kwargs or {}):
            # Refused before it runs: tracing runs the ops of real (constant) tensors.
            raise CaptureError(WRITES_CONSTANT, op=name, where=_caller())
        if not name.endswith("__get__"):  # property reads (shape, dtype) name no op
            self.name = name
            if name in _HOST_SYNC:
                self.sync = name
        proxy = get_proxy_mode()
        graph = proxy.tracer.graph if proxy is not None else None
        last = graph._root.prev if graph is not None else None
        out = func(*args, **(kwargs or {}))
        if graph is not None:
            where = _caller()
            node = last.next
            while node is not graph._root:
                node.meta.setdefault("user_frame", where)
                node = node.next
        return out


def _writes_real_tensor(func: Any, name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call writes a real tensor (every argument is fake while tracing: a real one
    is a global or closed-over tensor): an in-place method on it, it as `out=`, or it as an
    argument an op's schema says it writes."""
    from torch._subclasses.fake_tensor import FakeTensor

    def real(t: object) -> bool:
        return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)

    in_place = name.startswith("Tensor.") and (
        (name.endswith("_") and not name.endswith("__")) or name in _WRITING_DUNDERS)
    if (in_place and bool(args) and real(args[0])) or real(kwargs.get("out")):
        return True
    schema = getattr(func, "_schema", None)
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.alias_info is not None and a.alias_info.is_write:
            if real(args[i] if i < len(args) else kwargs.get(a.name)):
                return True
    return False


@contextmanager
def no_runtime_checks():
    """jaxtyping's runtime checks off while tracing: they do not specialise symbolic sizes,
    but their `.shape` reads add `sym_size` nodes wherever the checks run, so a plan would
    depend on whether checks are on (pytest turns them on). The annotations were already read
    by the signature stage."""
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


def _caller() -> str | None:
    frame = sys._getframe(2)
    while frame is not None and (not is_user_file(frame.f_code.co_filename)
                                 or is_hidden(frame)):
        frame = frame.f_back
    if frame is None:
        return None
    return user_frame([traceback.FrameSummary(frame.f_code.co_filename, frame.f_lineno,
                                              frame.f_code.co_name)])


def _data_dependent_errors() -> tuple[type, ...]:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    errors: list[type] = [GuardOnDataDependentSymNode]
    try:
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
        )

        errors += [DataDependentOutputException, DynamicOutputShapeException]
    except ImportError:  # pragma: no cover (older torch)
        pass
    return tuple(errors)


def _fake_leaves(sig: Signature, mode: Any, env: ShapeEnv, hints: dict[str, int]
                 ) -> tuple[list[torch.Tensor], dict[str, sympy.Symbol]]:
    from torch._dynamo.source import ConstantSource

    symints: dict[str, torch.SymInt] = {}
    symbols: dict[str, sympy.Symbol] = {}
    for name in sig.dynamic:
        sym = env.create_symbol(hints[name], ConstantSource(f"dim_{name}"),
                                dynamic_dim=DimDynamic.DYNAMIC)
        symbols[name] = sym
        symints[name] = env.create_symintnode(sym, hint=hints[name])
    fakes = []
    with mode:
        for leaf in sig.leaves:
            dyn = dict(leaf.dynamic)
            if dyn:
                shape = [symints[dyn[a]] if a in dyn else s for a, s in enumerate(leaf.shape)]
                fakes.append(torch.empty(shape, dtype=leaf.dtype, device=leaf.device))
            else:
                fakes.append(torch.empty_strided(leaf.shape, leaf.stride, dtype=leaf.dtype,
                                                 device=leaf.device))
    return fakes, symbols


def _sloc_where(sloc: Any) -> str | None:
    """A ShapeEnv source location (torch 2.11+: SLoc) as `path:line in fn: source`."""
    if sloc is None:
        return None
    for loc in (getattr(sloc, "framework_loc", None), getattr(sloc, "maybe_user_loc", None)):
        if isinstance(loc, traceback.FrameSummary):
            found = user_frame([loc])
            if found:
                return found
    return str(getattr(sloc, "maybe_user_loc", None) or sloc) or None


def _guard_where(guard: Any) -> str | None:
    return _sloc_where(getattr(guard, "sloc", None)) or str(getattr(guard, "stack", "") or "")


def _fails(expr: sympy.Basic, subs: dict) -> bool:
    """Whether a shape guard is false with its symbols replaced by `subs`."""
    value = expr.xreplace(subs)
    return value is sympy.false or (value.is_Boolean and not bool(value))


def _check_specialisation(sig: Signature, env: ShapeEnv, symbols: dict[str, sympy.Symbol],
                          probe_sizes: Sequence[int]) -> list[tuple[str, sympy.Basic]]:
    names = {s: n for n, s in symbols.items()}
    for sym, name in names.items():
        replaced = env.replacements.get(sym)
        if replaced is not None and replaced.is_number:
            where = _sloc_where(getattr(env, "replacements_slocs", {}).get(sym))
            raise CaptureError(f"dynamic dim {name!r} was specialised to {replaced} while "
                               "tracing: the code treats it as a constant", where=where)
    assumptions = []
    for guard in env.guards:
        free = guard.expr.free_symbols & set(names)
        if not free:
            continue
        text = str(guard.expr.xreplace({s: sympy.Symbol(names[s]) for s in free}))
        for size in probe_sizes:
            if _fails(guard.expr, {s: sympy.Integer(size) for s in symbols.values()}):
                pinned = " (pins a dynamic dim to a constant)" if "Eq(" in text else ""
                raise CaptureError(
                    f"the traced code assumes {text}{pinned}, which fails when every dynamic "
                    f"dim is {size} (full buckets pad them all to one size)",
                    where=_guard_where(guard) or None)
        assumptions.append((text, guard.expr))
    return assumptions


def trace(fn: Callable[..., Any], sig: Signature, args: Sequence[Any],
          probe_sizes: Sequence[int] = (1, 2, 3)) -> Traced:
    """Trace `fn(*args)` with tensor leaves replaced by fakes (shapes from `sig`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=False)
    hints = choose_hints(sig)
    fakes, symbols = _fake_leaves(sig, mode, env, hints)
    flat_fn, out_def = flat_call(fn, sig.treedefs, args[len(sig.treedefs):])

    last = _LastCall()
    try:
        with last, no_runtime_checks():
            gm = make_fx(flat_fn, tracing_mode="symbolic")(*fakes)
    except _data_dependent_errors() as exc:
        op = last.sync or last.name
        what = _HOST_SYNC.get(op or "", "a data-dependent shape or value")
        raise CaptureError(f"{what}: a captured graph would freeze its value",
                           op=op, where=user_frame_of_exception(exc)) from exc
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(f"tracing failed: {type(exc).__name__}: {exc}", op=last.name,
                           where=user_frame_of_exception(exc)) from exc
    probes = sorted({*probe_sizes, *(d.max_size for d in sig.dims.values() if d.max_size)})
    guards = _check_specialisation(sig, env, symbols, probes)
    return Traced(gm, env, symbols, hints, out_def[-1],
                  tuple(sorted({text for text, _ in guards})), tuple(guards))
