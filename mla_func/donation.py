"""Donation: an argument a function consumes (JAX's buffer donation), declared in its signature
and enforced per call on the host.

`Annotated[T, Donated]` marks a parameter whose buffers the function writes in place and
returns: the caller must go on with the object the call returned, never the one it passed
(that handle would address buffers a later step has written since, or that a compiled
step's graphs alias). `donating(fn)` enforces it: a call with a consumed object raises
`ConsumedError`; a call that returns marks the object it was passed consumed and hands back a
new handle of the same buffers in its place (a flag on the object and a shallow copy of it:
no device work, no sync). A call that raises consumes nothing (the errors a caller can fix are
raised before any write). Compilers trace the function itself (`pure`) and enforce donation
around their own calls (`mla_func.capture`), with `check_live` and `hand_over`.

Generic: nothing here knows which objects are donated; a leaf of the package's imports.
"""

import copy
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

T = TypeVar("T")
_CONSUMED = "_donation_consumed"


class Donated:
    """The marker: `Annotated[T, Donated]` declares a parameter donated."""


class ConsumedError(RuntimeError):
    """An object was passed again after a call consumed it."""


def is_donated(annotation: Any) -> bool:
    """Whether an annotation (with its `Annotated` extras) declares donation."""
    if typing.get_origin(annotation) is Annotated:
        return any(m is Donated or isinstance(m, Donated) for m in annotation.__metadata__)
    return False


def donated_params(fn: Callable[..., Any]) -> tuple[int, ...]:
    """The positions of `fn`'s parameters annotated `Annotated[..., Donated]`."""
    fn = pure(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    names = list(inspect.signature(fn).parameters)
    return tuple(i for i, name in enumerate(names) if is_donated(hints.get(name)))


def pure(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a `donating` wrapper calls (`fn` itself otherwise)."""
    return getattr(fn, "__donating__", fn)


def check_live(obj: Any, what: str) -> None:
    """`ConsumedError` if a call consumed `obj` (one attribute lookup: dynamo guards on it)."""
    if getattr(obj, _CONSUMED, False):
        raise ConsumedError(
            f"`{what}` was consumed by an earlier call (it is donated: that call wrote its "
            "buffers in place); pass the one that call returned")


def hand_over(obj: T) -> T:
    """Mark `obj` consumed; a new handle of the same buffers (a shallow copy) in its place."""
    if not hasattr(obj, "__dict__"):
        raise TypeError(f"a donated {type(obj).__name__} takes no attributes: donate an object "
                        "that does (a dataclass)")
    if hasattr(obj, "__copy__"):
        new = copy.copy(obj)
    else:  # copy.copy's result, without its reduce protocol: a sixth of its host time
        new = type(obj).__new__(type(obj))
        new.__dict__.update(obj.__dict__)
    object.__setattr__(obj, _CONSUMED, True)
    return new


def replace(out: Any, old: Any, new: Any) -> Any:
    """`out` with `old` replaced by `new`, where `out` is `old` or holds it at its top level (a
    tuple or list: a function's results)."""
    if out is old:
        return new
    if isinstance(out, (tuple, list)):
        return type(out)(new if o is old else o for o in out)
    return out


def consume(out: Any, donated: Sequence[Any]) -> Any:
    """After a call that returned `out`: each donated object consumed, its new handle in
    `out` in its place."""
    for obj in donated:
        out = replace(out, obj, hand_over(obj))
    return out


def donating(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its donated parameters (`donated_params`) enforced on each call (the module
    docstring); `fn` itself if it declares none."""
    positions = donated_params(fn)
    if not positions:
        return fn
    names = list(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (errors name the caller's line)
        donated = [args[i] if i < len(args) else kwargs[names[i]] for i in positions]
        for i, obj in zip(positions, donated, strict=True):
            check_live(obj, names[i])
        return consume(fn(*args, **kwargs), donated)

    call.__donating__ = fn  # type: ignore[attr-defined]
    return call
