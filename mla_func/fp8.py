"""Block-scaled FP8 weights: the typed leaf (`Fp8Weight`) and its tensor-level math.

DeepSeek-V3 (arXiv:2412.19437, 3.3) ships its linear layers in e4m3 with one float32 scale per
128 x 128 block (`weight_scale_inv`: the real weight is `data * scale`). A weight here is the
matrix a GEMM sees, `[stack, width_out, width_in]` (a leading `stack` of matrices that share a
layout: experts, gate/up, heads), with `scales[s, i, j]` the scale of rows
`i * block[0] ..` and columns `j * block[1] ..` of matrix s (the last block of an axis may be
partial: shapes need not divide the block). `shape` is the float weight's shape in the params
layout (`params.py`), a reshape of the matrices: `dequantize` gives exactly that tensor.

The grid `block` may be finer than the checkpoint's 128 where params' layout cuts a 128-block
(a head boundary inside a block, a tensor-parallel slice): the finer grid repeats the coarse
scale, so it is exact. `pack` builds a weight from data and per-element scales on the finest
grid that still holds one scale per block. Matmuls read weights through `dense`, the accessor
the reference ops use (CPU matmuls do not take float8).

The block-FP8 GEMM (`kernels/linear/fp8_linear.py`) multiplies in FP8 instead, with the
activations quantised per token in groups of 128 columns (DeepSeek-V3's inference code,
`act_quant` + `fp8_gemm`): `quantize_activations` and `linear_reference` are its numerics in
torch, for tests.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Float8e4m3fn, Float32
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


@dataclass(frozen=True)
class Fp8Weight:
    data: Float8e4m3fn[Tensor, "stack width_out width_in"]
    scales: Float32[Tensor, "stack blocks_out blocks_in"]
    block: tuple[int, int]  # static: rows and columns a scale covers
    shape: tuple[int, ...]  # static: the float weight's shape (params' layout)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: "str | torch.device") -> "Fp8Weight":
        return Fp8Weight(self.data.to(device), self.scales.to(device), self.block, self.shape)

    def describe(self) -> str:
        """The precision, as plans record it: "fp8 e4m3, block 128" (or "block 64x128")."""
        rows, cols = self.block
        return f"fp8 e4m3, block {rows if rows == cols else f'{rows}x{cols}'}"


def expand_scales(scales: Float32[Tensor, "stack blocks_out blocks_in"], block: tuple[int, int],
                  rows: int, cols: int) -> Float32[Tensor, "stack width_out width_in"]:
    """One scale per element: each block's scale repeated over it, cropped to rows x cols."""
    full = scales.repeat_interleave(block[0], 1).repeat_interleave(block[1], 2)
    return full[:, :rows, :cols]


def quantize_matrix(w: Float[Tensor, "stack width_out width_in"], block: tuple[int, int]
                    ) -> tuple[Float8e4m3fn[Tensor, "stack width_out width_in"],
                               Float32[Tensor, "stack blocks_out blocks_in"]]:
    """(data, scales): each block scaled so that its largest |value| is e4m3's largest
    (DeepSeek's scale: amax / 448; an all-zero block gets scale 1)."""
    stack, rows, cols = w.shape
    bo, bi = block
    n_o, n_i = math.ceil(rows / bo), math.ceil(cols / bi)
    padded = w.new_zeros(stack, n_o * bo, n_i * bi, dtype=torch.float32)
    padded[:, :rows, :cols] = w.float()
    amax = padded.view(stack, n_o, bo, n_i, bi).abs().amax(dim=(2, 4))
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    full = expand_scales(scales, block, rows, cols)
    data = (w.float() / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return data, scales


def quantize(w: Tensor, block: int = 128, stack: int = 0, out: int = 1) -> Fp8Weight:
    """`w` in block FP8 on its own grid: its first `stack` axes are the stack, the next `out`
    its rows, the rest its columns."""
    lead, rows = w.shape[:stack], w.shape[stack:stack + out]
    matrices = w.reshape(math.prod(lead), math.prod(rows), -1)
    data, scales = quantize_matrix(matrices, (block, block))
    return Fp8Weight(data, scales, (block, block), tuple(w.shape))


def dequantize(w: Fp8Weight, dtype: torch.dtype = torch.float32) -> Tensor:
    """The float weight `w` stands for, in params' layout (`w.shape`), as `dtype`."""
    _, rows, cols = w.data.shape
    full = expand_scales(w.scales, w.block, rows, cols)
    return (w.data.float() * full).to(dtype).reshape(w.shape)


def dense(w: "Tensor | Fp8Weight", dtype: torch.dtype) -> Tensor:
    """The weight as a tensor a matmul takes: a float weight as it is, an FP8 one
    dequantised to `dtype` (the activations')."""
    return dequantize(w, dtype) if isinstance(w, Fp8Weight) else w


def _uniform_step(full: Tensor, axis: int, limit: int) -> int:
    """The largest divisor of `limit` such that `full` is constant over each aligned run of
    that many indices along `axis`."""
    size = full.shape[axis]
    for step in sorted((d for d in range(1, limit + 1) if limit % d == 0), reverse=True):
        if step == 1 or full.device.type == "meta":
            return step
        pick = torch.arange(size, device=full.device) // step * step
        if torch.equal(full.index_select(axis, pick), full):
            return step
    return 1


def pack(data: Tensor, full: Tensor, grid: tuple[int, int], shape: tuple[int, ...]
         ) -> Fp8Weight:
    """An Fp8Weight of e4m3 `data` and its per-element scales `full` ([..., rows, cols], the
    leading axes the stack), on the coarsest grid that divides `grid` and still gives each
    block one scale (exact: nothing is rescaled)."""
    rows, cols = data.shape[-2:]
    data, full = data.reshape(-1, rows, cols), full.reshape(-1, rows, cols)
    block = (_uniform_step(full, 1, grid[0]), _uniform_step(full, 2, grid[1]))
    scales = full[:, ::block[0], ::block[1]].contiguous().float()
    return Fp8Weight(data.contiguous(), scales, block, tuple(shape))


def unpack(w: Fp8Weight) -> tuple[Tensor, Tensor]:
    """(data, per-element scales), both in params' layout (`w.shape`): `pack`'s inverse."""
    _, rows, cols = w.data.shape
    full = expand_scales(w.scales, w.block, rows, cols)
    return w.data.reshape(w.shape), full.reshape(w.shape)


def quantize_activations(x: Float[Tensor, "tokens width_in"], group: int = 128
                         ) -> tuple[Float8e4m3fn[Tensor, "tokens width_in"],
                                    Float32[Tensor, "tokens act_groups"]]:
    """(e4m3 values, float32 scales): each row's runs of `group` columns (the last may be
    partial) scaled so that their largest |value| is e4m3's largest. DeepSeek's act_quant:
    scale amax / 448 (1 for an all-zero run); the values x * (448 / amax), rounded to nearest
    even: one division a run, as every FP8 kernel quantises (`kernels.e4m3.group_scales`)."""
    tokens, cols = x.shape
    groups = math.ceil(cols / group)
    padded = x.new_zeros(tokens, groups * group, dtype=torch.float32)
    padded[:, :cols] = x.float()
    padded = padded.view(tokens, groups, group)
    amax = padded.abs().amax(-1)
    nonzero = amax > 0
    # Tensors divided by tensors: rounded once, on every device (on CUDA torch divides by a
    # number, and a number by a tensor, through a reciprocal: rounded twice).
    e4m3_max = torch.full_like(amax, FP8_MAX)
    scales = torch.where(nonzero, amax / e4m3_max, 1.0)
    inv = torch.where(nonzero, e4m3_max / amax, 1.0)
    q = (padded * inv[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(tokens, -1)[:, :cols], scales


def linear_reference(x: Float[Tensor, "tokens width_in"], w: Fp8Weight, group: int = 128
                     ) -> Float[Tensor, "tokens width_out"]:
    """x w^T in block FP8, as the FP8 GEMM computes it: x quantised per token and `group`
    columns (`quantize_activations`), each K step of min(group, the weight's block columns)
    an exact product of e4m3 values summed in float32, scaled by both scales and added to a
    float32 accumulator; the result in x's dtype. w's matrices are stacked into its rows."""
    xq, xs = quantize_activations(x, group)
    stack, rows, cols = w.data.shape
    wq = w.data.reshape(stack * rows, cols).float()
    row_block = torch.arange(stack * rows, device=x.device)
    row_block = row_block // rows * w.scales.shape[1] + row_block % rows // w.block[0]
    ws = w.scales.reshape(-1, w.scales.shape[2])[row_block]  # [stack * rows, blocks_in]
    step = min(group, w.block[1])
    acc = x.new_zeros(x.shape[0], stack * rows, dtype=torch.float32)
    for k in range(0, cols, step):
        part = xq[:, k:k + step].float() @ wq[:, k:k + step].T
        acc += part * xs[:, k // group, None] * ws[None, :, k // w.block[1]]
    return acc.to(x.dtype)


def _axis_groups(shape: tuple[int, ...], matrix: tuple[int, ...]) -> list[tuple[int, int]]:
    """The runs of `shape`'s axes whose products are `matrix`'s (stack, rows, columns): the
    params layout is a reshape of the matrices (the last run takes every axis left)."""
    runs, axis = [], 0
    for i, size in enumerate(matrix):
        start, prod = axis, 1
        while prod != size or (i == len(matrix) - 1 and axis < len(shape)):
            if axis == len(shape) or prod > size:
                raise ValueError(f"shape {shape} is no reshape of the matrices {matrix}")
            prod *= shape[axis]
            axis += 1
        runs.append((start, axis))
    return runs


def take(w: Fp8Weight, index: Callable[[Tensor], Tensor]) -> Fp8Weight:
    """The FP8 weight of `index(the float weight)`, exactly: `index` (slices, gathers or cats
    along axes, each axis kept) runs in params' layout on the e4m3 values and on their
    per-element scales alike, and the result is packed on the coarsest grid that still gives
    each block one scale (a slice that cuts a 128-block gets a finer grid, `pack`)."""
    data, full = unpack(w)
    data, full = index(data), index(full)
    if data.dim() != len(w.shape):
        raise ValueError(f"take keeps every axis of {w.shape}; got {tuple(data.shape)}")
    runs = _axis_groups(w.shape, tuple(w.data.shape))
    matrix = [math.prod(data.shape[a:b]) for a, b in runs]
    return pack(data.reshape(matrix), full.reshape(matrix), w.block, tuple(data.shape))


Weight = Tensor | Fp8Weight  # a projection's weight: float, or block FP8

__all__ = ["FP8", "FP8_MAX", "Fp8Weight", "Weight", "dense", "dequantize", "expand_scales",
           "linear_reference", "pack", "quantize", "quantize_activations", "quantize_matrix",
           "unpack"]
