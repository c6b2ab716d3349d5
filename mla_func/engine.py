"""Greedy generation with continuous batching over the step function: the `Engine`.

Iteration-level batching as in Orca (Yu et al., OSDI 2022) over a paged cache (vLLM, Kwon et al.,
SOSP 2023), prefill chunks mixed into decode steps (Sarathi-Serve, Agrawal et al., OSDI 2024);
nano-vllm's scheduler is the model for its size. This module owns the request lifecycle and the
step loop. The step is `model.forward` (mode "eager") or what `compile_step` returns. The
one-call front end, `generate()` and its `GenerateOutput`, lives in `mla_func.generation`.

Policy, once per step:
1. Admit waiting requests in arrival order while fewer than `max_seqs` run and the allocator can
   reserve the pages of the request's whole life (prompt + max_new_tokens - 1 cached tokens).
   One that does not fit waits, and keeps the ones behind it waiting (arrival order); reserving
   up front means nothing is ever preempted.
2. Decodes first (one token each, as `make_batch` requires), then prefill chunks in arrival
   order, up to `max_batch_tokens` tokens and `max_seqs` sequences. In graph modes a step of
   more than `max_graph_tokens` tokens (default `dims.TOKENS_MAX_CAPTURED`, where graphs stop
   paying: see dims.py) runs eagerly, and so does a decode step of more sequences than that.
3. Greedy argmax of the float32 logits, on the device. A request ends at eos (kept in its
   tokens) or after max_new_tokens, and frees its pages then.
A row's math depends only on its own sequence, so batch composition never changes the tokens.

One step stays in flight (the overlap of SGLang's overlap scheduler and vLLM's async
scheduling): `step` launches step N, and only then waits for step N-1's tokens and retires
its requests, so the host builds batches while the GPU runs. A decode whose last token is still
in flight takes it from the previous step's device argmax (those rows come first). A request
is never scheduled past max_new_tokens; one that stopped at eos may have run one more row,
whose token is dropped. Its pages are freed while that row may still run: a later step that
reuses them runs after it, in stream order. On CUDA the step's inputs reach the device through
pinned buffers the engine keeps (`staging.HostStaging`), not a buffer pinned per step.

Errors, all found on the host before any state changes:
- `generate()` validates the whole call first and raises, so nothing runs (see
  `mla_func.generation`).
- `Engine.submit()` raises the same errors for that request only and leaves the engine as it
  was: a long-lived engine keeps serving the others.
- A full cache is not an error: a request that fits an empty cache waits for pages.
- Several ranks (`params.tp`): every rank runs an engine over the same requests; a rank
  whose step differs from the others' raises `parallel.schedule.ScheduleError` on every rank
  before the step's collectives launch.
- Graph modes without CUDA raise the compiler's `CudaRequiredError` (a ValueError and a
  RuntimeError) before anything is allocated.

Request validation and the request errors live in `mla_func.validation`, the request record
and the launched-step record in `mla_func.request`, the progress bar in `mla_func.progress`;
the public names are re-exported here.
"""

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

import torch

import mla_func.model as model
from mla_func.attention import get_backend
from mla_func.batch import SeqWork, make_batch
from mla_func.cache_fp8 import check_kv_dtype
from mla_func.config import MLAConfig
from mla_func.dims import TOKENS_MAX_CAPTURED
from mla_func.kernels.plan import KernelOptions, options_for
from mla_func.parallel.group import is_main
from mla_func.parallel.schedule import ScheduleCheck
from mla_func.params import Params
from mla_func.progress import AUTO_PROGRESS_DELAY_S, Progress
from mla_func.request import Launched, Request
from mla_func.staging import HostStaging
from mla_func.state import KVState, init_state
from mla_func.validation import (
    MODES,
    EmptyPromptError,
    Prompt,
    PromptTooLongError,
    RequestError,
    TokenIdError,
    check_mode,
    check_prompt,
    positive_int,
    seq_limit,
)

# Default token budget of a step, per rank of a tensor-parallel group. A prefill of 8192
# tokens keeps one GPU busy where smaller chunks leave it waiting on the host; a larger budget
# delays the decodes that share a step with a prefill chunk. Each of N ranks does 1/N of a
# token's work while the host's work per step stays, so N ranks take N times the tokens
# (docs/DECISIONS.md, `engine.MAX_BATCH_TOKENS`).
MAX_BATCH_TOKENS = 8192


def default_batch_tokens(ranks: int) -> int:
    """The engine's token budget of a step on a group of `ranks` (MAX_BATCH_TOKENS a rank)."""
    return MAX_BATCH_TOKENS * ranks


__all__ = [
    "AUTO_PROGRESS_DELAY_S", "MODES", "EmptyPromptError", "Engine", "Prompt", "PromptTooLongError",
    "Request", "RequestError", "TokenIdError", "check_mode", "check_prompt", "default_batch_tokens",
    "seq_limit",
]


def _step_function(params: Params, state: KVState, mode: str, kernels: KernelOptions,
                   max_tokens: int, max_seqs: int, max_pages: int, progress: bool | None
                   ) -> Callable:
    """`step(state, batch) -> (logits, state)`: forward itself, or its compiled form."""
    if mode == "eager":
        return lambda state, batch: model.forward(params, state, batch)
    # Imported here: eager never loads the compiler.
    from mla_func.compile_step import compile_step

    return compile_step(params, state, mode=mode, max_tokens=max_tokens, max_seqs=max_seqs,
                        max_pages=max_pages, kernels=kernels, progress=progress is not False)


def eos_ids(eos_token_id: "int | Sequence[int] | str | None", cfg: MLAConfig
            ) -> tuple[int, ...]:
    """The ids that end a request: the config's ("config"), none (None), or the given ones,
    each checked against the vocabulary."""
    if eos_token_id == "config":
        return cfg.eos_token_ids
    if eos_token_id is None:
        return ()
    ids = (eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id
    if isinstance(ids, str) or not isinstance(ids, Sequence) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < cfg.vocab_size
            for i in ids):
        raise ValueError(f"eos_token_id must be 'config', None, or token id(s) in "
                         f"[0, {cfg.vocab_size}); got {eos_token_id!r}")
    return tuple(ids)


class Engine:
    """A long-lived continuous-batching engine: `submit` requests, `step` or `run`, read
    `result`. It owns its KVState (`kv_dtype` "fp8": the FP8 latent cache, `cache_fp8`; "auto":
    floats in the weights' dtype); see the module docstring for the policy and errors."""

    def __init__(
        self, cfg: MLAConfig, params: Params, *, num_pages: int, mode: str = "eager",
        attention_backend: str = "auto", page_size: int = 16,
        max_batch_tokens: int | None = None,
        max_seqs: int = 64, max_seq_len: int | None = None,
        eos_token_id: int | Sequence[int] | Literal["config"] | None = "config",
        return_logits: bool = False, progress: bool | None = None,
        max_graph_tokens: int = TOKENS_MAX_CAPTURED,
        kernels: KernelOptions | None = None, kv_dtype: str = "auto",
    ) -> None:
        check_mode(mode, params)
        check_kv_dtype(kv_dtype)
        if params.cfg != cfg:
            differ = [f.name for f in dataclasses.fields(cfg)
                      if getattr(cfg, f.name) != getattr(params.cfg, f.name)]
            raise ValueError(f"cfg does not match params.cfg (fields that differ: "
                             f"{', '.join(differ)}): pass the config the params were built or "
                             "loaded with")
        kernels = options_for(params.device, kernels, attention_backend, unset="auto",
                              dtype=params.dtype)  # float32 on CUDA: the reference ops
        get_backend(kernels.attention, params.device)
        if max_batch_tokens is None:
            max_batch_tokens = default_batch_tokens(params.tp.size)
        for name, value in (("page_size", page_size), ("max_batch_tokens", max_batch_tokens),
                            ("max_seqs", max_seqs), ("max_graph_tokens", max_graph_tokens)):
            positive_int(name, value)
        positive_int("num_pages", num_pages, 2)
        self.max_seq_len, self.limit = seq_limit(cfg, num_pages, page_size)
        if max_seq_len is not None and max_seq_len < self.max_seq_len:
            self.max_seq_len = positive_int("max_seq_len", max_seq_len)
            self.limit = f"this engine's max_seq_len={max_seq_len}"
        self.max_pages = -(-self.max_seq_len // page_size)
        self.cfg, self.params, self.kernels = cfg, params, kernels
        self.backend = kernels.attention
        self.page_size, self.max_batch_tokens, self.max_seqs = page_size, max_batch_tokens, max_seqs
        self.eos = eos_ids(eos_token_id, cfg)
        self.return_logits = return_logits
        self.state: KVState = init_state(cfg, num_pages, page_size, params.device, params.dtype,
                                         kv_dtype)
        # Several ranks: the same schedule on each, checked before every step; one bar.
        self._schedule_check = ScheduleCheck(params.tp) if params.tp.sharded else None
        self._main = is_main(params.tp)
        if not self._main:
            progress = False
        # The scheduling budget may exceed the graphs' range: larger steps run eagerly, where a
        # graph would only add padding (dims.TOKENS_MAX_CAPTURED). A decode step holds a token
        # a sequence, so full graphs go up to that many sequences too.
        graph_tokens = min(max_batch_tokens, max_graph_tokens)
        self._step_fn = _step_function(params, self.state, mode, kernels,
                                       graph_tokens, min(max_seqs, graph_tokens),
                                       self.max_pages, progress)
        self._requests: dict[int, Request] = {}
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._launched: Launched | None = None
        # Pinned buffers for the step inputs (a fresh pinned buffer a step costs ms of host).
        self._staging = HostStaging(params.device) if params.device.type == "cuda" else None
        self.steps = 0

    def submit(self, prompt: Prompt, max_new_tokens: int) -> int:
        """Queue one request and return its id; a bad one raises and changes nothing."""
        positive_int("max_new_tokens", max_new_tokens)
        ids = check_prompt(prompt, max_new_tokens, self.cfg.vocab_size, self.max_seq_len,
                           self.limit)
        req = Request(len(self._requests), ids, max_new_tokens)
        self._requests[req.rid] = req
        self._waiting.append(req)
        return req.rid

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._launched)

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
        decodes = [r for r in self._running
                   if r.decoding and len(r.tokens) + r.in_flight < r.max_new_tokens]
        prefills = [r for r in self._running if not r.decoding]
        for req in decodes + prefills:
            if budget == 0 or len(work) == self.max_seqs:
                break
            chunk = req.pending()[:budget]
            work.append((req, chunk))
            budget -= len(chunk)
        # make_batch counts any 1-token step after a cached prefix as a decode: those go first,
        # and among them the ones whose token is still on the device.
        work.sort(key=lambda w: (not (len(w[1]) == 1 and w[0].cached > 0), not w[0].in_flight))
        return work

    def step(self) -> int:
        """Admit and launch one step, then read the previous step's tokens and retire its
        finished requests; returns the tokens that previous step generated."""
        self._admit()
        work = self._schedule()
        previous = self._launched
        if not work and previous is None and self._waiting:
            # Cannot happen for validated requests: an empty cache fits each of them.
            raise RuntimeError("no request can run and the cache is empty: engine bug")
        self._launched = self._launch(work, previous) if work else None
        return self._retire(previous) if previous is not None else 0

    def _launch(self, work: list[tuple[Request, list[int]]], previous: "Launched | None"
                ) -> Launched:
        alloc = self.state.allocator
        if self._schedule_check is not None:
            self._schedule_check.check(self.steps, [
                v for req, chunk in work for v in (req.rid, req.cached, len(chunk), *chunk)])
        batch = make_batch(
            [SeqWork(chunk, req.cached, alloc.pages[req.rid]) for req, chunk in work],
            self.page_size, self.max_pages, self.params.device, staging=self._staging,
            kernels=self.kernels)
        waiting_rows = [previous.rows[req.rid] for req, _ in work if req.in_flight]
        if waiting_rows:  # the first rows: their tokens are the previous step's argmax
            src = torch.tensor(waiting_rows)
            # Not `.to(non_blocking=True)` from pageable memory: that copy may wait for the
            # stream, i.e. for the step still running.
            src = self._staging.to_device(src) if self._staging else src
            batch.token_ids[: len(waiting_rows)].copy_(previous.next_ids[src])
        logits, self.state = self._step_fn(self.state, batch)
        next_ids = logits.argmax(-1)
        done = None
        if next_ids.is_cuda:
            host_ids = next_ids.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host_ids = next_ids
        rows = {}
        for row, (req, chunk) in enumerate(work):
            req.cached += len(chunk)
            if req.decoding:  # the prompt's last chunk or a decode: a token comes out
                req.in_flight += 1
                rows[req.rid] = row
        self.steps += 1
        # A clone: a compiled step's output buffer is overwritten by the next replay.
        kept = logits.float().clone() if self.return_logits else None
        return Launched(rows, next_ids, host_ids, done, kept)

    def _retire(self, launched: Launched) -> int:
        if launched.done is not None:
            launched.done.synchronize()
        ids = launched.host_ids.tolist()
        alloc, generated = self.state.allocator, 0
        for rid, row in launched.rows.items():
            req = self._requests[rid]
            req.in_flight -= 1
            if req.status != "running":
                continue  # stopped at eos in an earlier step: this row's token is dropped
            req.tokens.append(ids[row])
            generated += 1
            if launched.logits is not None:
                req.logits.append(launched.logits[row].cpu())
            if ids[row] in self.eos or len(req.tokens) == req.max_new_tokens:
                req.status = "eos" if ids[row] in self.eos else "length"
                alloc.release(req.rid)
                self._running.remove(req)
        return generated

    def run(self, progress: bool | None = None) -> None:
        """Step until every submitted request has finished."""
        reqs = [r for r in self._requests.values() if r.status in ("waiting", "running")]
        progress = progress if self._main else False
        bar = Progress(sum(r.max_new_tokens - len(r.tokens) for r in reqs), progress,
                       f"generate ({self.backend} attention)")
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
