"""The project's custom ops: one opaque node for tracers, a plain function call when run eagerly.

`torch.library.custom_op` keeps a kernel launch one node in a traced graph (the capture
compiler's `make_fx`, dynamo), with its fake implementation for shapes. An eager call through it
walks the dispatcher in Python (the autograd key, a redispatch, the aliasing check, dynamo's
disable wrapper) before the function runs: on an H100 host 72-93 us a call of one small rmsnorm
against 55-58 us for its function alone, and an eager V2-Lite step makes ~136 such calls
(docs/DECISIONS.md, `KernelOptions.eager_direct`).

`custom_op` registers the op as torch does and returns an `EagerOp`: called with real tensors while
nothing traces, it runs the function itself (`EagerOp.dispatch` goes through the dispatcher instead:
`KernelOptions.eager_direct` False) (the same kernels, the same results); while a tracer runs (a
torch dispatch or function mode is active, dynamo is compiling, or a tensor argument is fake or on
`meta`) it calls the registered op. The dispatcher's side effects are skipped on the direct path: no
autograd (these ops have no backward; the model runs without gradients) and no version-counter bump
of the tensors a mutating op writes. The wrapper's frame is marked `__tracebackhide__`, so that
plans and capture errors name the line that called the op (`capture.errors.is_hidden`).
"""

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


def _tracing(args: Iterable[Any]) -> bool:
    """Whether a call with `args` is being traced (or faked), not run."""
    # Dynamo first: it folds `is_compiling()` to True, and cannot trace the mode-stack
    # queries below (each would break the graph at every op call).
    if torch.compiler.is_compiling():
        return True
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return True
    for a in args:
        if isinstance(a, Tensor):
            # Fake and functional tensors are subclasses; planning runs on `meta`.
            if type(a) is not Tensor or a.is_meta:
                return True
    return False


class EagerOp:
    """A registered custom op (`op`, what tracers record) and its Python function (`fn`, what
    an eager call runs)."""

    def __init__(self, op: Any, fn: Callable[..., Any]) -> None:
        self.op, self.fn = op, fn
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def register_fake(self, fake: Callable[..., Any]) -> Callable[..., Any]:
        return self.op.register_fake(fake)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (plans and errors name the caller's line)
        if not _tracing((*args, *kwargs.values())):
            return self.fn(*args, **kwargs)
        return self.op(*args, **kwargs)

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """The call through torch's dispatcher, traced or not."""
        __tracebackhide__ = True  # noqa: F841
        return self.op(*args, **kwargs)


def custom_op(name: str, *, mutates_args: tuple[str, ...] | str
              ) -> Callable[[Callable[..., Any]], EagerOp]:
    """`torch.library.custom_op(name, mutates_args=...)` as a decorator, returning an
    `EagerOp`."""

    def wrap(fn: Callable[..., Any]) -> EagerOp:
        return EagerOp(torch.library.custom_op(name, mutates_args=mutates_args)(fn), fn)

    return wrap
