"""The split-KV merge of the absorbed MLA decode fused with the value up-projection: the last
two steps of DeepSeek-V2's absorbed attention (arXiv:2405.04434, section 2.1.2) in one launch.

`mla_merge` merges the partials into o_lat (the latent output, [heads, tokens, kv_lora]) and
a cuBLAS bmm then multiplies it by W_UV into o ([tokens, heads, v_head]). At decode sizes that
bmm is a launch of its own (3-4 us on an H100 for 2 MB of weights) between the merge and
o_proj. Here one program per (block of ROWS rows, head, block of BLOCK_V value columns)
merges its rows' partials for that head, exactly as the tile merge does (weights 2^(lse_s -
top) over the splits the row reaches, empty splits never read), rounds o_lat to the cache
dtype as the o_lat buffer would, and multiplies it by its head's W_UV rows on the tensor cores
(fp32 accumulation), writing o. o_lat never goes to memory.

Launched as a programmatic dependent of the split kernel (sm90), the program bulk-prefetches
its W_UV rows into L2 before it waits (`l2_prefetch`), then reads them after the merge. The
split count is fixed per captured bucket; rows past `tokens` are masked and read nothing.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.kernels.l2_prefetch import prefetch_span
from mla_func.kernels.mla_merge import ACTIVE_MIN_SPLITS, split_chunk

ROWS = 16  # rows a program merges: tl.dot's smallest M
BLOCK_V = 32  # value columns a program writes (W_UV: BLOCK_V x kv_lora, 32 KiB in bf16)
NUM_WARPS = 4


@triton.jit(do_not_specialize=["tokens", "num_splits"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _merge_uv_kernel(
    part_o, part_lse, positions, w_uv, out, tokens, heads, kv_lora, v_head, num_splits,
    s_wh, s_wv, so_t, so_h,
    ROWS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
    SPLITS_P2: tl.constexpr, BLOCK_N: tl.constexpr, ACTIVE: tl.constexpr, PDL: tl.constexpr,
    WARM: tl.constexpr, ELEM: tl.constexpr, PRECISION: tl.constexpr,
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    h = tl.program_id(1)
    v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    c = tl.arange(0, BLOCK_C)
    rm, vm, cm = r < tokens, v < v_head, c < kv_lora
    w_rows = w_uv + h * s_wh + v[:, None] * s_wv + c[None, :]
    if WARM:  # W_UV does not depend on the split kernel: into L2 while it runs
        nbytes = tl.minimum(BLOCK_V, v_head - tl.program_id(2) * BLOCK_V) * s_wv * ELEM
        prefetch_span(w_uv + h * s_wh + tl.program_id(2) * BLOCK_V * s_wv, nbytes, 0, 1, 128)
    active = tl.zeros([ROWS], tl.int32) + num_splits  # splits past a row's keys: lse = -inf
    if ACTIVE:  # ...not read at all (the positions are the split kernel's input)
        kv_len = tl.load(positions + r, mask=rm, other=0).to(tl.int32) + 1
        active = tl.cdiv(kv_len, split_chunk(kv_len, num_splits, BLOCK_N))
    if PDL:
        tl.extra.cuda.gdc_wait()
    base = (r.to(tl.int64) * heads + h) * num_splits  # [ROWS]
    s = tl.arange(0, SPLITS_P2)
    live = rm[:, None] & (s[None, :] < active[:, None])
    lse = tl.load(part_lse + base[:, None] + s[None, :], mask=live, other=float("-inf"))
    top = tl.max(lse, 1)
    top = tl.where(top > float("-inf"), top, 0.0)  # masked rows: no NaN from -inf - -inf
    total = tl.sum(tl.exp2(lse - top[:, None]), 1)
    acc = tl.zeros([ROWS, BLOCK_C], tl.float32)
    for j in range(0, tl.max(tl.where(rm, active, 0), 0)):
        on = rm & (j < active)
        w = tl.exp2(tl.load(part_lse + base + j, mask=on, other=float("-inf")) - top)
        po = tl.load(part_o + (base + j)[:, None] * kv_lora + c[None, :],
                     mask=on[:, None] & cm[None, :], other=0.0)
        # where(w > 0, ...), not w * po: an empty split's partial is never written (NaN).
        acc += tl.where(w[:, None] > 0, w[:, None] * po, 0.0)
    safe = tl.where(total > 0, total, 1.0)
    o_lat = (acc / safe[:, None]).to(w_uv.dtype.element_ty)  # as the o_lat buffer holds it
    wt = tl.load(w_rows, mask=vm[:, None] & cm[None, :], other=0.0)
    o = tl.dot(o_lat, tl.trans(wt), input_precision=PRECISION)  # [ROWS, BLOCK_V], fp32 acc
    tl.store(out + r[:, None].to(tl.int64) * so_t + h * so_h + v[None, :],
             o.to(out.dtype.element_ty), mask=rm[:, None] & vm[None, :])


def merge_uv_launch(
    part_o: Float[Tensor, "tokens heads splits kv_lora"],
    part_lse: Float[Tensor, "tokens heads splits"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool = False,
    warm: bool = False,
) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the fused merge (the sm90 compile test reads
    the same). `warm` (with `pdl`): prefetch each program's W_UV rows into L2 first."""
    tokens, heads, splits, kv_lora = part_o.shape
    v_head = w_uv.shape[1]
    assert w_uv.shape == (heads, v_head, kv_lora) and w_uv.stride(-1) == 1
    assert w_uv.stride(1) == kv_lora and out.stride(-1) == 1
    elem = w_uv.element_size()
    warm = warm and pdl and w_uv.data_ptr() % 16 == 0 and kv_lora * elem % 16 == 0
    grid = (triton.cdiv(tokens, ROWS), heads, triton.cdiv(v_head, BLOCK_V))
    args = (part_o, part_lse, positions, w_uv, out, tokens, heads, kv_lora, v_head, splits,
            w_uv.stride(0), w_uv.stride(1), out.stride(0), out.stride(1))
    kwargs = dict(ROWS=ROWS, BLOCK_V=BLOCK_V, BLOCK_C=triton.next_power_of_2(kv_lora),
                  SPLITS_P2=triton.next_power_of_2(splits), BLOCK_N=block_n,
                  ACTIVE=splits >= ACTIVE_MIN_SPLITS, PDL=pdl, WARM=warm, ELEM=elem,
                  PRECISION="ieee" if w_uv.dtype == torch.float32 else "tf32",
                  num_warps=NUM_WARPS,
                  **({"launch_pdl": True} if pdl else {}))
    return grid, args, kwargs


def merge_uv(
    part_o: Float[Tensor, "tokens heads splits kv_lora"],
    part_lse: Float[Tensor, "tokens heads splits"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool = False,
    warm: bool = False,
) -> Float[Tensor, "tokens heads v_head"]:
    """o[t, h] = (LSE merge of row t's partials for head h, in w_uv's dtype) @ W_UV[h]^T, into
    `out` (any strides with unit last); `block_n`: the split kernel's key block (from which a
    row's reached splits follow). `pdl`: launched as a programmatic dependent of the split
    kernel (sm90; it triggers it)."""
    if part_o.shape[2] < 2:
        raise ValueError("merge_uv merges split partials: a single split writes o_lat itself")
    grid, args, kwargs = merge_uv_launch(part_o, part_lse, positions, w_uv, out, block_n, pdl,
                                         warm)
    _merge_uv_kernel[grid](*args, **kwargs)
    return out
