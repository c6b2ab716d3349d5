"""Reference MLA attention over the paged latent cache (DeepSeek-V2, arXiv:2405.04434, 2.1).

Two forms of the same function:
- absorbed: q_lat = q_nope . W_UK per head; scores against the cached [c_kv, k_pe] with
  q' = [q_lat, q_pe]; o_lat = softmax . c_kv; o = o_lat . W_UV^T. Reads 576 values per cached
  token once for all heads: the decode form.
- MHA: expand k_nope = c_kv . W_UK^T and v = c_kv . W_UV^T per sequence, then ordinary causal
  attention with head dims (qk_nope + qk_rope, v_head): fewer FLOPs for long prompts.
Token t of sequence s sees keys 0..positions[t] of s. Padded tokens (slot -1) see key 0 of their
sequence and their output is ignored. Memory is bounded by processing tokens in chunks of
`chunk` rows; the MHA form expands one sequence's keys at a time, so that its memory grows
linearly with the prompt.

An FP8 cache (`mla_func.cache_fp8`) is written through `pack_rows` (quantised on write) and
read through `unpack_rows` (the rows each form reads, dequantised to float32): the same math on
the values the cache holds.
"""

import itertools

import torch
from jaxtyping import Bool, Float, Int, UInt8
from torch import Tensor

from mla_func.cache_fp8 import Fp8CacheLayer, is_fp8, pack_rows, unpack_rows
from mla_func.ops.norm import rmsnorm
from mla_func.ops.rope import apply_rope, rope_cos_sin

# One layer of the cache: float rows, or FP8 rows of bytes (`cache_fp8`).
CacheLayer = Float[Tensor, "pages page_size latent"] | Fp8CacheLayer
CacheRows = Float[Tensor, "*rows latent"] | UInt8[Tensor, "*rows cache_row"]


def prologue(
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    kv: Float[Tensor, "tokens latent"],
    kv_norm: Float[Tensor, " kv_lora"],
    positions: Int[Tensor, " tokens"],
    inv_freq: Float[Tensor, " qk_rope"],
    rope_scale: float,
    eps: float,
) -> tuple[Float[Tensor, "tokens heads qk_rope"], Float[Tensor, "tokens latent"]]:
    """The new tokens' rows as attention uses them, from the input projection's output: q_pe
    rotated, and the cache rows [rmsnorm(c_kv), rope(k_pe)]."""
    kv_lora = kv_norm.shape[0]
    cos, sin = rope_cos_sin(positions, inv_freq, rope_scale)
    q_pe = apply_rope(q_pe, cos, sin)
    c_kv = rmsnorm(kv[:, :kv_lora], kv_norm, eps)
    k_pe = apply_rope(kv[:, kv_lora:], cos, sin)
    return q_pe, torch.cat((c_kv, k_pe), dim=-1)


def write_cache(
    cache: CacheLayer, kv: Float[Tensor, "tokens latent"], slot_mapping: Int[Tensor, " tokens"],
    kv_lora: int | None = None,
) -> None:
    """cache[slot] = kv for slot >= 0; rows with slot -1 land in slot 0 of the scratch page.
    An FP8 cache takes the rows quantised (`pack_rows`: `kv_lora` c_kv values first)."""
    flat = cache.view(-1, cache.shape[-1])
    rows = kv.to(cache.dtype) if not is_fp8(cache) else pack_rows(kv, _kv_lora(kv_lora))
    flat.index_copy_(0, slot_mapping.clamp(min=0).long(), rows)


def _kv_lora(kv_lora: int | None) -> int:
    if kv_lora is None:
        raise ValueError("an FP8 cache's rows are read and written knowing kv_lora: pass it")
    return kv_lora


def latent_rows(rows: CacheRows, kv_lora: int) -> Float[Tensor, "*rows latent"]:
    """Cache rows as float32 [c_kv, k_pe] values: an FP8 cache's dequantised."""
    return unpack_rows(rows, kv_lora) if is_fp8(rows) else rows.float()


def gather_sequences(
    cache: CacheLayer, page_table: Int[Tensor, "seqs max_pages"]
) -> Float[Tensor, "seqs max_pages*page_size latent"] | UInt8[
        Tensor, "seqs max_pages*page_size cache_row"]:
    """Each sequence's cache rows in order (as stored: `latent_rows` reads them)."""
    return cache[page_table.long()].flatten(1, 2)


def _key_mask(positions: Int[Tensor, " tokens"], kv_len: int) -> Bool[Tensor, "tokens _"]:
    keys = torch.arange(kv_len, device=positions.device)
    return keys[None, :] <= positions.long()[:, None]


def attend_absorbed(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: CacheLayer,
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    scale: float,
    chunk: int = 256,
) -> Float[Tensor, "tokens heads v_head"]:
    kv_lora = w_uk.shape[-1]
    kv_all = latent_rows(gather_sequences(cache, page_table), kv_lora)
    q_lat = torch.einsum("thn,hnc->thc", q_nope.float(), w_uk.float())
    outs = []
    for lo in range(0, q_nope.shape[0], chunk):
        rows = slice(lo, lo + chunk)
        kv = kv_all[token_seq[rows].long()]
        scores = torch.einsum("thc,tsc->ths", q_lat[rows], kv[..., :kv_lora])
        scores += torch.einsum("thr,tsr->ths", q_pe[rows].float(), kv[..., kv_lora:])
        mask = _key_mask(positions[rows], kv.shape[1])
        probs = (scores * scale).masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
        outs.append(torch.einsum("ths,tsc->thc", probs, kv[..., :kv_lora]))
    o_lat = torch.cat(outs)
    return torch.einsum("thc,hvc->thv", o_lat, w_uv.float()).to(q_nope.dtype)


def sequence_runs(token_seq: Int[Tensor, " tokens"]) -> list[tuple[int, int, int]]:
    """(sequence, first row, rows) of each run of consecutive rows that belong to one sequence
    (a step's rows come sequence by sequence). Read on the host: free on the CPU, one small
    copy on a GPU."""
    seqs, counts = torch.unique_consecutive(token_seq, return_counts=True)
    seqs, counts = torch.stack((seqs.long(), counts.long())).tolist()
    starts = [0, *itertools.accumulate(counts)][:-1]
    return list(zip(seqs, starts, counts, strict=True))


def attend_mha(
    q_nope: Float[Tensor, "tokens heads qk_nope"],
    q_pe: Float[Tensor, "tokens heads qk_rope"],
    cache: CacheLayer,
    w_uk: Float[Tensor, "heads qk_nope kv_lora"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    token_seq: Int[Tensor, " tokens"],
    positions: Int[Tensor, " tokens"],
    page_table: Int[Tensor, "seqs max_pages"],
    scale: float,
    chunk: int = 256,
) -> Float[Tensor, "tokens heads v_head"]:
    """The MHA form, one sequence at a time: its keys and values expanded once (not once per
    query row), then its rows `chunk` at a time against them. Memory grows linearly with the
    prompt: [keys, heads, qk_nope + v_head] for the expanded sequence and [chunk, heads, keys]
    for the scores. The rows' sequences are read on the host (`sequence_runs`): this form runs
    eagerly (a step holding a long prompt), never inside a graph."""
    kv_lora = w_uk.shape[-1]
    w_uk, w_uv = w_uk.float(), w_uv.float()
    out = torch.empty(*q_nope.shape[:2], w_uv.shape[1], device=q_nope.device)
    for seq, first, count in sequence_runs(token_seq):
        kv = latent_rows(cache[page_table[seq].long()].flatten(0, 1), kv_lora)
        # Expanded keys and values of this sequence: the MHA form's whole point.
        k_nope = torch.einsum("sc,hnc->shn", kv[:, :kv_lora], w_uk)
        k_pe = kv[:, kv_lora:]
        v = torch.einsum("sc,hvc->shv", kv[:, :kv_lora], w_uv)
        for lo in range(first, first + count, chunk):
            rows = slice(lo, min(lo + chunk, first + count))
            scores = torch.einsum("thn,shn->ths", q_nope[rows].float(), k_nope)
            scores += torch.einsum("thr,sr->ths", q_pe[rows].float(), k_pe)
            mask = _key_mask(positions[rows], kv.shape[0])
            # In place: the [chunk, heads, keys] scores are this form's largest buffers.
            probs = scores.mul_(scale).masked_fill_(~mask[:, None, :], float("-inf")).softmax(-1)
            del scores  # freed before the value product copies `probs` and `v` head-major
            out[rows] = torch.einsum("ths,shv->thv", probs, v)
    return out.to(q_nope.dtype)
