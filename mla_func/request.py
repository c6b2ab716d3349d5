"""A request's progress through the engine, and the record of a launched step.

`Request` is what `Engine.result` returns; `Launched` is the engine's handle on the one step it
keeps in flight (see `mla_func.engine`: the host reads a step's tokens after launching the next).
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(eq=False)
class Request:
    """One request's progress; `Engine.result(rid)` returns it."""

    rid: int
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logits: list[Tensor] = field(default_factory=list)
    cached: int = 0  # tokens written to the cache so far (or by a launched step)
    status: str = "waiting"
    in_flight: int = 0  # tokens that launched steps generate and the host has not read yet

    @property
    def need(self) -> int:  # cached tokens at the end: the last generated one is never fed
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def decoding(self) -> bool:
        return self.cached >= len(self.prompt)

    def pending(self) -> list[int]:
        """Tokens to feed next: a prompt's rest, or the last generated token (IN_FLIGHT while
        the step that generates it has not been read back)."""
        if not self.decoding:
            return self.prompt[self.cached:]
        i = self.cached - len(self.prompt)
        return self.tokens[i:] if i < len(self.tokens) else [IN_FLIGHT]


# The token id of a decode row whose input is still on the device (patched in before the step).
IN_FLIGHT = 0


@dataclass(frozen=True)
class Launched:
    """A step on its way: which request gets a token from which row, and the argmax."""

    rows: dict[int, int]  # request id -> row, for the requests this step generates for
    next_ids: Tensor  # [seqs] on the device
    host_ids: Tensor  # its copy on the host, complete once `done` has fired
    done: "torch.cuda.Event | None"
    logits: Tensor | None  # [seqs, vocab] float32 (return_logits only)
