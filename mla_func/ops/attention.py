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
"""

import itertools

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mla_func.ops.norm import rmsnorm
from mla_func.ops.rope import apply_rope, rope_cos_sin

CacheLayer = Float[Tensor, "pages page_size latent"]


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
    cache: CacheLayer, kv: Float[Tensor, "tokens latent"], slot_mapping: Int[Tensor, " tokens"]
) -> None:
    """cache[slot] = kv for slot >= 0; rows with slot -1 land in slot 0 of the scratch page."""
    flat = cache.view(-1, cache.shape[-1])
    flat.index_copy_(0, slot_mapping.clamp(min=0).long(), kv.to(cache.dtype))


def gather_sequences(
    cache: CacheLayer, page_table: Int[Tensor, "seqs max_pages"]
) -> Float[Tensor, "seqs max_pages*page_size latent"]:
    """Each sequence's cache rows in order."""
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
    kv_all = gather_sequences(cache, page_table).float()
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
        kv = cache[page_table[seq].long()].flatten(0, 1).float()
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
