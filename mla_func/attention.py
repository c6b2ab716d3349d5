"""Attention backends and the `mla_func::mla_attention` custom op the step function calls.

The op is one opaque node for tracers (a `torch.library.custom_op` with a fake implementation):
it takes q_nope, q_pe and kv as the input projection leaves them, runs their prologue
(`ops.attention.prologue`: rope on q_pe and k_pe, the norm of c_kv), writes the step's new
[c_kv, k_pe] rows into the cache and returns per-head outputs in the value space. The prologue
lives inside the op so that a backend can fuse it with its first launch (the Triton decode
path does). Its operands travel as two pytrees (`ops.attention_args`: the layer's weights, the
step's metadata), flattened once at the op boundary. `mla_attention_out` is the same call
writing into a given tensor: the capture compiler's out variant of the op.
Which backend runs it, and in which form (absorbed or MHA, `kernels.plan.attention_form`), is
decided inside from host-side metadata only (`Batch.host`, a CPU tensor), never from device
memory.

Each backend declares how much of it a CUDA graph may hold (vLLM's levels):
`never` < `uniform_single_token_decode` < `uniform_batch` < `always`.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch
from jaxtyping import Float, Float32, Int
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.plan import attention_form
from mla_func.ops import attention as ref
from mla_func.ops.attention_args import AttnMeta, AttnWeights, flat, from_flat
from mla_func.state import LatentCache


class GraphSupport(IntEnum):
    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


# run(q_nope, q_pe, kv, cache, layer, weights, meta, out=None): the op's result, written into
# `out` when given (and `out` returned).
AttnFn = Callable[..., Tensor]


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    graph_support: GraphSupport
    run: AttnFn
    doc: str = ""
    # Why the backend cannot run on a device (None: it can); asked before any state changes.
    unavailable: Callable[[torch.device], str | None] | None = None


def torch_attention(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    cache: LatentCache,
    layer: int,
    w: AttnWeights,
    m: AttnMeta,
    out: Float[Tensor, "tokens heads v_head"] | None = None,
) -> Float[Tensor, "tokens heads v_head"]:
    """The reference backend: prologue and cache write, then the absorbed form for decodes and
    short extends, the MHA form when the step holds a long prompt (host metadata decides)."""
    q_pe, kv_new = ref.prologue(q_pe, kv, w.kv_norm, m.positions, w.inv_freq, w.rope_scale,
                                w.eps)
    layer_cache = cache[layer]
    ref.write_cache(layer_cache, kv_new, m.slot_mapping, w.kv_norm.shape[0])
    # Gather only the page-table columns the longest sequence reaches (host metadata).
    pages_used = -(-int(m.host[3]) // cache.shape[2])
    page_table = m.page_table[:, :pages_used]
    mha = attention_form(int(m.host[4]), m.mha_min_query) == "mha"
    form = ref.attend_mha if mha else ref.attend_absorbed
    w_uk, w_uv = w.dense(q_nope.dtype)
    o = form(q_nope, q_pe, layer_cache, w_uk, w_uv, m.token_seq, m.positions, page_table,
             w.scale)
    return o if out is None else out.copy_(o)


def triton_unavailable(device: torch.device) -> str | None:
    """Triton kernels need a CUDA device, or Triton's CPU interpreter (TRITON_INTERPRET=1,
    read when Triton is first imported: set it before importing mla_func)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return ("its kernels need a CUDA device, or Triton's CPU interpreter (set "
            "TRITON_INTERPRET=1 before the first import; slow: for tests); use the 'torch' "
            "backend on the CPU")


def _triton_backend() -> object:
    """A new Triton backend object. Imported here, on first use: the kernels import Triton,
    which on a CPU without the interpreter fails inside Triton, not with
    `triton_unavailable`'s message."""
    from mla_func.kernels.attention.backend import TritonMLA

    return TritonMLA()


def triton_attention(q_nope: Tensor, q_pe: Tensor, kv: Tensor, cache: Tensor, layer: int,
                     w: AttnWeights, m: AttnMeta, out: Tensor | None = None) -> Tensor:
    """The Triton backend of the state that owns `cache` (its runtime holds the backend's
    workspace)."""
    backend = Runtime.of(cache).resource("attention.triton", _triton_backend)
    return backend.run(q_nope, q_pe, kv, cache, layer, w, m, out=out)


BACKENDS: dict[str, AttentionBackend] = {
    "torch": AttentionBackend(
        "torch", GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE, torch_attention,
        "pure torch; picks its form from host metadata, so only single-token decode is "
        "uniform"),
    "triton": AttentionBackend(
        "triton", GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE, triton_attention,
        "Triton split-KV absorbed decode (launch shape from bucket + capacity, a workspace "
        "owned by the state's runtime); prefill picks absorbed or MHA from host metadata, so "
        "only single-token decode is uniform", triton_unavailable),
}


def register_backend(backend: AttentionBackend) -> None:
    """Make `backend` available by its name (an extension point: a backend of one's own)."""
    BACKENDS[backend.name] = backend


def get_backend(name: str, device: torch.device | str | None = None) -> AttentionBackend:
    """The backend called `name`; given `device`, a ValueError if it cannot run there."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    backend = BACKENDS[name]
    if device is not None and backend.unavailable is not None:
        why = backend.unavailable(torch.device(device))
        if why is not None:
            raise ValueError(f"attention backend {name!r} cannot run on {device}: {why}")
    return backend


@custom_op("mla_func::mla_attention", mutates_args=("cache",))
def mla_attention(
    q_nope: Tensor, q_pe: Tensor, kv: Tensor, cache: Tensor, layer: int, kv_norm: Tensor,
    inv_freq: Tensor, w_uk: Tensor, w_uv: Tensor, scale: float, rope_scale: float, eps: float,
    uk_scales: Tensor | None, uv_scales: Tensor | None, block_rows: int, block_cols: int,
    slot_mapping: Tensor, token_seq: Tensor, positions: Tensor, page_table: Tensor,
    seq_lens: Tensor, host: Tensor, mha_min_query: int, backend: str,
) -> Tensor:
    w, m = from_flat((kv_norm, inv_freq, w_uk, w_uv, scale, rope_scale, eps, uk_scales,
                      uv_scales, block_rows, block_cols, slot_mapping, token_seq, positions,
                      page_table, seq_lens, host, mha_min_query))
    # Contiguous, as the fake implementation says (the reference's einsum leaves the heads
    # outermost in memory): a compiler that trusts the fake's strides (Inductor) reads it so.
    return get_backend(backend).run(q_nope, q_pe, kv, cache, layer, w, m).contiguous()


@mla_attention.register_fake
def _(q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, *rest):
    return q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])


def mla_attention_out(q_nope: Tensor, q_pe: Tensor, kv: Tensor, cache: Tensor, layer: int,
                      *args, out: Tensor) -> None:
    """`mla_attention` (the same flat arguments) writing its result into `out` (the capture
    compiler's out variant: a piecewise step runs the op straight into the next segment's
    static input buffer)."""
    w, m = from_flat(args[:-1])
    want = (q_nope.shape[0], q_nope.shape[1], w.w_uv.shape[1])
    if out.shape != want:
        raise ValueError(f"attention out is {tuple(out.shape)}; expected {want}")
    get_backend(args[-1]).run(q_nope, q_pe, kv, cache, layer, w, m, out=out)


def op_args(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    cache: LatentCache,
    layer: int,
    kv_norm: Float[Tensor, " kv_lora"],
    inv_freq: Float[Tensor, " qk_rope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    scale: float,
    rope_scale: float,
    eps: float,
    uk_scales: Float32[Tensor, "heads _ _"] | None,
    uv_scales: Float32[Tensor, "heads _ _"] | None,
    block_rows: int,
    block_cols: int,
    slot_mapping: Int[Tensor, " tokens"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    seq_lens: Int[Tensor, " seqs"],
    host: Int[Tensor, " 5"],
    mha_min_query: int,
) -> tuple:
    """The op's flat arguments, typed as one signature: the shape checks bind every
    operand's dims together (the pytrees' own checks see each alone, and the op's fake
    implementation, which `meta` tensors run, checks nothing)."""
    return (q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, scale, rope_scale,
            eps, uk_scales, uv_scales, block_rows, block_cols, slot_mapping, token_seq,
            positions, page_table, seq_lens, host, mha_min_query)


def attend(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    cache: LatentCache,
    layer: int,
    weights: AttnWeights,
    meta: AttnMeta,
    backend: str,
    direct: bool = True,
) -> Float[Tensor, "tokens heads v_head"]:
    """The typed entry to the op, its operands flattened once (`op_args`). q_pe and kv are
    the input projection's output, before the rope and the norm, which the op applies.
    `direct`: an eager call runs the op's function (else through the dispatcher)."""
    op = mla_attention if direct else mla_attention.dispatch
    return op(*op_args(q_nope, q_pe, kv, cache, layer, *flat(weights), *flat(meta)), backend)
