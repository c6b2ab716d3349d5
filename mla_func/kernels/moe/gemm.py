"""What the fused MoE's grouped GEMM kernels (`gate_up.py`, `down.py`) share: where an
expert's weights start and the masks of a K step. `fused_moe.fused_experts` lays out their tiles
and launches them.

Every kernel reads its M-tile through `moe_tile.tile` (either layout; `moe_tile.tail_tile` with
`MoEConfig.merge_tail`: a program then also takes its expert's short last tile as a second
product of half the rows on the same weight tiles) and accumulates in fp32.
Expert weights are read by pointer loads, or with `TMA` by tensor descriptors: routed gate_up
as it lies ([experts, 2, moe_inter, hidden], blocks [1, 2, BLOCK_N, BLOCK_K]: gate's and up's
rows in one load and one product twice as wide, faster than two at 4096 tokens on an H100:
docs/DECISIONS.md, `moe.gemm`), down as the 2-D view [experts * hidden, moe_inter]
(and `act` [rows, moe_inter]). A down tile that runs past an expert's hidden rows reads the
next matrix's rows into columns the store masks off; reads past a tensor's edge give zeros.
Shared experts, when they ride in the routed launches, are experts past the routed ones whose
weights are strided slices of the shared MLP's (`expert_base`).
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def expert_base(w_ptr, ws_ptr, e, n_routed, stride_e, stride_se):
    """Base pointer of expert `e`: a routed expert or, past `n_routed`, a shared slice."""
    if e < n_routed:
        base = w_ptr + e.to(tl.int64) * stride_e
    else:
        base = ws_ptr + (e - n_routed).to(tl.int64) * stride_se
    return base


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def k_masks(row_ok, n_ok, k_ok, EVEN_K: tl.constexpr):
    """Load masks of one K step: A [rows, K] and B [K, N] (K needs none when tiles divide it)."""
    if EVEN_K:
        a_mask = row_ok[:, None]
        b_mask = n_ok[None, :]
    else:
        a_mask = row_ok[:, None] & k_ok[None, :]
        b_mask = k_ok[:, None] & n_ok[None, :]
    return a_mask, b_mask

