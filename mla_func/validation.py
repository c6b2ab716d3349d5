"""Request validation for the engine: the request errors and the checks that raise them.

Everything here runs on the host before the engine changes any state, so a bad request or a bad
argument costs nothing (vLLM's `_validate_model_inputs` and nano-vllm's `add_request` are the
models: reject a prompt the cache or the positions can never hold, and token ids outside the
vocabulary, with a message that names the problem). This module owns:
- the error classes: `RequestError` (a ValueError) and its kinds `TokenIdError`,
  `EmptyPromptError`, `PromptTooLongError`;
- `check_prompt`: a prompt (list, sequence, 1-D integer tensor or numpy array) as a list of
  ints, or one of those errors;
- the argument checks `positive_int`, `check_mode` (known mode; graph modes need CUDA) and
  `seq_limit` (the most tokens one sequence can ever hold, and what sets it).
`mla_func.engine` calls these and re-exports the public names.
"""

from collections.abc import Sequence
from numbers import Integral
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.params import Params

MODES = ("eager", "piecewise", "full", "full_and_piecewise")


class RequestError(ValueError):
    """A request the engine cannot serve; the message names the problem."""


class TokenIdError(RequestError):
    """A token id that is not an int in [0, vocab_size)."""


class EmptyPromptError(RequestError):
    """A prompt with no tokens."""


class PromptTooLongError(RequestError):
    """prompt + max_new_tokens - 1 tokens that the cache or the positions can never hold."""


def positive_int(name: str, value: object, least: int = 1) -> int:
    """`value` if it is an int >= `least` (bools are not), else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        why = " (page 0 is scratch)" if name == "num_pages" else ""
        raise ValueError(f"{name} must be an int >= {least}{why}, got {value!r}")
    return value


def check_mode(mode: str, params: Params) -> None:
    """Raise before any work if `mode` is unknown or needs CUDA that is not there."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {MODES}")
    why = None
    if mode != "eager" and not torch.cuda.is_available():
        why = f"CUDA is not available on this machine (torch {torch.__version__})"
    elif mode != "eager" and params.device.type != "cuda":
        why = f"the parameters are on {params.device}"
    if why:
        from mla_func.capture.errors import CudaRequiredError  # the compiler's own error

        raise CudaRequiredError(f"mode {mode!r} replays CUDA graphs, but {why}; "
                                "use mode='eager' or CUDA parameters")


def seq_limit(cfg: MLAConfig, num_pages: int | None, page_size: int) -> tuple[int, str]:
    """The most tokens one sequence can ever hold, and what sets it."""
    limit = (cfg.max_position_embeddings, f"max_position_embeddings={cfg.max_position_embeddings}")
    if num_pages is not None:
        cap = (positive_int("num_pages", num_pages, 2) - 1) * page_size
        if cap < limit[0]:
            limit = (cap, f"a cache of {num_pages} pages of {page_size} (page 0 is scratch)")
    return limit


@runtime_checkable
class IntArray(Protocol):
    """A numpy-like array, as check_prompt reads one (numpy itself stays optional)."""

    ndim: int
    shape: tuple
    dtype: object

    def tolist(self) -> list: ...


# Prompts are typed loosely on purpose: check_prompt's errors name a bad token id; a type
# checker would only sample one element and fail with a less useful message.
Prompt = Sequence[object] | Tensor | IntArray


def check_prompt(
    prompt: Prompt, max_new_tokens: int, vocab_size: int, max_len: int, limit: str = "the limit"
) -> list[int]:
    """The prompt as a list of ints, or a RequestError naming what is wrong with it."""
    if isinstance(prompt, (Tensor, IntArray)):  # a torch tensor or a numpy array
        kind = "tensor" if isinstance(prompt, Tensor) else "array"
        integer = (not prompt.is_floating_point() and prompt.dtype != torch.bool
                   if kind == "tensor" else getattr(prompt.dtype, "kind", "") in ("i", "u"))
        if prompt.ndim != 1 or not integer:
            raise TokenIdError(f"a prompt {kind} must be 1-D integer, got {prompt.dtype} "
                               f"{tuple(prompt.shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
        raise TokenIdError(f"a prompt must be a sequence of token ids, got {type(prompt)}")
    ids = [int(t) if isinstance(t, Integral) and not isinstance(t, bool) else t
           for t in prompt]
    if not ids:
        raise EmptyPromptError("empty prompt: a prompt needs at least one token")
    typed = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if typed:
        raise TokenIdError(f"token ids must be ints; got {typed[0]!r} "
                           f"({type(typed[0]).__name__})")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise TokenIdError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    need = len(ids) + max_new_tokens - 1
    if need > max_len:
        raise PromptTooLongError(
            f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} needs {need} cache "
            f"positions; {limit} allows at most {max_len}")
    return ids
