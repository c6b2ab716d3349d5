"""The aligned layout's routed M-tiles found by the GEMM programs themselves, from the routing
(`MoEConfig.inline_align`): no alignment launch between the router and the experts' GEMMs.

`moe_align.align` lays the token-expert pairs out sorted by expert, each expert's run padded to
`block_m` rows, in one launch that runs between the router and the gate_up GEMM. At decode
sizes that launch is a chain of dependent latencies on the critical path (docs/DECISIONS.md,
`MoEConfig.inline_align`).
Here each gate_up program computes what it needs of that layout itself, once, before its K
loop: the routed pairs' counts per expert (a histogram of `ids`), the expert whose run holds
its M-tile (a cumulative sum of the padded counts), and the tile's pairs (their ranks among
that expert's pairs, in pair order: `align_torch`'s order), with every routed pair in
registers at once. Every program of every wave pays for it (~O(block_m x pairs)), so the
table turns it on at decode sizes only (`moe_config`). The programs of the first N-tile write
the tile table (`sorted_pairs`, `block_expert`, `block_rows`, as `align` would) for the down
GEMM, which launches after the gate_up kernel has ended.

The shared experts' runs come first in the layout, read off the sizes (`moe_tile.shared_tile`),
so `routed_tile` numbers the routed tiles from the end of the shared ones. Under expert
parallelism (`LOCAL`) the pairs of experts other ranks hold fall in the spare bin with the
lanes past the end: no tile, no row of the table (`moe_tile.local_expert`).
"""

from typing import no_type_check

import triton
import triton.language as tl

from mla_func.kernels.moe.tile import local_expert, shared_tile

# Routed pairs (tokens x topk) a program holds at once: past this the selection's registers
# grow out of reason (the table stops at 128 tokens: 768 pairs at V2-Lite's top-6).
MAX_PAIRS = 4096


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def routed_tile(q, ids_ptr, n_tokens, topk, n_routed, first_expert,
                PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr,
                P_BLOCK: tl.constexpr, LOCAL: tl.constexpr):
    """(expert or -1, pair per row, real rows, real row count) of the q-th routed M-tile of the
    aligned layout, from `ids` alone, all routed pairs at once (P_BLOCK >= tokens * topk):
    one load, one histogram, one cumulative sum. E_P2 > n_routed (a power of two; bin
    E_P2 - 1 is spare: the lanes past the end land there)."""
    n_pairs = n_tokens * topk
    p = tl.arange(0, P_BLOCK)
    ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=E_P2 - 1).to(tl.int32)
    if LOCAL:  # another rank's expert: the spare bin, as the lanes past the end
        ids = local_expert(ids, first_expert, n_routed, LOCAL)
        ids = tl.where((ids >= 0) & (p < n_pairs), ids, E_P2 - 1)
    keys = tl.arange(0, E_P2)
    counts = tl.where(keys == E_P2 - 1, 0, tl.histogram(ids, E_P2))
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, axis=0)
    e = tl.sum((ends <= q).to(tl.int32), axis=0)  # the first run that reaches past tile q
    used = e < n_routed
    first = tl.sum(tl.where(keys == e, ends - tiles, 0), axis=0)
    count = tl.sum(tl.where(keys == e, counts, 0), axis=0)
    r0 = (q - first) * BLOCK_M  # the tile's first rank among the expert's pairs
    hit = (ids == e) & used
    rank = tl.cumsum(hit.to(tl.int32), axis=0) - 1
    pick = hit[None, :] & (rank[None, :] == (r0 + tl.arange(0, BLOCK_M))[:, None])
    folded = (p // topk) * PAIRS_PER_TOKEN + p % topk  # the pair's index with shared ones
    pair = tl.sum(tl.where(pick, folded[None, :], 0), axis=1)
    rows = tl.where(used, tl.minimum(tl.maximum(count - r0, 0), BLOCK_M), 0)
    return tl.where(used, e, -1), pair, tl.arange(0, BLOCK_M) < rows, rows


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def inline_tile(pid_m, pid_n, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, n_tokens,
                topk, n_routed, first_expert, PAIRS_PER_TOKEN: tl.constexpr,
                BLOCK_M: tl.constexpr, E_P2: tl.constexpr, P_BLOCK: tl.constexpr,
                LOCAL: tl.constexpr):
    """(expert or -1, pair per row, real rows) of M-tile pid_m of the aligned layout, as
    `moe_tile.tile` reads it off the table: a shared tile off the sizes, a routed one found
    from `ids`; the programs of N-tile 0 store a routed tile's entries of the table."""
    shared_tiles = (PAIRS_PER_TOKEN - topk) * tl.cdiv(n_tokens, BLOCK_M)
    if pid_m < shared_tiles:
        e, pair, row_ok = shared_tile(pid_m, n_tokens, topk, n_routed, PAIRS_PER_TOKEN,
                                      BLOCK_M)
    else:
        e, pair, row_ok, rows = routed_tile(pid_m - shared_tiles, ids_ptr, n_tokens, topk,
                                            n_routed, first_expert, PAIRS_PER_TOKEN, BLOCK_M,
                                            E_P2, P_BLOCK, LOCAL)
        if pid_n == 0:
            tl.store(block_expert_ptr + pid_m, e)
            tl.store(block_rows_ptr + pid_m, rows)
            tl.store(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pair, mask=row_ok)
    return e, pair, row_ok
