"""MLA prefill/extend in the MHA form: expand keys and values per sequence, then causal flash
attention in Triton over cached prefix + new tokens.

DeepSeek-V2 (arXiv:2405.04434, 2.1): k_nope = c_kv . W_UK^T and v = c_kv . W_UV^T per head;
the rope key k_pe is shared by all heads and read straight from the latent rows. For long
prompts this costs fewer FLOPs than the absorbed form (head dims 192/128 instead of 576/512).
The kernel is FlashAttention-2 (Dao, 2023) with the query/key dot split into its nope and rope
parts, so neither head dim needs padding to a power of two beyond its own.

Short extends use the absorbed form instead (`mla_absorbed.attend_absorbed`, one row per token).
The form and the grid come from host metadata (max_seq_len, max_query_len), so this path is
eager-only: it is not part of a captured decode graph. An FP8 cache (`cache_fp8`) is read
through a dequantising gather (`unpack_rows`, in torch) into rows of the weights' dtype, which
the expansion multiplies anyway: the kernel reads float rows either way.
"""

import warnings
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor
from triton.runtime.errors import OutOfResources

from mla_func.cache_fp8 import is_fp8, unpack_rows
from mla_func.ops.attention import CacheLayer


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _mha_kernel(
    q_nope, q_pe, k_nope, lat, v, out, positions, q_start, q_len,
    sqn_t, sqn_h, sqp_t, sqp_h, sk_s, sk_l, sk_h, sl_s, sl_l, sv_s, sv_l, sv_h, so_t, so_h,
    kv_lora, d_nope, d_rope, d_v, kv_cap, scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DN: tl.constexpr,
    BLOCK_DR: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    qs = tl.load(q_start + s)
    ql = tl.load(q_len + s)
    i = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    im = i < ql
    rows = (qs + i).to(tl.int64)
    pos = tl.load(positions + rows, mask=im, other=0).to(tl.int32)
    dn = tl.arange(0, BLOCK_DN)
    dr = tl.arange(0, BLOCK_DR)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_nope + rows[:, None] * sqn_t + h * sqn_h + dn[None, :],
                mask=im[:, None] & (dn < d_nope)[None, :], other=0.0)
    qp = tl.load(q_pe + rows[:, None] * sqp_t + h * sqp_h + dr[None, :],
                 mask=im[:, None] & (dr < d_rope)[None, :], other=0.0)
    q = q.to(k_nope.dtype.element_ty)
    qp = qp.to(k_nope.dtype.element_ty)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    hi = tl.minimum(tl.max(tl.where(im, pos, -1), 0) + 1, kv_cap)
    for n0 in range(0, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < hi
        k = tl.load(k_nope + s * sk_s + n[:, None] * sk_l + h * sk_h + dn[None, :],
                    mask=nm[:, None] & (dn < d_nope)[None, :], other=0.0)
        kp = tl.load(lat + s * sl_s + n[:, None] * sl_l + kv_lora + dr[None, :],
                     mask=nm[:, None] & (dr < d_rope)[None, :], other=0.0)
        vv = tl.load(v + s * sv_s + n[:, None] * sv_l + h * sv_h + dv[None, :],
                     mask=nm[:, None] & (dv < d_v)[None, :], other=0.0)
        sc = tl.dot(q, tl.trans(k)) + tl.dot(qp, tl.trans(kp.to(k.dtype)))
        ok = nm[None, :] & (n[None, :] <= pos[:, None])
        sc = tl.where(ok, sc * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, 1))
        # Rows past the query end have no key; keep their arithmetic finite.
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(sc - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
        m = m_new
    o = acc / tl.where(lsum > 0, lsum, 1.0)[:, None]
    tl.store(out + rows[:, None] * so_t + h * so_h + dv[None, :], o.to(out.dtype.element_ty),
             mask=im[:, None] & (dv < d_v)[None, :])


def query_ranges(
    token_seq: Int[Tensor, " tokens"], num_seqs: int, first_seq: int = 0
) -> tuple[Int[Tensor, " seqs"], Int[Tensor, " seqs"]]:
    """(first token, token count) of sequences first_seq.. on the device, without a host
    read: tokens of one sequence are contiguous and sequences come in order (Batch)."""
    ids = torch.arange(first_seq, first_seq + num_seqs, device=token_seq.device,
                       dtype=token_seq.dtype)
    start = torch.searchsorted(token_seq, ids)
    end = torch.searchsorted(token_seq, ids, right=True)
    return start, end - start


def expand_kv(
    cache: CacheLayer,
    page_table: Int[Tensor, "seqs max_pages"],
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    max_seq_len: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(latent rows [seqs, L, latent], k_nope [seqs, L, heads, qk_nope],
    v [seqs, L, heads, v_head]) for the first L >= max_seq_len keys of each sequence."""
    page_size = cache.shape[1]
    pages = -(-max_seq_len // page_size)
    lat = cache[page_table[:, :pages].long()].flatten(1, 2)
    heads, d_nope, kv_lora = w_uk.shape
    if is_fp8(lat):
        lat = unpack_rows(lat, kv_lora, w_uk.dtype)
    c_kv = lat[..., :kv_lora].to(w_uk.dtype)
    k_nope = (c_kv @ w_uk.reshape(heads * d_nope, kv_lora).T).unflatten(-1, (heads, d_nope))
    v = (c_kv @ w_uv.reshape(-1, kv_lora).T).unflatten(-1, (heads, w_uv.shape[1]))
    return lat, k_nope, v


def mha_prefill(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: CacheLayer,
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    scale: float,
    max_seq_len: int,
    max_query_len: int,
    first_seq: int = 0,
    block_m: int = 128,
    block_n: int = 64,
    out: Float[Tensor, "tokens heads v_head"] | None = None,
    shrunk: set[int] | None = None,
) -> Float[Tensor, "tokens heads v_head"]:
    """Causal attention of each token over keys 0..positions[t] of its sequence, MHA form.
    `shrunk`: the query-row tiles that ran out of resources, each warned of once (the
    backend's record; default: a fresh one).
    `page_table` rows are the sequences first_seq.. that `token_seq` names; the two host
    counts size the expansion buffer and the grid. `out`: where the kernel stores the result
    (any strides with a unit last one; returned), else a new tensor."""
    tokens, heads, d_nope = q_nope.shape
    num_seqs = page_table.shape[0]
    d_rope, d_v, kv_lora = q_pe.shape[-1], w_uv.shape[1], w_uk.shape[-1]
    lat, k_nope, v = expand_kv(cache, page_table, w_uk, w_uv, max_seq_len)
    q_start, q_len = query_ranges(token_seq, num_seqs, first_seq)
    if out is None:
        out = torch.empty(tokens, heads, d_v, device=q_nope.device, dtype=q_nope.dtype)
    elif out.shape != (tokens, heads, d_v) or out.stride(-1) != 1:
        raise ValueError(f"prefill out is {tuple(out.shape)} with strides {out.stride()}; "
                         f"expected {(tokens, heads, d_v)} with a unit last stride")
    if tokens == 0:
        return out
    assert q_nope.stride(-1) == 1 and q_pe.stride(-1) == 1
    shrunk = set() if shrunk is None else shrunk
    while True:
        grid = (triton.cdiv(max_query_len, block_m), heads, num_seqs)
        try:
            _mha_kernel[grid](
                q_nope, q_pe, k_nope, lat, v, out, positions, q_start, q_len,
                q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
                k_nope.stride(0), k_nope.stride(1), k_nope.stride(2),
                lat.stride(0), lat.stride(1), v.stride(0), v.stride(1), v.stride(2),
                out.stride(0), out.stride(1),
                kv_lora, d_nope, d_rope, d_v, lat.shape[1], scale * 1.4426950408889634,
                BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_DN=max(16, triton.next_power_of_2(d_nope)),
                BLOCK_DR=max(16, triton.next_power_of_2(d_rope)),
                BLOCK_DV=max(16, triton.next_power_of_2(d_v)),
                num_warps=8 if block_m >= 128 else 4, num_stages=2,
            )
            return out
        except OutOfResources:
            if block_m <= 16:
                raise
            if block_m not in shrunk:  # said once per tile size and record
                shrunk.add(block_m)
                warnings.warn(f"the MLA prefill kernel ran out of GPU resources at {block_m} "
                              f"query rows a program; it runs {block_m // 2}", RuntimeWarning,
                              stacklevel=2)
            block_m //= 2


def prefill_flops(
    query_lens: list[int], seq_lens: list[int], heads: int, d_nope: int, d_rope: int,
    d_v: int, kv_lora: int,
) -> int:
    """Useful FLOPs of the MHA form: causal scores and values, plus the K/V expansion."""
    total = 0
    for q, s in zip(query_lens, seq_lens, strict=True):
        ctx = s - q
        pairs = q * ctx + q * (q + 1) // 2
        total += 2 * heads * pairs * (d_nope + d_rope + d_v)
        total += 2 * s * kv_lora * heads * (d_nope + d_v)
    return total
