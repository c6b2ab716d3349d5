"""The shared experts apart in block FP8 (`fused.fused_experts` given `Fp8Scales`, where the
shared MLP does not fold into the routed launches: past `config.FUSE_SHARED_MAX_TOKENS`, or a
width or block grid that does not cut into experts): the FP8 grouped GEMMs of `gate_up.py` and
`down.py` with the whole shared MLP as the one expert, every token its one pair of weight 1.

Those are the aligned layout's shared tiles, which need neither the routing nor an alignment
launch (`tile.shared_tile`: with no routed pairs every M-tile is one), and with one pair a token
the down GEMM's pair rows are the tokens' rows: it writes the result itself. Two launches, where
the bf16 form (`swiglu.py`) runs two cuBLAS GEMMs around an activation kernel.
"""

import torch
import triton
from jaxtyping import Float, Float8e4m3fn, Float32, Int
from torch import Tensor

from mla_func.kernels.moe.down import down_kernel
from mla_func.kernels.moe.fp8_gemm import GROUP, launch_args
from mla_func.kernels.moe.gate_up import gate_up_kernel

Tile = tuple[int, int, int, int]  # (BLOCK_N, BLOCK_K, warps, stages)


def swiglu_fp8(
    x: Float[Tensor, "tokens hidden"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float8e4m3fn[Tensor, "2 inter hidden"],
    down: Float8e4m3fn[Tensor, "hidden inter"],
    gate_up_scales: Float32[Tensor, "2 _blocks_out _blocks_in"],
    down_scales: Float32[Tensor, "_blocks_out _blocks_in"],
    rows: tuple[int, int],
    block_m: int,
    tiles: tuple[Tile, Tile],
    out: Float[Tensor, "tokens hidden"],
) -> Float[Tensor, "tokens hidden"]:
    """down(silu(x W_gate^T) * (x W_up^T)) into `out`, in block FP8 (`rows`: gate_up's and
    down's block rows), M-tiles of `block_m` rows, `tiles` the two GEMMs' (BLOCK_K = GROUP).
    `ids` is read by neither launch (every tile is a shared one)."""
    tokens, hidden = x.shape
    inter = down.shape[1]
    gu, dn = gate_up[None], down[None]  # one expert, in the shared experts' place
    n_tiles = triton.cdiv(tokens, block_m)
    act = torch.empty(n_tiles * block_m, inter, dtype=x.dtype, device=x.device)
    # No routed pairs (topk 0): the tile table's pointers are never read, but the compiler
    # types the branch that would load them (int32, as `align.py`'s tables).
    table = torch.zeros(1, dtype=torch.int32, device=x.device)
    tile_args = (table, table, table, table, tokens, n_tiles, 0)
    common = dict(PAIRS_PER_TOKEN=1, BLOCK_M=block_m, BLOCK_K=GROUP, DIRECT=False,
                  PRECISION="tf32", TMA=False)
    fp8 = [launch_args(s[None], s[None], r, r, x.device.type, i == 0)
           for i, (s, r) in enumerate(((gate_up_scales, rows[0]), (down_scales, rows[1])))]
    (bn, _, warps, stages), down_tile = tiles
    gate_up_kernel[(triton.cdiv(inter, bn), n_tiles)](
        x, gu, gu, None, act, *tile_args, inter, hidden, 0, 0, x.stride(0),
        *gu.stride()[:3], *gu.stride()[:3], BLOCK_N=bn, EVEN_K=hidden % GROUP == 0, PDL=False,
        num_warps=warps, num_stages=stages, **common, **fp8[0])
    bn, _, warps, stages = down_tile
    down_kernel[(triton.cdiv(hidden, bn), n_tiles)](
        act, dn, dn, None, None, None, out, x, *tile_args, hidden, inter, 0, 0,
        *dn.stride()[:2], *dn.stride()[:2], BLOCK_N=bn, EVEN_K=inter % GROUP == 0,
        num_warps=warps, num_stages=stages, **common, **fp8[1])
    return out
