"""The FP8 latent cache's row in Triton: quantise and store one row, load dequantised tiles.

The layout is `mla_func.cache_fp8`'s (FlashMLA's: [kv_lora e4m3 | float32 scale a group |
rope bf16], 656 bytes at V2/V3's sizes); the torch reference is its `pack_rows` /
`unpack_rows`, and these follow it operation for operation (amax in float32, scale =
amax / 448, values divided by it, clamped, rounded to nearest even e4m3), so a row written here
is the row `pack_rows` writes. A row pointer is a uint8 pointer to the row's first byte; the
scales and the rope values are read through pointers recast to their dtypes, never through a
second tensor of the same storage (the interpreter copies each argument's storage back whole).

Rounding is done in arithmetic (`kernels.e4m3.round_e4m3`, `to_bf16`): Triton's interpreter
does not round to nearest even (3.9: float32 -> bf16 truncates, float32 -> e4m3 drops the
carry into the exponent), so a cast would write other bytes there than on a GPU and in torch;
rounded first, the casts only carry exact values. Divisions are IEEE (`div_rn`), as torch's.

`load_latent` dequantises a tile in registers (e4m3 -> float32, times the row's group
scale), which the split-KV decode at 64 heads a program (decode.py) then multiplies as a float
cache's tiles; at 16 heads decode_fp8.py reads the rows itself, the scales on its scores.
Block-FP8 W_UK / W_UV reach the decode's other
launches (absorb.py, merge_uv.py) as e4m3 values and block scales: `weight_args` passes
them, `weight_scales` loads a tile's scales and `weight_tile` dequantises it
(`e4m3.dequantize`).
"""

from typing import no_type_check

import triton
import triton.language as tl
from torch import Tensor

from mla_func.cache_fp8 import GROUP, is_fp8, layout_of
from mla_func.fp8 import Fp8Weight
from mla_func.kernels.e4m3 import E4M3_MAX, block_scales, dequantize, round_e4m3


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def store_latent(row, y, slot, BLOCK_C: tl.constexpr, GS: tl.constexpr,
                 KV_LORA: tl.constexpr, GROUPS: tl.constexpr):
    """Quantise c_kv `y` (float32 [BLOCK_C], zero past KV_LORA) into the row at `row`: its
    e4m3 values and one float32 scale a group of GS values (GROUPS of them); nothing where
    the token's `slot` is -1 (a padded row)."""
    cols = tl.arange(0, BLOCK_C)
    groups = tl.reshape(y, [BLOCK_C // GS, GS])
    amax = tl.max(tl.abs(groups), 1)
    scale = tl.math.div_rn(amax, tl.full([BLOCK_C // GS], E4M3_MAX, tl.float32))
    scale = tl.where(amax > 0, scale, 1.0)
    q = tl.math.div_rn(groups, tl.broadcast_to(scale[:, None], [BLOCK_C // GS, GS]))
    q = round_e4m3(tl.minimum(tl.maximum(q, -E4M3_MAX), E4M3_MAX))
    q = tl.reshape(q, [BLOCK_C]).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    # Vector masks (the interpreter takes no scalar one).
    tl.store(row + cols, q, mask=(cols < KV_LORA) & ((cols * 0 + slot) >= 0))
    g = tl.arange(0, BLOCK_C // GS)
    scales = (row + KV_LORA).to(tl.pointer_type(tl.float32), bitcast=True)
    tl.store(scales + g, scale, mask=(g < GROUPS) & ((g * 0 + slot) >= 0))


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def rope_values(row, ROPE_AT: tl.constexpr):
    """A bf16 pointer to the row's rope values (byte ROPE_AT of the row at `row`)."""
    return (row + ROPE_AT).to(tl.pointer_type(tl.bfloat16), bitcast=True)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def load_latent(rows, c, nm, kv_lora, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                GS: tl.constexpr, GROUPS: tl.constexpr):
    """c_kv of BLOCK_N rows (row pointers `rows` [BLOCK_N]; columns `c`: arange(BLOCK_C)) in
    float32: e4m3 x the row's group scale; zero in rows where `nm` is false and past
    kv_lora. The scales are spread over the tile by selects in its own layout: a reshape to
    [rows, groups, GS] made the sm90 compile convert layouts through shared memory and keep
    the tile out of the pipeliner's buffers."""
    q = tl.load(rows[:, None] + c[None, :], mask=nm[:, None] & (c < kv_lora)[None, :],
                other=0)
    v = q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scales = (rows + kv_lora).to(tl.pointer_type(tl.float32), bitcast=True)
    s = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
    for g in tl.static_range(GROUPS):
        sg = tl.load(scales + g, mask=nm, other=0.0)
        s = tl.where((c // GS == g)[None, :], sg[:, None], s)
    return v * s


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def weight_scales(s_ptr, h, rows, cols, row_ok, col_ok, ss_h, ss_r, block_rows, block_cols,
                  W8: tl.constexpr):
    """The block scales of head h's `rows` x `cols` tile of a block-FP8 W_UK / W_UV, to
    broadcast over it (`weight_args`' W8: 1, one a column block, a [1, cols] row; 2, one an
    element); None for a float weight (W8 0)."""
    s = None
    if W8 == 1:
        s = tl.load(s_ptr + h * ss_h + cols // block_cols, mask=col_ok, other=0.0)[None, :]
    elif W8 == 2:
        s = block_scales(s_ptr + h * ss_h, rows, cols, row_ok[:, None] & col_ok[None, :], ss_r,
                         block_rows, block_cols)
    return s


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def weight_tile(w, s, dtype: tl.constexpr, W8: tl.constexpr):
    """A loaded tile `w` of W_UK / W_UV: a float one as it is, a block-FP8 one dequantised to
    `dtype` with its scales `s` (`weight_scales`)."""
    if W8:
        w = dequantize(w, s, dtype)
    return w


def row_constexprs(cache: Tensor, kv_lora: int | None, block_c: int) -> dict:
    """The constexprs of a kernel that reads or writes `cache`'s rows, holding c_kv in a
    block of `block_c` columns: FP8, the columns a scale covers (GS, a power of two: one group
    of up to GROUP values is padded to the block), the groups, the rope values' byte offset;
    placeholders for a float cache (`kv_lora` may then be None)."""
    if not is_fp8(cache):
        return dict(FP8=False, GS=1, GROUPS=1, ROPE_AT=0)
    if kv_lora is None:
        raise ValueError("an FP8 cache's rows are read and written knowing kv_lora")
    lay = layout_of(cache, kv_lora)
    return dict(FP8=True, GS=min(GROUP, block_c), GROUPS=lay.groups, ROPE_AT=lay.rope_at)


def weight_args(w: Tensor | Fp8Weight) -> tuple[Tensor, tuple, int]:
    """A W_UK / W_UV operand of the decode kernels (absorb.py, merge_uv.py): (its values,
    (scales, their head and row-block strides, block rows, block columns), the kernels' W8):
    W8 0 for a float weight (no scales, its numbers placeholders), 1 for a block-FP8 one
    whose head's rows are one row block (a scale a column block: V2's and V3's 128 rows a
    head in 128-row blocks), 2 for any other grid (a scale looked up an element)."""
    if not isinstance(w, Fp8Weight):
        return w, (None, 0, 0, 1, 1), 0
    if w.scales.stride(-1) != 1 or w.data.shape != w.shape:
        raise ValueError(f"block-FP8 W_UK / W_UV: data {tuple(w.data.shape)} against its "
                         f"shape {w.shape}, scales' strides {w.scales.stride()}: expected "
                         "one matrix a head and contiguous scale rows")
    w8 = 1 if w.block[0] >= w.shape[1] else 2
    return w.data, (w.scales, w.scales.stride(0), w.scales.stride(1), *w.block), w8


__all__ = ["load_latent", "rope_values", "row_constexprs", "store_latent", "weight_args",
           "weight_scales", "weight_tile"]
