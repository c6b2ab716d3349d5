"""Greedy generation with continuous batching over the step function.

Iteration-level batching as in Orca (Yu et al., OSDI 2022) over a paged cache (vLLM, Kwon et al.,
SOSP 2023), prefill chunks mixed into decode steps (Sarathi-Serve, Agrawal et al., OSDI 2024);
nano-vllm's scheduler is the model for its size. This module owns the request lifecycle and the
step loop. The step is `model.forward` (mode "eager") or what `compile_step` returns.

Policy, once per step:
1. Admit waiting requests in arrival order while fewer than `max_seqs` run and the allocator can
   reserve the pages of the request's whole life (prompt + max_new_tokens - 1 cached tokens).
   One that does not fit waits, and keeps the ones behind it waiting (arrival order); reserving
   up front means nothing is ever preempted.
2. Decodes first (one token each, as `make_batch` requires), then prefill chunks in arrival
   order, up to `max_batch_tokens` tokens and `max_seqs` sequences.
3. Greedy argmax of the float32 logits. A request ends at eos (kept in its tokens) or after
   max_new_tokens, and frees its pages at once.
A row's math depends only on its own sequence, so batch composition never changes the tokens.

Errors, all found on the host before any state changes:
- `generate()` validates the whole call first and raises, so nothing runs: a `RequestError`
  (ValueError) for a bad prompt (`TokenIdError`, `EmptyPromptError`, `PromptTooLongError`: the
  cache or the positions can never hold it), a ValueError for a bad argument (max_new_tokens < 1,
  unknown mode, ...). `on_error="record"` records bad prompts instead (status "error" and
  `errors[i]`) and serves the others.
- `Engine.submit()` raises the same errors for that request only and leaves the engine as it
  was: a long-lived engine keeps serving the others.
- A full cache is not an error: a request that fits an empty cache waits for pages.
- Graph modes without CUDA raise the compiler's `CudaRequiredError` (a ValueError and a
  RuntimeError) before anything is allocated.
"""

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from mla_func import model
from mla_func.attention import get_backend
from mla_func.batch import SeqWork, make_batch
from mla_func.config import MLAConfig
from mla_func.params import Params
from mla_func.state import KVState, init_state

MODES = ("eager", "piecewise", "full", "full_and_piecewise")
AUTO_PROGRESS_DELAY_S = 2.0  # progress=None shows a bar only for runs longer than this


class RequestError(ValueError):
    """A request the engine cannot serve; the message names the problem."""


class TokenIdError(RequestError):
    """A token id that is not an int in [0, vocab_size)."""


class EmptyPromptError(RequestError):
    """A prompt with no tokens."""


class PromptTooLongError(RequestError):
    """prompt + max_new_tokens - 1 tokens that the cache or the positions can never hold."""


@dataclass(frozen=True)
class GenerateOutput:
    """Per prompt, in the order given: greedy tokens, the float32 logits [new_tokens, vocab]
    that produced them (CPU; `return_logits=True` only), status ("eos", "length" or "error")
    and the error of a request that did not run; plus run statistics."""

    tokens: list[list[int]]
    logits: list[Float[Tensor, "_ vocab"]] | None
    status: list[str]
    errors: list[RequestError | None]
    steps: int
    wall_time_s: float  # the step loop; setup (cache, graph capture) is setup_time_s
    setup_time_s: float
    prompt_tokens: int
    output_tokens: int

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.output_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass(eq=False)
class Request:
    """One request's progress; `Engine.result(rid)` returns it."""

    rid: int
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logits: list[Tensor] = field(default_factory=list)
    cached: int = 0  # tokens written to the cache so far
    status: str = "waiting"

    @property
    def need(self) -> int:  # cached tokens at the end: the last generated one is never fed
        return len(self.prompt) + self.max_new_tokens - 1

    def pending(self) -> list[int]:
        """Known tokens not yet in the cache: a prompt's rest, or the last generated token."""
        if self.cached < len(self.prompt):
            return self.prompt[self.cached:]
        return self.tokens[self.cached - len(self.prompt):]


def _positive_int(name: str, value: object, least: int = 1) -> int:
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
        cap = (_positive_int("num_pages", num_pages, 2) - 1) * page_size
        if cap < limit[0]:
            limit = (cap, f"a cache of {num_pages} pages of {page_size} (page 0 is scratch)")
    return limit


# Prompts are typed loosely on purpose: check_prompt's errors name a bad token id; a type
# checker would only sample one element and fail with a less useful message.
Prompt = Sequence[object] | Tensor


def check_prompt(
    prompt: Prompt, max_new_tokens: int, vocab_size: int, max_len: int, limit: str = "the limit"
) -> list[int]:
    """The prompt as a list of ints, or a RequestError naming what is wrong with it."""
    if isinstance(prompt, Tensor):
        if prompt.dim() != 1 or prompt.is_floating_point() or prompt.dtype == torch.bool:
            raise TokenIdError(f"a prompt tensor must be 1-D integer, got {prompt.dtype} "
                               f"{tuple(prompt.shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
        raise TokenIdError(f"a prompt must be a sequence of token ids, got {type(prompt)}")
    ids = [int(t) if isinstance(t, Integral) and not isinstance(t, bool) else t
           for t in prompt]
    if not ids:
        raise EmptyPromptError("empty prompt: a prompt needs at least one token")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)
           or not 0 <= t < vocab_size]
    if bad:
        raise TokenIdError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    need = len(ids) + max_new_tokens - 1
    if need > max_len:
        raise PromptTooLongError(
            f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} needs {need} cache "
            f"positions; {limit} allows at most {max_len}")
    return ids


class _Progress:
    """tqdm when installed, else one stderr line; enabled=None shows it only after
    AUTO_PROGRESS_DELAY_S seconds, so short runs print nothing."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        self.on, self.delay = enabled is not False, 0.0 if enabled else AUTO_PROGRESS_DELAY_S
        self.n, self.start, self.last, self.bar = 0, time.perf_counter(), 0.0, None
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if self.on and tqdm is not None:
            self.bar = tqdm(total=total, unit="tok", desc="generate", delay=self.delay)

    def update(self, n: int, total: int) -> None:
        self.n += n
        if not self.on:
            return
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(n)
            return
        now = time.perf_counter() - self.start
        if now >= self.delay and (not self.last or now - self.last >= 0.5):
            self.last = now
            print(f"\rgenerate: {self.n}/{total} tokens, {self.n / max(now, 1e-9):.1f} tok/s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.last:  # end the \r line
            print(file=sys.stderr)


def _step_function(params: Params, state: KVState, mode: str, backend: str, max_tokens: int,
                   max_seqs: int, max_pages: int, progress: bool | None) -> Callable:
    """`step(state, batch) -> (logits, state)`: forward itself, or its compiled form."""
    if mode == "eager":
        return lambda state, batch: model.forward(params, state, batch)
    # Imported here: eager never loads the compiler.
    from mla_func.compile_step import compile_step

    return compile_step(params, state, mode=mode, max_tokens=max_tokens, max_seqs=max_seqs,
                        max_pages=max_pages, backend=backend, progress=progress is not False)


class Engine:
    """A long-lived continuous-batching engine: `submit` requests, `step` or `run`, read
    `result`. It owns its KVState; see the module docstring for the policy and errors."""

    def __init__(
        self, cfg: MLAConfig, params: Params, *, num_pages: int, mode: str = "eager",
        attention_backend: str = "torch", page_size: int = 16, max_batch_tokens: int = 512,
        max_seqs: int = 64, max_seq_len: int | None = None,
        eos_token_id: int | Literal["config"] | None = "config", return_logits: bool = False,
        progress: bool | None = None,
    ) -> None:
        check_mode(mode, params)
        if params.cfg != cfg:
            raise ValueError("cfg does not match params.cfg: pass the config the params were "
                             "built or loaded with")
        get_backend(attention_backend)
        for name, value in (("page_size", page_size), ("max_batch_tokens", max_batch_tokens),
                            ("max_seqs", max_seqs)):
            _positive_int(name, value)
        _positive_int("num_pages", num_pages, 2)
        self.max_seq_len, self.limit = seq_limit(cfg, num_pages, page_size)
        if max_seq_len is not None and max_seq_len < self.max_seq_len:
            self.max_seq_len = _positive_int("max_seq_len", max_seq_len)
            self.limit = f"this engine's max_seq_len={max_seq_len}"
        self.max_pages = -(-self.max_seq_len // page_size)
        self.cfg, self.params, self.backend = cfg, params, attention_backend
        self.page_size, self.max_batch_tokens, self.max_seqs = page_size, max_batch_tokens, max_seqs
        self.eos = cfg.eos_token_id if eos_token_id == "config" else eos_token_id
        self.return_logits = return_logits
        self.state: KVState = init_state(cfg, num_pages, page_size, params.device, params.dtype)
        self._step_fn = _step_function(params, self.state, mode, attention_backend,
                                       max_batch_tokens, max_seqs, self.max_pages, progress)
        self._requests: dict[int, Request] = {}
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self.steps = 0

    def submit(self, prompt: Prompt, max_new_tokens: int) -> int:
        """Queue one request and return its id; a bad one raises and changes nothing."""
        _positive_int("max_new_tokens", max_new_tokens)
        ids = check_prompt(prompt, max_new_tokens, self.cfg.vocab_size, self.max_seq_len,
                           self.limit)
        req = Request(len(self._requests), ids, max_new_tokens)
        self._requests[req.rid] = req
        self._waiting.append(req)
        return req.rid

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def _admit(self) -> None:
        alloc = self.state.allocator
        while self._waiting and len(self._running) < self.max_seqs:
            req = self._waiting[0]
            if alloc.pages_needed(req.rid, req.need) > alloc.free_pages:
                break
            alloc.reserve(req.rid, req.need)
            req.status = "running"
            self._running.append(self._waiting.popleft())

    def _schedule(self) -> list[tuple[Request, list[int]]]:
        budget, work = self.max_batch_tokens, []
        decodes = [r for r in self._running if r.cached >= len(r.prompt)]
        prefills = [r for r in self._running if r.cached < len(r.prompt)]
        for req in decodes + prefills:
            if budget == 0 or len(work) == self.max_seqs:
                break
            chunk = req.pending()[:budget]
            work.append((req, chunk))
            budget -= len(chunk)
        # make_batch counts any 1-token step after a cached prefix as a decode: those go first.
        work.sort(key=lambda w: not (len(w[1]) == 1 and w[0].cached > 0))
        return work

    def step(self) -> int:
        """Admit, run one step, advance the requests in it; returns the tokens generated."""
        self._admit()
        work = self._schedule()
        if not work:
            if self._waiting:  # cannot happen for validated requests: an empty cache fits them
                raise RuntimeError("no request can run and the cache is empty: engine bug")
            return 0
        alloc = self.state.allocator
        batch = make_batch(
            [SeqWork(chunk, req.cached, alloc.pages[req.rid]) for req, chunk in work],
            self.page_size, self.max_pages, self.params.device, self.backend)
        logits, self.state = self._step_fn(self.state, batch)
        next_ids = logits.argmax(-1).tolist()
        self.steps += 1
        generated = 0
        for row, (req, chunk) in enumerate(work):
            req.cached += len(chunk)
            if req.cached < len(req.prompt):
                continue  # a prefill chunk that is not the prompt's last: its logits are unused
            req.tokens.append(next_ids[row])
            generated += 1
            if self.return_logits:
                req.logits.append(logits[row].float().cpu())
            if next_ids[row] == self.eos or len(req.tokens) == req.max_new_tokens:
                req.status = "eos" if next_ids[row] == self.eos else "length"
                alloc.release(req.rid)
                self._running.remove(req)
        return generated

    def run(self, progress: bool | None = None) -> None:
        """Step until every submitted request has finished."""
        reqs = [r for r in self._requests.values() if r.status in ("waiting", "running")]
        bar = _Progress(sum(r.max_new_tokens - len(r.tokens) for r in reqs), progress)
        try:
            while self.has_work:
                n = self.step()
                # A request that stops at eos shrinks the total instead of leaving a gap.
                bar.update(n, sum(r.max_new_tokens if r.status in ("waiting", "running")
                                  else len(r.tokens) for r in reqs))
        finally:
            bar.close()

    def result(self, rid: int) -> Request:
        return self._requests[rid]


def generate(
    cfg: MLAConfig, params: Params, prompts: Sequence[Prompt] | Tensor, max_new_tokens: int = 8,
    mode: str = "eager", attention_backend: str = "torch", return_logits: bool = False, *,
    page_size: int = 16, num_pages: int | None = None, max_batch_tokens: int = 512,
    max_seqs: int = 64, eos_token_id: int | Literal["config"] | None = "config",
    progress: bool | None = None, on_error: str = "raise",
) -> GenerateOutput:
    """Greedy generation for every prompt with continuous batching (see the module docstring).

    `num_pages=None` sizes the cache so that `max_seqs` requests can run at once; eos_token_id
    "config" means cfg.eos_token_id, None disables it; progress None shows a bar only on runs
    longer than a couple of seconds."""
    check_mode(mode, params)
    _positive_int("max_new_tokens", max_new_tokens)
    _positive_int("page_size", page_size)
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    max_len, limit = seq_limit(cfg, num_pages, page_size)
    checked: list[list[int] | RequestError] = []
    for i, prompt in enumerate(prompts):
        try:
            checked.append(check_prompt(prompt, max_new_tokens, cfg.vocab_size, max_len, limit))
        except RequestError as err:
            if on_error == "raise":
                raise type(err)(f"prompt {i}: {err}") from None
            checked.append(type(err)(f"prompt {i}: {err}"))
    valid = [p for p in checked if isinstance(p, list)]
    pages = [-(-(len(p) + max_new_tokens - 1) // page_size) for p in valid]
    if num_pages is None:
        num_pages = 1 + sum(sorted(pages, reverse=True)[:max_seqs]) if pages else 2
    longest = max((len(p) + max_new_tokens - 1 for p in valid), default=1)
    setup = time.perf_counter()
    engine = Engine(
        cfg, params, num_pages=num_pages, mode=mode, attention_backend=attention_backend,
        page_size=page_size, max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
        max_seq_len=longest, eos_token_id=eos_token_id, return_logits=return_logits,
        progress=progress)
    rids = [engine.submit(p, max_new_tokens) if isinstance(p, list) else None for p in checked]
    start = time.perf_counter()
    setup = start - setup
    engine.run(progress)
    wall = time.perf_counter() - start
    reqs = [engine.result(r) if r is not None else None for r in rids]
    empty = torch.empty(0, cfg.vocab_size)
    return GenerateOutput(
        tokens=[r.tokens if r else [] for r in reqs],
        logits=[torch.stack(r.logits) if r and r.logits else empty for r in reqs]
        if return_logits else None,
        status=[r.status if r else "error" for r in reqs],
        errors=[None if r else err for r, err in zip(reqs, checked, strict=True)],
        steps=engine.steps, wall_time_s=wall, setup_time_s=setup,
        prompt_tokens=sum(len(p) for p in valid),
        output_tokens=sum(len(r.tokens) for r in reqs if r))
