"""Typed-shape check of one mixed step of the model on the `meta` device: seconds, no memory.

In this (fresh) process it installs jaxtyping's import hook with beartype for `mla_func` before
the package is imported, builds params, state and a mixed batch (decodes, a second prefill chunk
and a fresh prompt) on `meta`, runs `forward` once, and lists every function and dataclass
`__init__` the checker ran, with call counts. The attention op has a fake implementation, so meta
tensors pass through it. A disagreement exits 1 naming the function, the dimension and both
sizes. `--break DIM` first grows axis DIM of one input tensor by one, to show that failure.

References: jaxtyping's import hook and `jaxtyped(typechecker=beartype)` (docs.kidger.site).

Usage: python scripts/check_shapes.py --preset v2-lite [v3 ...] [--break qk_rope]
"""

import argparse
import dataclasses
import resource
import sys
import time
import traceback
import types
import typing

import jaxtyping

# Decode sequences with these cached lengths, then a second chunk and a fresh prompt.
DECODE_CACHED = (17, 5, 40)
CHUNK_START, CHUNK_LEN, FRESH_LEN, PAGE_SIZE = 16, 32, 9, 16


def wrapper_code() -> types.CodeType:
    """The code object every `jaxtyped(typechecker=...)` wrapper shares."""
    from beartype import beartype

    def probe(x: int) -> int:
        return x

    return jaxtyping.jaxtyped(probe, typechecker=beartype).__code__


def is_shape_typed(fn: typing.Callable) -> bool:
    hints = getattr(fn, "__annotations__", {}).values()
    return any("jaxtyping" in repr(h) for h in hints)


class CallCounter:
    """Counts calls that go through the checker (sys.setprofile sees every wrapper call)."""

    def __init__(self) -> None:
        self.code = wrapper_code()
        self.calls: dict[str, list] = {}

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is self.code:
            fn = frame.f_locals.get("fn")
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
            self.calls.setdefault(name, [0, is_shape_typed(fn)])[0] += 1

    def __enter__(self) -> "CallCounter":
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def axis_names(arr: type, shape: tuple[int, ...]) -> list[tuple[str, int, int]] | str:
    """(name, axis, size) for each named axis; a string when the rank cannot match."""
    from jaxtyping._array_types import _NamedDim, _NamedVariadicDim

    dims = list(arr.dims)
    var = [i for i, d in enumerate(dims) if "Variadic" in type(d).__name__]
    if not var and len(dims) != len(shape):
        return f"has {len(shape)} axes {tuple(shape)}, the annotation {arr.dim_str!r} {len(dims)}"
    cut = var[0] if var else len(dims)
    head, tail = dims[:cut], dims[cut + 1:]
    placed = list(zip(range(len(head)), head, strict=True))
    placed += [(len(shape) - len(tail) + i, d) for i, d in enumerate(tail)]
    return [(d.name, axis, shape[axis]) for axis, d in placed
            if isinstance(d, _NamedDim) and not isinstance(d, _NamedVariadicDim)
            and 0 <= axis < len(shape)]


def tensor_leaves(value: object, hint: object, where: str):
    """(where, tensor, array annotation) for the tensors in `value` under annotation `hint`."""
    from torch import Tensor

    if isinstance(hint, type) and issubclass(hint, jaxtyping.AbstractArray):
        if isinstance(value, Tensor):
            yield where, value, hint
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            found = list(tensor_leaves(value, arg, where))
            dtype = str(getattr(value, "dtype", "")).split(".")[-1]
            if found and dtype in getattr(arg, "dtypes", (dtype,)):
                yield from found
                return
    elif origin is tuple and isinstance(value, tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        for i, (v, h) in enumerate(zip(value, args, strict=False)):
            yield from tensor_leaves(v, h, f"{where}[{i}]")


def explain(fn: typing.Callable, arguments: dict, out: object = None, has_out: bool = False
            ) -> str | None:
    """Re-bind the dimension names of one checked call and name the first disagreement."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = dict(getattr(fn, "__annotations__", {}))
    items = [(f"`{k}`", v, hints[k]) for k, v in arguments.items() if k in hints]
    if has_out and "return" in hints:
        items.append(("the return value", out, hints["return"]))
    bound: dict[str, tuple[int, str]] = {}
    for name, value, hint in items:
        for where, tensor, arr in tensor_leaves(value, hint, name):
            named = axis_names(arr, tuple(tensor.shape))
            if isinstance(named, str):
                return f"{where} {named}"
            for dim, axis, size in named:
                if dim in bound and bound[dim][0] != size:
                    first_size, first_where = bound[dim]
                    return (f"dimension '{dim}': {where} axis {axis} has size {size}, but "
                            f"{first_where} bound {dim}={first_size}")
                bound.setdefault(dim, (size, f"{where} axis {axis}"))
    return None


def diagnose(err: BaseException) -> str:
    """The failing checked call (the innermost jaxtyping frame) and its disagreement."""
    frames = [f for f, _ in traceback.walk_tb(err.__traceback__)
              if f.f_code.co_name == "wrapped_fn_impl" and "jaxtyping" in f.f_code.co_filename]
    head = str(err).splitlines()[0] if str(err) else type(err).__name__
    if not frames:
        return head
    local = frames[-1].f_locals
    fn, bound = local.get("fn"), local.get("bound")
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    why = explain(fn, dict(bound.arguments) if bound else {}, local.get("out"), "out" in local)
    return f"{name}: {why}" if why else f"{name}: {head}"


def grow_axis(obj: object, dim: str, path: str):
    """(new obj, leaf path, old size) with axis `dim` of the first tensor leaf that has it grown
    by one; dataclasses are rebuilt with `replace`, so their checked __init__ runs."""
    import torch

    if isinstance(obj, tuple):
        for i, item in enumerate(obj):
            hit = grow_axis(item, dim, f"{path}[{i}]")
            if hit:
                return (obj[:i] + (hit[0],) + obj[i + 1:], *hit[1:])
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return None
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, where = getattr(obj, f.name), f"{path}.{f.name}"
        if isinstance(value, torch.Tensor):
            arr = next((a for _, _, a in tensor_leaves(value, hints[f.name], where)), None)
            named = axis_names(arr, tuple(value.shape)) if arr is not None else []
            axis = None if isinstance(named, str) else next(
                (a for n, a, _ in named if n == dim), None)
            if axis is None or value.device.type != "meta":
                continue
            shape = list(value.shape)
            shape[axis] += 1
            new = torch.empty(shape, dtype=value.dtype, device=value.device)
            return dataclasses.replace(obj, **{f.name: new}), where, value.shape[axis]
        hit = grow_axis(value, dim, where)
        if hit:
            return (dataclasses.replace(obj, **{f.name: hit[0]}), *hit[1:])
    return None


def mixed_step(preset: str, break_dim: str | None) -> int:
    import torch

    import mla_func as mf

    cfg = mf.MLAConfig.preset(preset)
    params = mf.init_params(cfg, device="meta")
    state = mf.init_state(cfg, num_pages=64, page_size=PAGE_SIZE, device="meta")
    alloc, work = state.allocator, []
    for cached in DECODE_CACHED:
        work.append(mf.SeqWork([1], cached, alloc.reserve(len(work), cached + 1)))
    chunk = list(range(2, 2 + CHUNK_LEN))
    work.append(mf.SeqWork(chunk, CHUNK_START, alloc.reserve(len(work), CHUNK_START + CHUNK_LEN)))
    work.append(mf.SeqWork(list(range(2, 2 + FRESH_LEN)), 0, alloc.reserve(len(work), FRESH_LEN)))
    max_pages = max(len(p) for p in alloc.pages.values())
    batch = mf.make_batch(work, PAGE_SIZE, max_pages, device="meta")
    print(f"preset {preset}: mixed step of {batch.num_tokens} tokens, {batch.num_seqs} seqs "
          f"({batch.num_decodes} decodes, a {CHUNK_LEN}-token chunk after {CHUNK_START} cached, "
          f"a {FRESH_LEN}-token prompt), page_size {PAGE_SIZE}, on meta")
    if break_dim:
        inputs = {"batch": batch, "state": state, "params": params}
        hit = None
        for key, value in inputs.items():
            hit = grow_axis(value, break_dim, key)
            if hit:
                inputs[key] = hit[0]
                print(f"--break {break_dim}: {hit[1]} axis {break_dim} grown "
                      f"{hit[2]} -> {hit[2] + 1}")
                break
        if hit is None:
            print(f"--break {break_dim}: no meta input tensor has an axis named {break_dim!r}")
            return 2
        batch, state, params = inputs["batch"], inputs["state"], inputs["params"]
    logits, _ = mf.forward(params, state, batch)
    assert logits.device == torch.device("meta")
    assert tuple(logits.shape) == (batch.num_seqs, cfg.vocab_size), logits.shape
    return 0


def check(preset: str, break_dim: str | None = None) -> int:
    """Run and report one preset's mixed step; mla_func must be imported under the hook.
    Returns the exit code: 0 passed, 1 a check failed, 2/3 `--break` found nothing to break /
    broke something no check noticed."""
    start = time.perf_counter()
    counter = CallCounter()
    try:
        with counter:
            code = mixed_step(preset, break_dim)
    except Exception as err:  # a type-check failure, or an error a check would have caught
        print(f"FAIL {diagnose(err)}")
        return 1
    seconds = time.perf_counter() - start
    if code:
        return code
    width = max(len(n) for n in counter.calls)
    print(f"{'checked function':<{width}}  calls  shapes")
    for name, (calls, shaped) in sorted(counter.calls.items()):
        print(f"{name:<{width}}  {calls:>5}  {'yes' if shaped else 'no'}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = sum(c for c, _ in counter.calls.values())
    print(f"OK {preset}: {len(counter.calls)} functions checked ({total} calls), "
          f"{sum(s for _, s in counter.calls.values())} with tensor shapes; "
          f"{seconds:.1f} s; tensors on meta (no memory); process peak RSS {peak:.0f} MiB")
    if break_dim:
        from mla_func.dims import VOCABULARY

        spec = VOCABULARY.get(break_dim)
        note = (" (a capacity dim: a larger one can be legal)"
                if spec is not None and spec.kind == "capacity" else "")
        print(f"--break {break_dim} was NOT detected by any check{note}")
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["tiny"], choices=("tiny", "v2-lite", "v3"),
                    help="several: one process, one import")
    ap.add_argument("--break", dest="break_dim", metavar="DIM",
                    help="grow axis DIM of one input tensor by one (shows the failure)")
    args = ap.parse_args(argv)
    if "mla_func" in sys.modules:
        raise SystemExit("check_shapes must import mla_func itself: run it in a fresh process")
    jaxtyping.install_import_hook("mla_func", "beartype.beartype")
    return max(check(preset, args.break_dim) for preset in args.preset)


if __name__ == "__main__":
    sys.exit(main())
