"""`compile_step`: the model's step function through the capture compiler.

The model-specific glue, outside `mla_func.capture` (which stays generic): it plans
`mla_func.model.forward` with the dim vocabulary of `mla_func.dims`, splits at the attention op
(`mla_func::mla_attention`, whose graph support comes from the backend named in its last
argument; piecewise replay runs it into the next segment's input through its out variant,
`attention.mla_attention_out`) and at the logits projection (`mla_func::logits`, graph support
`always`): piecewise steps pad `seqs` along with `tokens` (up to `max_seqs`), so inside a graph
the projection would run on up to 512 rows whatever the real sequence count (at V2-Lite's
102400-word vocabulary, 215 GFLOP at 512 rows); as a splitting op it runs on the real
sequences, and its result is the step's output, with no static buffer. It records, per
bucket, the kernels that bucket runs (`kernels.plan.plan_step`) in the plan's metadata
(`plan.json`'s "kernels"), and each kind of weight's precision ("weights":
`fp8_params.weight_precisions`, e.g. "fp8 e4m3, block 128") and the cache's ("cache": its
`kv_dtype`, the bytes of a token's row in a layer, and for FP8 rows their layout). It also
builds the
capture-time batches of full decode graphs: per `seqs` bucket, one new token per sequence,
every page-table entry on the scratch page, slot -1 (no cache write), seq_len the worst case
the page table allows (never zero-length dummies), host metadata with those sizes. The
returned step is bound to `state`'s cache (captured by address): call it with that state only,
as `logits, state = step(state, batch)`.
"""

from dataclasses import asdict

import torch

from mla_func.attention import get_backend, mla_attention_out
from mla_func.batch import Batch
from mla_func.cache_fp8 import fp8_layout
from mla_func.capture import ALWAYS, CapturePlan, CudaRequiredError, plan_capture
from mla_func.capture.compile import compile_plan
from mla_func.capture.dispatch import MODES, CompiledStep
from mla_func.config import MLAConfig
from mla_func.dims import VOCABULARY
from mla_func.fp8_params import is_fp8, weight_precisions
from mla_func.kernels.plan import KernelOptions, device_spec, options_for
from mla_func.kernels.plan import plan_step as plan_kernels
from mla_func.model import forward
from mla_func.parallel.comm import COLLECTIVES
from mla_func.parallel.comm import prepare as prepare_collectives
from mla_func.params import Params
from mla_func.state import SCRATCH_PAGE, KVState
from mla_func.validation import positive_int

ATTENTION_OP = "mla_func::mla_attention"
LOGITS_OP = "mla_func::logits"


def attention_support(args: tuple) -> int:
    """Graph-support level of one attention call: its backend's (the op's last argument)."""
    return int(get_backend(args[-1]).graph_support)


def decode_batch(size: int, max_pages: int, page_size: int, device: "str | torch.device",
                 kernels: KernelOptions, max_seq_len: int | None = None) -> Batch:
    """`size` single-token decodes that read and write only the scratch page, at the worst-case
    length (`max_pages * page_size` unless given)."""
    seq_len = max_seq_len or max_pages * page_size
    rows = torch.arange(size, dtype=torch.int32, device=device)

    def full(value: int, *shape: int) -> torch.Tensor:
        return torch.full(shape or (size,), value, dtype=torch.int32, device=device)

    host = torch.tensor([size, size, size, seq_len, 1], dtype=torch.int64)
    return Batch(
        token_ids=full(0), positions=full(seq_len - 1), slot_mapping=full(-1), token_seq=rows,
        page_table=full(SCRATCH_PAGE, size, max_pages), seq_lens=full(seq_len),
        query_start=rows, query_lens=full(1), logits_index=rows, host=host,
        page_size=page_size, kernels=kernels)


def seqs_within_tokens(max_tokens: int | None, max_seqs: int | None) -> int | None:
    """`max_seqs` checked against `max_tokens` (each None: the vocabulary's default). Every
    sequence of a step has a token, so a full decode graph of `seqs` sequences holds as many
    tokens, and its buffers are those of the piecewise graphs (sized at `max_tokens`): more
    sequences than tokens is refused, and a default `max_seqs` is lowered to `max_tokens`."""
    for name, v in (("max_tokens", max_tokens), ("max_seqs", max_seqs)):
        if v is not None:
            positive_int(name, v)
    tokens = max_tokens if max_tokens is not None else VOCABULARY["tokens"].max_size
    if max_seqs is None:
        default = VOCABULARY["seqs"].max_size
        return tokens if default is not None and tokens is not None and tokens < default else None
    if tokens is not None and max_seqs > tokens:
        raise ValueError(f"max_seqs={max_seqs} is more than max_tokens={tokens}: a step of "
                         f"{max_seqs} sequences has at least {max_seqs} tokens; pass "
                         f"max_seqs <= max_tokens")
    return max_seqs


def bucket_kernels(plan: CapturePlan, params: Params, kernels: KernelOptions, max_pages: int,
                   page_size: int, kv_dtype: str = "auto") -> dict[str, dict]:
    """The options, and mode -> bucket size -> the kernels that bucket runs
    (`StepPlan.summary`): a piecewise bucket of `tokens` (its attention chosen per step,
    between the graphs), a full bucket of `seqs` single-token decodes; the cache in
    `kv_dtype` ("fp8", or "auto": the weights' dtype)."""
    device = device_spec(params.device)
    weights = "fp8" if is_fp8(params) else "bf16"
    seqs_max = plan.buckets["full"][-1] if plan.buckets.get("full") else 1
    out: dict[str, dict] = {"options": asdict(kernels)}
    for mode, sizes in plan.buckets.items():
        full = mode == "full"
        out[mode] = {str(n): plan_kernels(
            params.cfg, device, n, n if full else min(n, seqs_max), options=kernels,
            max_pages=max_pages, page_size=page_size, dtype=params.dtype,
            max_query_len=1 if full else None, ranks=params.tp.size,
            weights=weights, kv_dtype=kv_dtype).summary(options=False)
            for n in sizes}
    return out


def cache_precision(state: KVState, cfg: MLAConfig) -> dict:
    """What plan.json says of the cache: its `kv_dtype`, a token's row in a layer in bytes,
    and the layout of FP8 rows."""
    out = {"kv_dtype": state.kv_dtype, "row_bytes": state.row_bytes}
    if state.kv_dtype == "fp8":
        out["layout"] = fp8_layout(cfg.kv_lora_rank, cfg.qk_rope_head_dim).describe()
    return out


def plan_step(params: Params, state: KVState, *, max_tokens: int | None = None,
              max_seqs: int | None = None, max_pages: int | None = None,
              backend: str = "torch", kernels: KernelOptions | None = None) -> CapturePlan:
    """The capture plan of `forward` (works on the meta device: no memory, no GPU), with the
    kernels of each bucket in its metadata. The buckets stop at what `state` can hold: a step
    writes each new token to a slot and each sequence holds a page of its own, so no step has
    more tokens than the cache has slots, nor more sequences than pages (the scratch page is
    no one's); the plan's "state_bounds" says so."""
    kernels = options_for(params.device, kernels, backend)
    max_pages = max_pages or state.num_pages - 1
    example = decode_batch(2, max_pages, state.page_size, params.device, kernels)
    seqs_within_tokens(max_tokens, max_seqs)  # the caller's sizes, checked as given
    slots, pages = (state.num_pages - 1) * state.page_size, state.num_pages - 1
    max_tokens = min(max_tokens or VOCABULARY["tokens"].max_size, slots)
    max_seqs = min(max_seqs or VOCABULARY["seqs"].max_size, pages, max_tokens)
    sizes = {k: v for k, v in (("tokens", max_tokens), ("seqs", max_seqs)) if v is not None}
    cfg = params.cfg
    plan = plan_capture(
        forward, params, state, example, dims=VOCABULARY, max_sizes=sizes,
        splitting_ops={ATTENTION_OP: attention_support, LOGITS_OP: lambda args: ALWAYS},
        out_variants={ATTENTION_OP: mla_attention_out}, piecewise_dim="tokens",
        full_dim="seqs", meta={"config_digest": cfg.digest(), "model_type": cfg.model_type,
                               "layers": cfg.num_hidden_layers,
                               "backend": kernels.attention})
    plan.meta["state_bounds"] = {"slots": slots, "pages": pages, "max_tokens": max_tokens,
                                 "max_seqs": max_seqs}
    kv_dtype = "fp8" if state.kv_dtype == "fp8" else "auto"
    plan.meta["kernels"] = bucket_kernels(plan, params, kernels, max_pages, state.page_size,
                                          kv_dtype)
    plan.meta["weights"] = weight_precisions(params)
    plan.meta["cache"] = cache_precision(state, cfg)
    if params.tp.sharded:
        plan.meta["tensor_parallel"] = {"rank": params.tp.rank, "ranks": params.tp.size}
        # Inside the graphs, not splitting points: per segment (logits: at its split).
        plan.meta["collectives"] = {
            str(seg.index): counts for seg in plan.segments
            if (counts := {op: n for op, n in seg.op_counts().items() if op in COLLECTIVES})}
    return plan


def compile_step(params: Params, state: KVState, *, mode: str, max_tokens: int | None = None,
                 max_seqs: int | None = None, max_pages: int | None = None,
                 backend: str = "torch", progress: bool = True, warmups: int = 1,
                 emulate: bool = False, kernels: KernelOptions | None = None,
                 segments: str = "plain") -> CompiledStep:
    """A step `(state, batch) -> (logits, state)` running `forward` in `mode` ("eager",
    "piecewise", "full", "full_and_piecewise"). Batches must use `max_pages` columns of page
    table (default: every page of the cache but the scratch one) and `kernels` (default: the
    device's, with the attention `backend`). Piecewise
    graphs cover 1..`max_tokens` tokens (default `dims.TOKENS_MAX_CAPTURED`, 2560: past it a
    graph saves nothing and its padding costs); larger steps run eagerly. `emulate`
    runs the capture/dispatch machinery without CUDA graphs (CPU tests of padding/dispatch).
    `segments` "inductor": each piecewise segment compiled by Inductor before capture
    (`capture.segments`; full graphs run the step as it is)."""
    if mode == "eager":  # nothing to trace: the step is `forward` itself
        return CompiledStep(forward, None, "eager", "eager", {0: params})
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if not emulate and not torch.cuda.is_available():
        raise CudaRequiredError(f"mode {mode!r} captures CUDA graphs and needs a CUDA device; "
                                "none is available (use mode='eager')")
    kernels = options_for(params.device, kernels, backend)
    get_backend(kernels.attention, params.device)  # before planning: one that cannot run here
    max_pages = max_pages or state.num_pages - 1
    plan = plan_step(params, state, max_tokens=max_tokens, max_seqs=max_seqs,
                     max_pages=max_pages, kernels=kernels)
    # Several GPUs: the one-shot all-reduce's buffer, exchanged before anything is captured.
    prepare_collectives(params.tp, kernels, state.counters, params.dtype)
    example = decode_batch(2, max_pages, state.page_size, params.device, kernels)
    worst = min(max_pages, state.num_pages - 1) * state.page_size

    def full_example(size: int) -> tuple:
        return state, decode_batch(size, max_pages, state.page_size, params.device, kernels,
                                   worst)

    def full_when(params: Params, state: KVState, batch: Batch) -> bool:
        return batch.is_pure_decode

    return compile_plan(plan, forward, (params, state, example), mode=mode, bound=(0,),
                        full_when=full_when, full_example=full_example, warmups=warmups,
                        progress=progress, emulate=emulate, segments=segments)
