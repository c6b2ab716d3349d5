"""Rounding to e4m3 (and bf16) in float32, before the cast: the FP8 kernels' conversions.

Every Triton kernel that writes e4m3 (the projections' and the experts' activation
quantisation, the FP8 cache's rows) rounds here first, so that the cast itself is exact and
the bits are the same on a GPU (whose cast rounds to nearest even) and in Triton's
interpreter (3.9: its float32 -> e4m3 cast drops the carry of a mantissa that rounds up into
the exponent, 31.5 -> 16, and truncates subnormals). `fp8.quantize_matrix` and the torch
references round as the GPU does. Its float32 -> bf16 cast truncates: `to_bf16` rounds to
nearest even in integer arithmetic, and `dequantize` (a block-FP8 weight's tile as the
activations' dtype, its scales per element from `block_scales`) goes through it.
"""

from typing import no_type_check

import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)  # e4m3's largest finite value


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def round_e4m3(v):
    """float32 v (|v| <= 448) rounded to nearest even on e4m3's grid (3 mantissa bits; below
    2^-6 the subnormals' fixed step 2^-9), still float32, the sign kept (-0 too)."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    ulp = ((e + 124) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3)
    inv = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3 - e)
    q = tl.abs(v) * inv  # exact: a power of two, q < 16
    q = (q + 8388608.0) - 8388608.0  # 2^23: the float32 addition rounds q to an integer
    return tl.where(bits < 0, -q, q) * ulp


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def to_e4m3(v):
    """float32 v saturated at +-448 and rounded to nearest even, as e4m3."""
    v = tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX)
    return round_e4m3(v).to(tl.float8e4nv)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def group_scales(amax):
    """(scale, inverse) of activation groups from their largest |value| (float32): DeepSeek's
    act_quant scale amax / 448 and 448 / amax, both rounded as torch divides; (1, 1) for an
    all-zero group. The values are x * inverse (`fp8.quantize_activations`): one division a
    group, not one an element."""
    e4m3_max = tl.full(amax.shape, 448.0, tl.float32)
    amax = tl.where(amax > 0, amax, e4m3_max)
    return tl.math.div_rn(amax, e4m3_max), tl.math.div_rn(e4m3_max, amax)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def to_bf16(x):
    """float32 x rounded to nearest even bf16 (finite x)."""
    b = x.to(tl.uint32, bitcast=True)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def dequantize(q, s, dtype: tl.constexpr):
    """Block-FP8 values q times their block scales s (broadcast to q) as `dtype`: a float32
    product rounded once, the bits of `fp8.dequantize` (bf16 through `to_bf16`)."""
    v = q.to(tl.float32) * s
    if dtype == tl.bfloat16:
        out = to_bf16(v)
    else:
        out = v.to(dtype)
    return out


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def block_scales(s_ptr, rows, cols, mask, stride_row, block_rows, block_cols):
    """The block scales of a [rows, cols] tile of one block-FP8 matrix, one an element: its
    scales at s_ptr, a row of blocks `stride_row` apart, contiguous along the columns."""
    return tl.load(s_ptr + (rows // block_rows)[:, None] * stride_row
                   + (cols // block_cols)[None, :], mask=mask, other=0.0)


__all__ = ["E4M3_MAX", "block_scales", "dequantize", "group_scales", "round_e4m3",
           "to_bf16", "to_e4m3"]
