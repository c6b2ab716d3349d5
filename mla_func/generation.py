"""One-call greedy generation: `generate()` over a fresh `Engine`, and its `GenerateOutput`.

The front end of `mla_func.engine` (iteration-level batching as in Orca, Yu et al., OSDI 2022,
over a paged cache, vLLM, Kwon et al., SOSP 2023; prefill chunks mixed into decode steps,
Sarathi-Serve, Agrawal et al., OSDI 2024). This module owns the whole-call validation, the
cache sizing (`num_pages=None`: room for `max_seqs` requests at once) and the per-prompt
results; the scheduling policy, the step loop and their errors are the engine's.
`mla_func.generate` (public API) resolves here.

Errors: `generate()` validates the whole call first and raises, so nothing runs: a
`RequestError` (ValueError) for a bad prompt (`TokenIdError`, `EmptyPromptError`,
`PromptTooLongError`: the cache or the positions can never hold it), a ValueError for a bad
argument (max_new_tokens < 1, unknown mode, ...). `on_error="record"` records bad prompts
instead (status "error" and `errors[i]`) and serves the others.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from mla_func.cache_fp8 import check_kv_dtype
from mla_func.config import MLAConfig
from mla_func.dims import TOKENS_MAX_CAPTURED
from mla_func.engine import Engine
from mla_func.kernels.plan import KernelOptions
from mla_func.parallel.shard import on_mesh
from mla_func.params import Params
from mla_func.validation import (
    IntArray,
    Prompt,
    RequestError,
    check_mode,
    check_prompt,
    positive_int,
    seq_limit,
)


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
    attention_backend: str = ""  # the backend that ran (what "auto" resolved to)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.output_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


def generate(
    cfg: MLAConfig, params: Params, prompts: Sequence[Prompt] | Tensor | IntArray,
    max_new_tokens: int = 8, mode: str = "eager", attention_backend: str = "auto",
    return_logits: bool = False, *,
    page_size: int = 16, num_pages: int | None = None,
    max_batch_tokens: int | None = None,
    max_seqs: int = 64, eos_token_id: int | Sequence[int] | Literal["config"] | None = "config",
    progress: bool | None = None, on_error: str = "raise",
    max_graph_tokens: int = TOKENS_MAX_CAPTURED, kernels: KernelOptions | None = None,
    mesh: Any = None, kv_dtype: str = "auto",
) -> GenerateOutput:
    """Greedy generation for every prompt with continuous batching (see `mla_func.engine`).

    `num_pages=None` sizes the cache so that `max_seqs` requests can run at once; eos_token_id
    "config" means cfg.eos_token_ids (every id a config.json list gives), None disables it, an
    id or a sequence of ids replaces them; progress None shows a bar only on runs longer than a
    couple of seconds; `max_batch_tokens`: a step's token budget (None: the engine's,
    `engine.default_batch_tokens`, 8192 a rank); graph modes capture steps of up to
    `max_graph_tokens` tokens (and `max_batch_tokens`), larger ones run eagerly. `kernels`:
    which implementation runs each op (default: the device's for the weights' dtype, with
    `attention_backend`; "auto": "triton" on CUDA, "torch" elsewhere and for float32 weights,
    which run the reference ops; named in the progress line and in the result). `mesh`: a 1-D
    DeviceMesh (or ProcessGroup) to run tensor parallel on, every rank calling `generate` with
    the same arguments: whole `params` are sharded for it (`parallel.shard_params`); params
    already sharded run on their own group (a `mesh` must then be theirs). `kv_dtype` "fp8": the
    latent cache in FP8 (`cache_fp8`: 656 bytes a token a layer at V2/V3's sizes, 1.76x the
    tokens of bf16); "auto": floats in the weights' dtype."""
    params = on_mesh(params, mesh)
    check_mode(mode, params)
    check_kv_dtype(kv_dtype)
    positive_int("max_new_tokens", max_new_tokens)
    positive_int("page_size", page_size)
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    if getattr(prompts, "ndim", None) == 1:  # one prompt's ids, not a batch of prompts
        raise RequestError(f"prompts is one 1-D {type(prompts).__name__} of "
                           f"{len(prompts)} token ids: pass a list of prompts ([ids] for one "
                           "prompt) or a 2-D tensor, a row a prompt")
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
        progress=progress, max_graph_tokens=max_graph_tokens, kernels=kernels,
        kv_dtype=kv_dtype)
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
        output_tokens=sum(len(r.tokens) for r in reqs if r),
        attention_backend=engine.backend)
