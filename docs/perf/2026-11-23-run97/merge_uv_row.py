"""The split-KV merge of the absorbed MLA decode fused with the value up-projection: the last
two steps of DeepSeek-V2's absorbed attention (arXiv:2405.04434, section 2.1.2) in one launch,
for small decode batches.

`mla_merge` merges the partials into o_lat (the latent output, [heads, tokens, kv_lora]) and
a cuBLAS bmm then multiplies it by W_UV into o ([tokens, heads, v_head]): at a few rows that
bmm is a launch of its own (3-4 us on an H100 for 2 MB of weights) between the merge and
o_proj. Here one program per (row, head, block of BLOCK_V value columns) merges the row's
partials for that head as `merge_tile` does (weights 2^(lse_s - top) over the splits the row
reaches, CHUNK splits at a time; empty splits never read), rounds o_lat to the cache dtype as
the o_lat buffer would, and multiplies it by its BLOCK_V rows of the head's W_UV (fp32
products and sums), writing o. o_lat never goes to memory. Launched as a programmatic
dependent of the split kernel (sm90), a program loads its W_UV rows before it waits, so the
weights are read while the split kernel runs.

Each program reads its head's W_UV rows again per row, and its row's reached splits again per
block of value columns, so this pays at one row and a few splits only (`decode_plan`'s
UV_MAX_ROWS, UV_MAX_SPLITS); elsewhere the merge + bmm stays, where one GEMM reads W_UV once
and the merge spreads a row's splits over many programs. An earlier form, blocks of 16 rows
multiplied on the tensor cores, was slower than the merge + bmm at every batch size
(docs/perf/2026-11-23-run97/merge_uv_dot.py).
"""

from typing import no_type_check

import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.kernels.mla_merge import ACTIVE_MIN_SPLITS, reached_splits

# Value columns a program writes (W_UV: BLOCK_V x kv_lora, 8 KiB in bf16), warps, and the fp32
# partials it loads at once (64 a thread at 4 warps). H100, V2-Lite whole-step graphs, B=1,
# ctx 1024, ms synced / back to back against the merge + bmm (docs/perf/2026-11-23-h100-run101,
# run102, run105): 8 columns 2.594 / 2.583, 2.588 / 2.583 and 2.590 / 2.577 against 2.626 /
# 2.608, 2.614 / 2.607 and 2.616 / 2.602; 16 columns 2.657 / 2.643, 16 at 8 warps with 16384
# partials 2.591 / 2.579, 32 at 8 warps 2.600 / 2.589, 2.600 / 2.588 and 2.595 / 2.581, with
# 16384 partials 2.667 / 2.659; 64 at 8 warps with 16384 partials 2.627 / 2.612 and 2.611 /
# 2.604.
BLOCK_V = 8
NUM_WARPS = 4
SPLIT_TILE = 8192  # fp32 partials a program holds at once (64 a thread at 4 warps)


@triton.jit(do_not_specialize=["num_splits"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _merge_uv_kernel(
    part_o, part_lse, positions, w_uv, out, heads, kv_lora, v_head, num_splits,
    s_wh, s_wv, so_t, so_h,
    BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, SPLITS_P2: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, ACTIVE: tl.constexpr, PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    c = tl.arange(0, BLOCK_C)
    vm, cm = v < v_head, c < kv_lora
    # W_UV does not depend on the split kernel: loaded while it runs (launched early).
    wt = tl.load(w_uv + h * s_wh + v[:, None] * s_wv + c[None, :],
                 mask=vm[:, None] & cm[None, :], other=0.0)
    active = num_splits  # splits past the row's keys wrote lse = -inf: they weigh 0
    if ACTIVE:  # ...and are not read (the positions are the split kernel's input)
        active = reached_splits(positions, t, num_splits, BLOCK_N)
    if PDL:
        tl.extra.cuda.gdc_wait()
    base = (t * heads + h) * num_splits
    s = tl.arange(0, SPLITS_P2)
    lse = tl.load(part_lse + base + s, mask=s < active, other=float("-inf"))
    top = tl.max(lse, 0)
    total = tl.sum(tl.exp2(lse - top), 0)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for s0 in range(0, active, CHUNK):  # CHUNK splits of the row at a time, as merge_tile
        sc = s0 + tl.arange(0, CHUNK)
        live = sc < active
        w = tl.exp2(tl.load(part_lse + base + sc, mask=live, other=float("-inf")) - top)
        po = tl.load(part_o + (base + sc)[:, None] * kv_lora + c[None, :],
                     mask=live[:, None] & cm[None, :], other=0.0)
        # where(w > 0, ...), not w * po: an empty split's partial is never written (NaN).
        acc += tl.sum(tl.where(w[:, None] > 0, w[:, None] * po, 0.0), 0)
    safe = tl.where(total > 0, total, 1.0)
    o_lat = (acc / safe).to(w_uv.dtype.element_ty)  # rounded as the o_lat buffer holds it
    o = tl.sum(wt.to(tl.float32) * o_lat.to(tl.float32)[None, :], 1)  # [BLOCK_V], fp32
    tl.store(out + t * so_t + h * so_h + v, o.to(out.dtype.element_ty), mask=vm)


def merge_uv_launch(
    part_o: Float[Tensor, "tokens heads _ kv_lora"],
    part_lse: Float[Tensor, "tokens heads _"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool = False,
) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the fused merge (the sm90 compile test reads
    the same)."""
    tokens, heads, splits, kv_lora = part_o.shape
    v_head = w_uv.shape[1]
    assert w_uv.shape == (heads, v_head, kv_lora) and w_uv.stride(-1) == 1
    assert w_uv.stride(1) == kv_lora and out.stride(-1) == 1
    block_c, p2 = triton.next_power_of_2(kv_lora), triton.next_power_of_2(splits)
    grid = (tokens, heads, triton.cdiv(v_head, BLOCK_V))
    args = (part_o, part_lse, positions, w_uv, out, heads, kv_lora, v_head, splits,
            w_uv.stride(0), w_uv.stride(1), out.stride(0), out.stride(1))
    kwargs = dict(BLOCK_V=BLOCK_V, BLOCK_C=block_c, SPLITS_P2=p2,
                  CHUNK=min(p2, max(1, SPLIT_TILE // block_c)), BLOCK_N=block_n,
                  ACTIVE=splits >= ACTIVE_MIN_SPLITS, PDL=pdl, num_warps=NUM_WARPS,
                  **({"launch_pdl": True} if pdl else {}))
    return grid, args, kwargs


def merge_uv(
    part_o: Float[Tensor, "tokens heads _ kv_lora"],
    part_lse: Float[Tensor, "tokens heads _"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"],
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool = False,
) -> Float[Tensor, "tokens heads v_head"]:
    """o[t, h] = (LSE merge of row t's partials for head h, in w_uv's dtype) @ W_UV[h]^T, into
    `out` (any strides with unit last); `block_n`: the split kernel's key block (from which a
    row's reached splits follow). `pdl`: launched as a programmatic dependent of the split
    kernel (sm90; it triggers it)."""
    if part_o.shape[2] < 2:
        raise ValueError("merge_uv merges split partials: a single split writes o_lat itself")
    grid, args, kwargs = merge_uv_launch(part_o, part_lse, positions, w_uv, out, block_n, pdl)
    _merge_uv_kernel[grid](*args, **kwargs)
    return out
