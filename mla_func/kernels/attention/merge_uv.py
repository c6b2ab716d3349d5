"""The split-KV merge of the absorbed MLA decode fused with the value up-projection: the last
two steps of DeepSeek-V2's absorbed attention (arXiv:2405.04434, section 2.1.2) in one launch,
for small decode batches.

`mla_merge` merges the partials into o_lat (the latent output, [heads, tokens, kv_lora]) and
a cuBLAS bmm then multiplies it by W_UV into o ([tokens, heads, v_head]): at a few rows that
bmm is a launch of its own (3-4 us on an H100 for 2 MB of weights) between the merge and
o_proj. Here one program per (row, head, block of COLS kv_lora columns) merges the row's
partials for that head and those columns with `mla_merge.merged` (weights 2^(lse_s - top) over
the splits the row reaches, in one tile; empty splits never read), rounds its
o_lat columns to the cache dtype as the o_lat buffer would, and multiplies them by the same
columns of the head's W_UV: its share of o (fp32). It stores the share to scratch; the last
of the row's programs to arrive (an acq_rel counter, reset by that program) sums the shares in
column order, deterministic whatever the arrival order, and writes o. o_lat never goes to
memory. Launched as a programmatic dependent of the split kernel (sm90), a program loads its
W_UV columns before it waits, so the weights are read while the split kernel runs.

Each program reads its head's W_UV columns again per row, so this pays at a few rows only
(`decode_plan.UV_MAX_ROWS`); larger batches keep the merge + bmm, where one GEMM reads W_UV
once. Two earlier forms were measured and not kept (docs/PERF.md, "Tried and not kept"):
16-row blocks multiplied on the tensor cores (slower at every batch size), and one program per
(row, head, block of value columns) over all kv_lora columns (each program read all of the
row's splits, slower from 65 splits reached on).

A block-FP8 W_UV (`fp8.Fp8Weight`) is read as e4m3. Where a program's columns lie in one
scale block (V2's and V3's: 64 columns, blocks of 128 rows x 128 columns) the e4m3 values
multiply o_lat as they are and the share is scaled once: each weight exact (a bf16 W_UV
dequantised first rounds each to bf16), so not that path's bits. On a finer grid each tile
is dequantised to o's dtype (`e4m3.dequantize`: the dequantised weight's bits). Dequantising
the [128, 64] tile in registers spilled on sm90 (156 bytes, Triton 3.9) and, in two halves
after the merge, made the launch 6.5 us against bf16's 4.3 (H200, V2-Lite, B=1, 4527454).

Graph capture: the counters and the scratch come from the caller (`DecodeWorkspace`); the
counters must be zero before the first launch, and every launch leaves them zero.
"""

from typing import no_type_check

import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.fp8 import Fp8Weight
from mla_func.kernels.attention.fp8_rows import weight_args, weight_scales, weight_tile
from mla_func.kernels.attention.merge import ACTIVE_MIN_SPLITS, merged, reached_splits
from mla_func.kernels.launch.counters import last_to_arrive

# kv_lora columns a program merges (8 programs a row and head at V2/V3's 512; W_UV: 128 x 64 in
# bf16, 16 KiB); it loads the partials of all its splits at once (MAX_SPLITS x 64 fp32 at most).
# 32 columns were slower at every context (docs/DECISIONS.md, `merge_uv.COLS`).
COLS = 64
NUM_WARPS = 4


@triton.jit(do_not_specialize=["num_splits"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _merge_uv_kernel(
    part_o, part_lse, positions, w_uv, out, shares, counters, heads, kv_lora, v_head,
    num_splits, s_wh, s_wv, so_t, so_h, uv_s, ss_h, ss_r, block_rows, block_cols,
    BLOCK_V: tl.constexpr, COLS: tl.constexpr, COL_BLOCKS_P2: tl.constexpr,
    SPLITS_P2: tl.constexpr, BLOCK_N: tl.constexpr, ACTIVE: tl.constexpr,
    PDL: tl.constexpr, W8: tl.constexpr = 0,
):
    if PDL:  # the launch after (the output projection, proj_norm.py) loads its weights now
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cb = tl.program_id(2)
    n_cb = tl.num_programs(2)
    v = tl.arange(0, BLOCK_V)
    c = cb * COLS + tl.arange(0, COLS)
    vm, cm = v < v_head, c < kv_lora
    # W_UV does not depend on the split kernel: loaded while it runs (launched early).
    wt = tl.load(w_uv + h * s_wh + v[:, None] * s_wv + c[None, :],
                 mask=vm[:, None] & cm[None, :], other=0.0)
    ws = None
    if W8 == 1:  # block FP8, the program's columns in one column block: one scale
        ws = tl.load(uv_s + h * ss_h + (cb * COLS) // block_cols)
    elif W8 == 2:
        ws = weight_scales(uv_s, h, v, c, vm, cm, ss_h, ss_r, block_rows, block_cols, W8)
    active = num_splits  # splits past the row's keys wrote lse = -inf: they weigh 0
    if ACTIVE:  # ...and are not read (the positions are the split kernel's input)
        active = reached_splits(positions, t, num_splits, BLOCK_N)
    if PDL:
        tl.extra.cuda.gdc_wait()
    one = tl.arange(0, 1)  # the merge of one head: a [1, COLS] tile
    o_lat = tl.reshape(merged(part_o, part_lse, t, h + one, one == 0, c, cm, heads, kv_lora,
                              num_splits, active, 1, COLS, SPLITS_P2), [COLS])
    if W8 == 2:  # block FP8 on a finer grid: dequantised to o's dtype
        wt = weight_tile(wt, ws, out.dtype.element_ty, W8)
    # Rounded as the o_lat buffer holds it (W_UV's dtype; block FP8: o's).
    o_lat = o_lat.to(out.dtype.element_ty if W8 else wt.dtype)
    share = tl.sum(wt.to(tl.float32) * o_lat.to(tl.float32)[None, :], 1)  # [BLOCK_V]
    if W8 == 1:  # the e4m3 values' product, scaled once
        share = share * ws
    row = t * heads + h
    tl.store(shares + (row * COL_BLOCKS_P2 + cb) * BLOCK_V + v, share)
    cnt = counters + row
    if last_to_arrive(cnt, n_cb):  # the row's last program: the shares in column order
        k = tl.arange(0, COL_BLOCKS_P2)
        parts = tl.load(shares + (row * COL_BLOCKS_P2 + k)[:, None] * BLOCK_V + v[None, :],
                        mask=(k < n_cb)[:, None], other=0.0, cache_modifier=".cg")
        tl.store(out + t * so_t + h * so_h + v, tl.sum(parts, 0).to(out.dtype.element_ty),
                 mask=vm)
        tl.store(cnt, 0)  # zero again for the next launch (and graph replay)


def _blocks(kv_lora: int, v_head: int) -> tuple[int, int, int, int]:
    """(columns a program, column blocks, their next power of 2, v_head's next power of 2)."""
    cols = min(COLS, triton.next_power_of_2(kv_lora))
    n_cb = triton.cdiv(kv_lora, cols)
    return cols, n_cb, triton.next_power_of_2(n_cb), triton.next_power_of_2(v_head)


def shares_numel(tokens: int, heads: int, kv_lora: int, v_head: int) -> int:
    """fp32 elements of the scratch: each program's share of o."""
    _, _, cb_p2, v_p2 = _blocks(kv_lora, v_head)
    return tokens * heads * cb_p2 * v_p2


def merge_uv_launch(
    part_o: Float[Tensor, "tokens heads _ kv_lora"],
    part_lse: Float[Tensor, "tokens heads _"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"] | Fp8Weight,
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool,
    shares: Float[Tensor, " _"],
    counters: Int[Tensor, " _"],
) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keyword arguments) of the fused merge (the sm90 compile test reads
    the same)."""
    tokens, heads, splits, kv_lora = part_o.shape
    v_head = w_uv.shape[1]
    w_uv, fp8, w8 = weight_args(w_uv)
    assert w_uv.shape == (heads, v_head, kv_lora) and w_uv.stride(-1) == 1
    assert w_uv.stride(1) == kv_lora and out.stride(-1) == 1
    cols, n_cb, cb_p2, v_p2 = _blocks(kv_lora, v_head)
    if w8 == 1 and fp8[4] % cols:  # a program's columns span two scale blocks
        w8 = 2
    assert shares.numel() >= shares_numel(tokens, heads, kv_lora, v_head)
    assert counters.numel() >= tokens * heads
    p2 = triton.next_power_of_2(splits)
    args = (part_o, part_lse, positions, w_uv, out, shares, counters, heads, kv_lora, v_head,
            splits, w_uv.stride(0), w_uv.stride(1), out.stride(0), out.stride(1), *fp8)
    kwargs = dict(BLOCK_V=v_p2, COLS=cols, COL_BLOCKS_P2=cb_p2, SPLITS_P2=p2, BLOCK_N=block_n,
                  ACTIVE=splits >= ACTIVE_MIN_SPLITS, PDL=pdl, W8=w8, num_warps=NUM_WARPS,
                  **({"launch_pdl": True} if pdl else {}))
    return (tokens, heads, n_cb), args, kwargs


def merge_uv(
    part_o: Float[Tensor, "tokens heads _ kv_lora"],
    part_lse: Float[Tensor, "tokens heads _"],
    positions: Int[Tensor, " tokens"],
    w_uv: Float[Tensor, "heads v_head kv_lora"] | Fp8Weight,
    out: Float[Tensor, "tokens heads v_head"],
    block_n: int,
    pdl: bool,
    shares: Float[Tensor, " _"],
    counters: Int[Tensor, " _"],
) -> Float[Tensor, "tokens heads v_head"]:
    """o[t, h] = (LSE merge of row t's partials for head h, in W_UV's dtype; a block-FP8
    W_UV's: out's) @ W_UV[h]^T, into `out` (any strides with unit last); `block_n`: the
    split kernel's key block (from which a row's reached splits follow). `pdl`: launched as
    a programmatic dependent of the split kernel (sm90; it triggers it). `shares`: fp32
    scratch of `shares_numel` elements; `counters`: tokens * heads int32 zeros, left zero."""
    if part_o.shape[2] < 2:
        raise ValueError("merge_uv merges split partials: a single split writes o_lat itself")
    grid, args, kwargs = merge_uv_launch(part_o, part_lse, positions, w_uv, out, block_n, pdl,
                                         shares, counters)
    _merge_uv_kernel[grid](*args, **kwargs)
    return out
