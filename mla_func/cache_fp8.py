"""The FP8 latent cache's row: FlashMLA's layout, 656 bytes a token a layer at V2/V3's sizes.

The cache stores [c_kv, k_pe] per token per layer (DeepSeek-V2, arXiv:2405.04434, 2.1.3). With
`kv_dtype="fp8"` a row is one run of bytes (FlashMLA's FP8 cache, DeepSeek 2025):

    [ kv_lora e4m3 values | one float32 scale a group of 128 of them | qk_rope bf16 values ]
      512 bytes              4 x 4 = 16 bytes                             64 x 2 = 128 bytes

instead of 576 bf16 values (1,152 bytes): 1.76x the tokens in the same memory. Only c_kv is
quantised; k_pe, the positional part of every score and an eighth of the row, stays bf16 as
in FlashMLA. A group's value is `e4m3 * scale`, with scale = amax / 448 of the group's values
in float32 (DeepSeek-V3's activation scale; an all-zero group gets scale 1). The row stays one
cache row, so pages, page tables, slots and graphs are the float cache's.

Scales per token and group, not one per tensor: the cache is written a token at a time, so a
tensor scale would have to be fixed before the values are known, and e4m3's range (2**-9 to
448) holds a token far below the tensor's largest only as subnormals or zero. Measured on 4096
random 512-wide rows (worst token's relative error, rows rounded to bf16 first; the tensor
scale given the oracle amax of all rows): Gaussian 2.9% (group) / 3.0% (tensor); per-channel
log-normal gains 3.0% / 4.3%; four outlier channels x20 2.7% / 5.4%; per-token log-normal
gains (sigma 3) 2.9% / 100% (small tokens flush to zero). The whole tensor's relative error:
1.3-2.6% with group scales, 2.6-2.7% with the tensor's (e4m3's 3 mantissa bits bound it).

`pack_rows` / `unpack_rows` are the reference (torch) quantiser and reader; the Triton writers
and the decode kernel follow `Fp8Layout`'s offsets (`kernels/attention/fp8_rows.py`).
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float, UInt8
from torch import Tensor

from mla_func.fp8 import FP8, FP8_MAX

GROUP = 128  # c_kv values a scale covers (docs/DECISIONS.md, `cache_fp8.GROUP`)
ROPE_DTYPE = torch.bfloat16
SCALE_BYTES = 4  # float32
KV_DTYPES = ("auto", "fp8")  # "auto": the cache holds floats in the weights' dtype

# The FP8 cache and one layer of it: uint8 rows of `cache_row` bytes (`Fp8Layout.row_bytes`).
Fp8Cache = UInt8[Tensor, "layers pages page_size cache_row"]
Fp8CacheLayer = UInt8[Tensor, "pages page_size cache_row"]


@dataclass(frozen=True)
class Fp8Layout:
    """Byte offsets of one FP8 cache row of `kv_lora` quantised and `rope` bf16 values."""

    kv_lora: int
    rope: int

    @property
    def group(self) -> int:
        """Values a scale covers (all of c_kv where it is narrower than GROUP)."""
        return min(GROUP, self.kv_lora)

    @property
    def groups(self) -> int:
        return self.kv_lora // self.group

    @property
    def scales_at(self) -> int:
        return self.kv_lora

    @property
    def rope_at(self) -> int:
        return self.kv_lora + SCALE_BYTES * self.groups

    @property
    def row_bytes(self) -> int:
        return self.rope_at + ROPE_DTYPE.itemsize * self.rope

    @property
    def latent(self) -> int:
        return self.kv_lora + self.rope

    def describe(self) -> str:
        """The precision, as plans record it."""
        return (f"fp8 e4m3 latent, a float32 scale per token per {self.group} values, "
                f"rope bf16: {self.row_bytes} bytes a token a layer")


def fp8_layout(kv_lora: int, rope: int) -> Fp8Layout:
    """The layout of rows of `kv_lora` + `rope` values; a ValueError where it does not apply:
    c_kv must split into whole groups (a multiple of GROUP, or one group of at most GROUP) and
    the float32 scales and bf16 rope values must fall on their alignment (kv_lora a multiple
    of 4, rope even), so that every row of a contiguous cache does."""
    if kv_lora < 1 or rope < 0:
        raise ValueError(f"an FP8 cache row needs kv_lora >= 1 and rope >= 0; got {kv_lora}, "
                         f"{rope}")
    if kv_lora > GROUP and kv_lora % GROUP:
        raise ValueError(f"the FP8 cache scales c_kv in groups of {GROUP}; kv_lora_rank "
                         f"{kv_lora} is not a multiple of it")
    if kv_lora % SCALE_BYTES or rope % 2:
        raise ValueError(f"the FP8 cache row needs kv_lora_rank a multiple of {SCALE_BYTES} "
                         f"and an even qk_rope_head_dim; got {kv_lora} and {rope}")
    return Fp8Layout(kv_lora, rope)


def layout_of(cache: Tensor, kv_lora: int) -> Fp8Layout:
    """The layout of an FP8 cache's rows (their byte width) holding `kv_lora` c_kv values."""
    rope2 = cache.shape[-1] - Fp8Layout(kv_lora, 0).rope_at
    if rope2 < 0 or rope2 % 2:
        raise ValueError(f"FP8 cache rows of {cache.shape[-1]} bytes do not hold "
                         f"{kv_lora} c_kv values")
    return fp8_layout(kv_lora, rope2 // 2)


def is_fp8(cache: Tensor) -> bool:
    """Whether `cache` (or a layer or rows of it) is an FP8 cache: bytes, not floats."""
    return cache.dtype == torch.uint8


def compute_dtype(cache: Tensor, like: torch.dtype) -> torch.dtype:
    """The dtype attention multiplies cache rows in: a float cache's own; for an FP8 cache
    `like` (the query's: bf16 on a GPU), which its rows are dequantised to."""
    return like if is_fp8(cache) else cache.dtype


def pack_rows(rows: Float[Tensor, "*rows latent"], kv_lora: int
              ) -> UInt8[Tensor, "*rows cache_row"]:
    """FP8 cache rows of [c_kv, k_pe] rows: c_kv quantised per group of GROUP values
    (scale = amax / 448 in float32, the values rounded to nearest even e4m3), k_pe in bf16."""
    lay = fp8_layout(kv_lora, rows.shape[-1] - kv_lora)
    c = rows[..., :kv_lora].float().unflatten(-1, (lay.groups, lay.group))
    amax = c.abs().amax(-1, keepdim=True)
    # A tensor divisor: CUDA divides by a Python number as a product with its reciprocal,
    # which rounds otherwise than the IEEE division the Triton writers use (1 ulp, 2026-11-28).
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    q = (c / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(-2)
    out = torch.empty(*rows.shape[:-1], lay.row_bytes, dtype=torch.uint8, device=rows.device)
    out[..., :kv_lora] = q.view(torch.uint8)
    out[..., lay.scales_at:lay.rope_at] = scale.squeeze(-1).contiguous().view(torch.uint8)
    out[..., lay.rope_at:] = rows[..., kv_lora:].to(ROPE_DTYPE).contiguous().view(torch.uint8)
    return out


def unpack_rows(packed: UInt8[Tensor, "*rows cache_row"], kv_lora: int,
                dtype: torch.dtype = torch.float32) -> Float[Tensor, "*rows latent"]:
    """[c_kv, k_pe] rows of FP8 cache rows, in `dtype`: c_kv = e4m3 x scale (in float32,
    then rounded to `dtype`), k_pe the stored bf16 values."""
    lay = layout_of(packed, kv_lora)
    q = packed[..., :kv_lora].contiguous().view(FP8).float()
    q = q.unflatten(-1, (lay.groups, lay.group))
    scale = packed[..., lay.scales_at:lay.rope_at].contiguous().view(torch.float32)
    c = (q * scale[..., None]).flatten(-2)
    k_pe = packed[..., lay.rope_at:].contiguous().view(ROPE_DTYPE)
    return torch.cat((c.to(dtype), k_pe.to(dtype)), dim=-1)


def check_kv_dtype(kv_dtype: str) -> str:
    """`kv_dtype` if the API takes it ("auto": floats in the weights' dtype; "fp8"), else a
    ValueError naming the choices."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}; got {kv_dtype!r}")
    return kv_dtype


__all__ = ["GROUP", "KV_DTYPES", "ROPE_DTYPE", "Fp8Cache", "Fp8CacheLayer", "Fp8Layout",
           "check_kv_dtype", "compute_dtype", "fp8_layout", "is_fp8", "layout_of", "pack_rows",
           "unpack_rows"]
