"""The "triton" attention backend: prologue, cache write, absorbed decode/extend, MHA prefill.

Same contract as `mla_func.attention.torch_attention` (the reference). One call serves a mixed
step, decode rows first: while no sequence brings `kernels.plan.MHA_MIN_QUERY` or more new
tokens, every row runs the absorbed kernel (one row per token, keys up to its position);
otherwise decode rows run absorbed and the prefill rows run the MHA form. That choice reads
`host` (CPU metadata), so the backend is graph-safe for uniform single-token decode only: there
the launch shape is a function of tensor shapes (bucket rows, page-table capacity) and the
workspace is this object's, allocated once per shape and reused. One `TritonMLA` belongs to one
state's runtime (`Runtime.resource`), so two engines never share a workspace. When every row
runs absorbed, the prologue (rope, latent norm) and the cache write share one launch with the
query absorption (absorb.py); otherwise the prologue kernel (rope.py) and the cache write run
first, each on its own. The kernels are tuned for bf16/fp16 operands (`plan.KERNEL_DTYPES`);
float32 runs where its tiles fit, and where they do not the call ends in one line that says so.
An FP8 cache (`cache_fp8`) is quantised where rows are written and dequantised where they are
read: the decode kernel's tiles, the MHA form's gather. Block-FP8 W_UK / W_UV
(`AttnWeights.absorbed`) go as they are to the decode path's kernels, which read e4m3
(absorb.py, merge_uv.py); a prefill dequantises them first (`absorbed.dense_weight`).
"""

from jaxtyping import Float
from torch import Tensor
from triton.runtime.errors import OutOfResources

from mla_func.kernels.attention.absorb import NewRows
from mla_func.kernels.attention.absorbed import attend_absorbed, dense_weight
from mla_func.kernels.attention.cache_write import write_cache
from mla_func.kernels.attention.decode import DecodeWorkspace
from mla_func.kernels.attention.prefill import mha_prefill
from mla_func.kernels.attention.rope import mla_prologue
from mla_func.kernels.plan import KERNEL_DTYPES, attention_form
from mla_func.ops.attention_args import AttnMeta, AttnWeights
from mla_func.state import LatentCache


class TritonMLA:
    """Owns the decode workspace and the record of prefill tiles that ran out of resources;
    `run` is the backend entry point."""

    def __init__(self) -> None:
        self.workspace = DecodeWorkspace()
        self.prefill_shrunk: set[int] = set()

    def run(self, q_nope: Tensor, *args, **kwargs) -> Tensor:
        """`attend` (the backend entry point); a ValueError, not Triton's traceback, where a
        kernel's tile does not fit the GPU at an operand dtype the kernels are not tuned for."""
        try:
            return self.attend(q_nope, *args, **kwargs)
        except OutOfResources as err:
            if q_nope.dtype in KERNEL_DTYPES:
                raise
            raise ValueError(
                f"the triton attention kernels ran out of GPU {err.name} ({err.required} "
                f"needed, {err.limit} there) with {str(q_nope.dtype)[6:]} weights; they are "
                "tuned for bf16/fp16: load the weights in bfloat16 or float16, or use "
                "attention_backend='torch'") from None

    def attend(
        self,
        q_nope: Float[Tensor, "tokens heads qk_nope"],
        q_pe: Float[Tensor, "tokens heads qk_rope"],
        kv: Float[Tensor, "tokens latent"],
        cache: LatentCache,
        layer: int,
        w: AttnWeights,
        m: AttnMeta,
        out: Float[Tensor, "tokens heads v_head"] | None = None,
    ) -> Float[Tensor, "tokens heads v_head"]:
        """The op's result, written into `out` when given (the kernels' output stores and
        the value product write there: no copy)."""
        layer_cache = cache[layer]
        num_tokens, num_seqs, num_decodes, max_seq_len, max_query_len = m.host.tolist()
        if attention_form(max_query_len, m.mha_min_query) == "absorbed":
            # Shapes only from here on: this is the path a captured decode graph holds. Only
            # decode steps use the long-lived workspace; a prefill's (eager, maybe thousands
            # of rows) is freed after the call.
            ws = self.workspace if num_decodes == num_seqs else DecodeWorkspace()
            # The prologue and the cache write ride in the launch that absorbs the query.
            new = NewRows(q_pe, kv, m.slot_mapping, m.positions, w.kv_norm, w.inv_freq,
                          w.rope_scale, w.eps)
            return attend_absorbed(q_nope, None, layer_cache, *w.absorbed(), m.token_seq,
                                   m.positions, m.page_table, w.scale, ws, new=new, out=out)
        q_pe, kv_new = mla_prologue(q_pe, kv, w.kv_norm, m.positions, w.inv_freq, w.rope_scale,
                                    w.eps)
        write_cache(layer_cache, kv_new, m.slot_mapping, w.kv_norm.shape[0])
        w_uk, w_uv = (dense_weight(x, q_nope.dtype) for x in w.absorbed())
        if out is None:
            out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w.w_uv.shape[1])
        out[num_tokens:].zero_()  # rows past the host count (none when the caller is the op)
        d = num_decodes
        if d:
            attend_absorbed(
                q_nope[:d], q_pe[:d], layer_cache, w_uk, w_uv, m.token_seq[:d],
                m.positions[:d], m.page_table, w.scale, DecodeWorkspace(), out=out[:d])
        rows = slice(d, num_tokens)
        mha_prefill(
            q_nope[rows], q_pe[rows], layer_cache, w_uk, w_uv, m.token_seq[rows],
            m.positions[rows], m.page_table[d:num_seqs], w.scale, max_seq_len, max_query_len,
            first_seq=d, out=out[rows], shrunk=self.prefill_shrunk)
        return out


__all__ = ["TritonMLA"]
