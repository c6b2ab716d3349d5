"""The Triton backend's absorbed MLA attention (DeepSeek-V2, arXiv:2405.04434, 2.1 and
appendix C): the absorbed query q_lat = q_nope . W_UK, the paged split-KV decode over the latent
cache (decode.py, or decode_ws.py's warp-specialised kernel), the LSE merge, and the
value product o = o_lat . W_UV^T, for decodes and short extends (one row per token).

The absorbed query is a cuBLAS bmm, or, given the step's new rows as the input projection left
them (`absorb.NewRows`), one launch of absorb.py that computes it and runs their prologue (q_pe
rotated, cache rows normed, rotated and written) in the same grid (the backend's decode path).
The value product is a cuBLAS bmm written straight in [tokens, heads, v_head] order, or, where
the plan says `uv` (a few rows), part of the merge itself (merge_uv.py). The products run in the
cache's dtype, or for an FP8 cache (`cache_fp8`) in the query's, which its tiles dequantise to.
Block-FP8 W_UK / W_UV (`fp8.Fp8Weight`: params built so; block-FP8 params hold them float,
`fp8_params.ABSORBED`) are read as e4m3 by the fused launches (absorb.py dequantises each tile
as it loads it: the bits of the weight dequantised first; merge_uv.py scales its e4m3
product); the cuBLAS products take them dequantised first (`dense_weight`).
"""

import torch
from jaxtyping import Float
from torch import Tensor

from mla_func.cache_fp8 import compute_dtype, is_fp8
from mla_func.fp8 import Fp8Weight
from mla_func.kernels.attention.absorb import NewRows, absorb_prologue
from mla_func.kernels.attention.decode import mla_decode
from mla_func.kernels.attention.decode_plan import (
    DecodePlan,
    DecodeWorkspace,
    PageTable,
    RopeRows,
    RowIndex,
    num_sms,
    pdl,
    plan_decode,
)
from mla_func.kernels.attention.decode_ws import device_ok as ws_device
from mla_func.kernels.attention.merge_uv import merge_uv, shares_numel
from mla_func.kernels.linear.fp8_dequant import fp8_dequantize_op
from mla_func.ops.attention import CacheLayer


def dense_weight(w: Tensor | Fp8Weight, dtype: torch.dtype) -> Tensor:
    """w as a float tensor: a block-FP8 weight dequantised to `dtype` in one launch
    (`linear.fp8_dequant`, `fp8.dequantize`'s bits), a float one as it is."""
    if isinstance(w, Fp8Weight):
        return fp8_dequantize_op(w.data, w.scales, *w.block, dtype).reshape(w.shape)
    return w


def attend_absorbed(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: RopeRows | None,
    cache: CacheLayer,
    w_uk: Float[Tensor, "heads qk_nope kv_lora"] | Fp8Weight,
    w_uv: Float[Tensor, "heads v_head kv_lora"] | Fp8Weight,
    token_seq: RowIndex,
    positions: RowIndex,
    page_table: PageTable,
    scale: float,
    workspace: DecodeWorkspace,
    plan: DecodePlan | None = None,
    new: NewRows | None = None,
    out: Float[Tensor, "tokens heads v_head"] | None = None,
) -> Float[Tensor, "tokens heads v_head"]:
    """The absorbed form (same contract as mla_func.ops.attention.attend_absorbed). Without a
    plan, it is chosen from shapes only: rows and the page table's capacity. `new`: the new
    rows are not in the cache yet, and q_pe is None: their prologue (q_pe rotated, the cache
    rows written) runs first, in the launch that absorbs the query (absorb.py). `out`: the
    tensor to write the result into (returned)."""
    tokens, heads, _ = q_nope.shape
    kv_lora = w_uk.shape[-1]
    if (q_pe is None) == (new is None):
        raise ValueError("attend_absorbed takes either q_pe or the new rows' prologue")
    if plan is None:
        capacity = page_table.shape[1] * cache.shape[1]
        plan = plan_decode(tokens, capacity, num_sms(q_nope.device), heads,
                           page_size=cache.shape[1], ws=ws_device(q_nope.device),
                           fp8=is_fp8(cache), dtype=q_nope.dtype)
    dtype = compute_dtype(cache, q_nope.dtype)
    q_lat, o_lat, part_o, part_lse = workspace.get(
        q_nope.device, dtype, tokens, heads, kv_lora, plan.num_splits)
    scratch = None
    if plan.shared_p:
        scratch = workspace.shared_p(q_nope.device, dtype, tokens, heads, plan)
    if new is None:
        torch.bmm(q_nope.transpose(0, 1).to(dtype),
                  dense_weight(w_uk, q_nope.dtype).to(dtype), out=q_lat)
    else:  # an earlier launch on the stream: the split kernel sees the new rows
        q_pe = workspace.q_pe(q_nope.device, new.q_pe.dtype, tokens, heads, new.q_pe.shape[-1])
        absorb_prologue(q_nope, w_uk, q_lat, q_pe, cache, new)
    uv = plan.uv and plan.num_splits > 1
    if not (uv and isinstance(w_uv, Fp8Weight)):  # the fused merge reads e4m3 itself
        w_uv = dense_weight(w_uv, q_nope.dtype).to(dtype)
    warm = w_uv.data if isinstance(w_uv, Fp8Weight) else w_uv
    mla_decode(q_lat, q_pe, cache, page_table, token_seq, positions, scale, plan, o_lat,
               part_o, part_lse, scratch, warm=warm, merge=not uv, shrunk=workspace.shrunk)
    # Written straight in [tokens, heads, v_head] order (cuBLAS takes the strided output), so
    # o_proj reads it without a transposing copy.
    o = out if out is not None and out.dtype == dtype else torch.empty(
        tokens, heads, w_uv.shape[1], dtype=dtype, device=q_nope.device)
    if uv:  # the merge multiplies by W_UV itself: no o_lat, no bmm launch
        dev, v_head = q_nope.device, w_uv.shape[1]
        merge_uv(part_o, part_lse, positions, w_uv, o, workspace.effective(plan).block_n,
                 pdl(plan, dev), workspace.shares(dev, shares_numel(tokens, heads, kv_lora,
                                                                     v_head)),
                 workspace.counters(dev, tokens * heads))
    else:
        torch.bmm(o_lat, w_uv.transpose(1, 2), out=o.transpose(0, 1))
    if out is None:
        return o.to(q_nope.dtype)
    return out if o is out else out.copy_(o)
