"""The "triton" attention backend: prologue, cache write, absorbed decode/extend, MHA prefill.

Same contract as `mla_func.attention.torch_attention` (the reference). One call serves a mixed
step, decode rows first: while no sequence brings MHA_MIN_QUERY or more new tokens, every row
runs the absorbed kernel (one row per token, keys up to its position); otherwise decode rows
run absorbed and the prefill rows run the MHA form. That choice reads `host` (CPU metadata), so
the backend is graph-safe for uniform single-token decode only: there the launch shape is a
function of tensor shapes (bucket rows, page-table capacity) and the workspace is owned here,
allocated once per shape and reused. When every row runs absorbed, the
prologue (rope, latent norm) and the cache write share one launch with the query absorption
(absorb.py); otherwise the prologue kernel (rope.py) and the cache write run first, each on
its own.
"""

from jaxtyping import Float, Int
from torch import Tensor

from mla_func.attention import (
    MHA_MIN_QUERY,
    AttentionBackend,
    GraphSupport,
    register_backend,
    triton_unavailable,
)
from mla_func.kernels.attention.absorb import NewRows
from mla_func.kernels.attention.absorbed import attend_absorbed
from mla_func.kernels.attention.cache_write import write_cache
from mla_func.kernels.attention.decode import DecodeWorkspace
from mla_func.kernels.attention.prefill import mha_prefill
from mla_func.kernels.attention.rope import mla_prologue
from mla_func.state import LatentCache


class TritonMLA:
    """Owns the decode workspace; `run` is the backend entry point."""

    def __init__(self) -> None:
        self.workspace = DecodeWorkspace()

    def run(
        self,
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
        """The op's result, written into `out` when given (the kernels' output stores and
        the value product write there: no copy)."""
        layer_cache = cache[layer]
        num_tokens, num_seqs, num_decodes, max_seq_len, max_query_len = host.tolist()
        if max_query_len < MHA_MIN_QUERY:
            # Shapes only from here on: this is the path a captured decode graph holds. Only
            # decode steps use the long-lived workspace; a prefill's (eager, maybe thousands
            # of rows) is freed after the call.
            ws = self.workspace if num_decodes == num_seqs else DecodeWorkspace()
            # The prologue and the cache write ride in the launch that absorbs the query.
            new = NewRows(q_pe, kv, slot_mapping, positions, kv_norm, inv_freq,
                          rope_scale, eps)
            return attend_absorbed(q_nope, None, layer_cache, w_uk, w_uv, token_seq,
                                   positions, page_table, scale, ws, new=new, out=out)
        q_pe, kv_new = mla_prologue(q_pe, kv, kv_norm, positions, inv_freq, rope_scale, eps)
        write_cache(layer_cache, kv_new, slot_mapping)
        if out is None:
            out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])
        out[num_tokens:].zero_()  # rows past the host count (none when the caller is the op)
        d = num_decodes
        if d:
            attend_absorbed(
                q_nope[:d], q_pe[:d], layer_cache, w_uk, w_uv, token_seq[:d], positions[:d],
                page_table, scale, DecodeWorkspace(), out=out[:d])
        rows = slice(d, num_tokens)
        mha_prefill(
            q_nope[rows], q_pe[rows], layer_cache, w_uk, w_uv, token_seq[rows],
            positions[rows], page_table[d:num_seqs], scale, max_seq_len, max_query_len,
            first_seq=d, out=out[rows])
        return out


BACKEND = TritonMLA()

register_backend(AttentionBackend(
    "triton", GraphSupport.UNIFORM_SINGLE_TOKEN_DECODE, BACKEND.run,
    "Triton split-KV absorbed decode (launch shape from bucket + capacity, owned workspace); "
    "prefill picks absorbed or MHA from host metadata, so only single-token decode is uniform",
    triton_unavailable))

__all__ = ["BACKEND", "TritonMLA"]
