"""Attention backends and the `mla_func::mla_attention` custom op the step function calls.

The op is one opaque node for tracers (a `torch.library.custom_op` with a fake implementation):
it takes q_nope, q_pe and kv as the input projection leaves them, runs their prologue
(`ops.attention.prologue`: rope on q_pe and k_pe, the norm of c_kv), writes the step's new
[c_kv, k_pe] rows into the cache and returns per-head outputs in the value space. The prologue
lives inside the op so that a backend can fuse it with its first launch (the Triton decode
path does). `mla_attention_out` is the same call writing into a given tensor: the capture
compiler's out variant of the op.
Which backend runs it, and in which form (absorbed or MHA), is decided inside from host-side
metadata only (`Batch.host`, a CPU tensor), never from device memory.

Each backend declares how much of it a CUDA graph may hold (vLLM's levels):
`never` < `uniform_single_token_decode` < `uniform_batch` < `always`.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.ops import attention as ref
from mla_func.state import LatentCache


class GraphSupport(IntEnum):
    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


# A backend's `run` takes the op's arguments, in order, but the backend name, and an optional
# `out` tensor to write the result into (returning it).
AttnFn = Callable[..., Tensor]


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    graph_support: GraphSupport
    run: AttnFn
    doc: str = ""
    # Why the backend cannot run on a device (None: it can); asked before any state changes.
    unavailable: Callable[[torch.device], str | None] | None = None


BACKENDS: dict[str, AttentionBackend] = {}


def triton_unavailable(device: torch.device) -> str | None:
    """Triton kernels need a CUDA device, or Triton's CPU interpreter (TRITON_INTERPRET=1,
    read when Triton is first imported: set it before importing mla_func)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return ("its kernels need a CUDA device, or Triton's CPU interpreter (set "
            "TRITON_INTERPRET=1 before the first import; slow: for tests); use the 'torch' "
            "backend on the CPU")


# Registered when first asked for (importing them loads Triton), with the check that runs
# before that import: on a CPU without the interpreter, importing the kernels fails inside
# Triton (its Gluon module asserts), not with the error that names the fix.
LAZY_BACKENDS: dict[str, Callable[[torch.device], str | None]] = {"triton": triton_unavailable}


def register_backend(backend: AttentionBackend) -> None:
    BACKENDS[backend.name] = backend


def _check(name: str, unavailable: Callable[[torch.device], str | None] | None,
           device: torch.device | str | None) -> None:
    if device is not None and unavailable is not None:
        why = unavailable(torch.device(device))
        if why is not None:
            raise ValueError(f"attention backend {name!r} cannot run on {device}: {why}")


def get_backend(name: str, device: torch.device | str | None = None) -> AttentionBackend:
    """The backend called `name`; given `device`, a ValueError if it cannot run there."""
    if name not in BACKENDS:
        if name in LAZY_BACKENDS:
            _check(name, LAZY_BACKENDS[name], device)
            import mla_func.kernels.attention.backend  # noqa: F401  (registers "triton")
        if name not in BACKENDS:
            known = sorted(set(BACKENDS) | set(LAZY_BACKENDS))
            raise ValueError(f"unknown attention backend {name!r}; known: {known}")
    backend = BACKENDS[name]
    _check(name, backend.unavailable, device)
    return backend


# Prompts at least this long (new tokens of one sequence) use the MHA form in the torch backend.
MHA_MIN_QUERY = 64


def torch_attention(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    cache: LatentCache,
    layer: int,
    kv_norm: Float[Tensor, " kv_lora"],
    inv_freq: Float[Tensor, " qk_rope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    slot_mapping: Int[Tensor, " tokens"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    seq_lens: Int[Tensor, " seqs"],
    host: Int[Tensor, " 5"],
    scale: float,
    rope_scale: float,
    eps: float,
    out: Float[Tensor, "tokens heads v_head"] | None = None,
) -> Float[Tensor, "tokens heads v_head"]:
    """The reference backend: prologue and cache write, then the absorbed form for decodes and
    short extends, the MHA form when the step holds a long prompt (host metadata decides).
    Given `out`, the result is copied into it (and `out` returned)."""
    q_pe, kv_new = ref.prologue(q_pe, kv, kv_norm, positions, inv_freq, rope_scale, eps)
    layer_cache = cache[layer]
    ref.write_cache(layer_cache, kv_new, slot_mapping)
    # Gather only the page-table columns the longest sequence reaches (host metadata).
    pages_used = -(-int(host[3]) // cache.shape[2])
    page_table = page_table[:, :pages_used]
    max_query_len = int(host[4])
    form = ref.attend_mha if max_query_len >= MHA_MIN_QUERY else ref.attend_absorbed
    o = form(q_nope, q_pe, layer_cache, w_uk, w_uv, token_seq, positions, page_table, scale)
    return o if out is None else out.copy_(o)


register_backend(AttentionBackend(
    "torch", GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE, torch_attention,
    "pure torch; picks its form from host metadata, so only single-token decode is uniform"))


@custom_op("mla_func::mla_attention", mutates_args=("cache",))
def mla_attention(
    q_nope: Tensor, q_pe: Tensor, kv: Tensor, cache: Tensor, layer: int, kv_norm: Tensor,
    inv_freq: Tensor, w_uk: Tensor, w_uv: Tensor, slot_mapping: Tensor, token_seq: Tensor,
    positions: Tensor, page_table: Tensor, seq_lens: Tensor, host: Tensor, scale: float,
    rope_scale: float, eps: float, backend: str,
) -> Tensor:
    return get_backend(backend).run(
        q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, slot_mapping, token_seq,
        positions, page_table, seq_lens, host, scale, rope_scale, eps)


def mla_attention_out(
    q_nope: Tensor, q_pe: Tensor, kv: Tensor, cache: Tensor, layer: int, kv_norm: Tensor,
    inv_freq: Tensor, w_uk: Tensor, w_uv: Tensor, slot_mapping: Tensor, token_seq: Tensor,
    positions: Tensor, page_table: Tensor, seq_lens: Tensor, host: Tensor, scale: float,
    rope_scale: float, eps: float, backend: str, *, out: Tensor,
) -> None:
    """`mla_attention` writing its result into `out` (the capture compiler's out variant: a
    piecewise step runs the op straight into the next segment's static input buffer)."""
    if out.shape != (q_nope.shape[0], q_nope.shape[1], w_uv.shape[1]):
        raise ValueError(f"attention out is {tuple(out.shape)}; expected "
                         f"{(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])}")
    get_backend(backend).run(
        q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, slot_mapping, token_seq,
        positions, page_table, seq_lens, host, scale, rope_scale, eps, out=out)


def attend(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    cache: LatentCache,
    layer: int,
    kv_norm: Float[Tensor, " kv_lora"],
    inv_freq: Float[Tensor, " qk_rope"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    slot_mapping: Int[Tensor, " tokens"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    seq_lens: Int[Tensor, " seqs"],
    host: Int[Tensor, " 5"],
    scale: float,
    rope_scale: float,
    eps: float,
    backend: str,
) -> Float[Tensor, "tokens heads v_head"]:
    """The typed entry to the op: shape checks see every argument (the op's fake
    implementation, which `meta` tensors run, checks nothing). q_pe and kv are the input
    projection's output, before the rope and the norm, which the op applies (`kv_norm`,
    `inv_freq`, `rope_scale`, `eps`)."""
    return mla_attention(
        q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, slot_mapping, token_seq,
        positions, page_table, seq_lens, host, scale, rope_scale, eps, backend)


@mla_attention.register_fake
def _(q_nope, q_pe, kv, cache, layer, kv_norm, inv_freq, w_uk, w_uv, slot_mapping, token_seq,
      positions, page_table, seq_lens, host, scale, rope_scale, eps, backend):
    return q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])
