"""Errors of the capture compiler, and where in the user's code they come from.

Every graph-unsafe construct is reported at plan time, with the op and the user's source line:
the failure modes vLLM, SGLang and FastDeploy users meet as wrong output under graphs are
turned into an exception that names the line to change.
"""

import os
import traceback
from collections.abc import Iterable
from types import FrameType

# Frames from these directories are machinery, never "the user's line".
_MACHINERY = (
    f"{os.sep}torch{os.sep}", f"{os.sep}jaxtyping{os.sep}", f"{os.sep}beartype{os.sep}",
    f"{os.sep}typing.py", f"{os.sep}functools.py", f"{os.sep}contextlib.py",
    f"mla_func{os.sep}capture{os.sep}", "<@beartype", "<frozen ",
)


class CaptureError(ValueError):
    """Code that cannot be captured into a static graph; names the op and the source line."""

    def __init__(self, message: str, op: str | None = None, where: str | None = None) -> None:
        self.op, self.where = op, where
        parts = [message]
        if op:
            parts.append(f"op: {op}")
        if where:
            parts.append(f"at {where}")
        super().__init__("; ".join(parts))


class SignatureError(CaptureError):
    """Annotations that do not describe the arguments (unknown or conflicting dim names)."""


class CudaRequiredError(CaptureError, RuntimeError):
    """A graph mode was asked for on a machine without CUDA."""


class BindingError(CaptureError):
    """A compiled step was called with tensors other than the ones its graphs were bound to."""


def relative_path(filename: str) -> str:
    """`.../site-packages/pkg/x.py` or `/repo/pkg/x.py` -> `pkg/x.py` (stable across machines)."""
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    # Walk up while the directory is a package: the top package's parent is the root.
    path = os.path.abspath(filename)
    root = os.path.dirname(path)
    while os.path.isfile(os.path.join(root, "__init__.py")):
        root = os.path.dirname(root)
    return os.path.relpath(path, root).replace("\\", "/")


def is_user_file(filename: str) -> bool:
    return not any(m in filename for m in _MACHINERY)


def is_hidden(frame: FrameType) -> bool:
    """A frame that declares itself a call wrapper, never the user's line (pytest's
    `__tracebackhide__` convention: a true local of that name)."""
    return bool(frame.f_locals.get("__tracebackhide__", False))


def user_frame(frames: Iterable[traceback.FrameSummary]) -> str | None:
    """The innermost frame of user code: `path:line in function: source`."""
    found = None
    for fr in frames:
        if is_user_file(fr.filename):
            found = fr
    if found is None:
        return None
    code = f": {found.line.strip()}" if found.line else ""
    return f"{relative_path(found.filename)}:{found.lineno} in {found.name}{code}"


def user_frame_of_exception(exc: BaseException) -> str | None:
    frames = (fl for fl in traceback.walk_tb(exc.__traceback__) if not is_hidden(fl[0]))
    return user_frame(traceback.StackSummary.extract(frames))

