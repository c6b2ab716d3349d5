"""The M-tile a grouped MoE GEMM program reads, in either layout of `fused_moe`: the aligned
layout (align.py: pairs sorted by expert, each expert's run padded to `block_m` rows, the
shared experts' runs first) or the direct layout.

The direct layout (`direct_tile`, at a few tokens) needs no alignment launch: M-tile
`q < tokens * topk` holds routed pair q alone, M-tile `tokens * topk + s` shared expert s for
every token; row r of every tile is token r (so `tokens <= block_m`). A token's top-k experts
are distinct, so at 1 token no weight is read twice; at 2+ tokens an expert two tokens share is
read once per token (the shared experts stay one tile each).

Pair `p = t * PAIRS_PER_TOKEN + j` is token t's j-th pair (routed j < topk, then the shared
experts); every function returns (expert, pair per row, real rows) or a part of it.

Expert parallelism (`LOCAL`): `ids` hold global expert ids and the launch's routed experts are
the global ones first_expert .. first_expert + n_routed - 1 (`local_expert`); a direct tile of a
pair routed elsewhere gets expert -1, as unused tiles of the aligned layout do (its programs
exit; its pair's row is never written, and the pair sum never reads it).
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def local_expert(e, first_expert, n_routed, LOCAL: tl.constexpr):
    """Global expert id(s) `e` as local ones, -1 where another rank holds the expert (LOCAL);
    without LOCAL every id is local, unchanged."""
    if LOCAL:
        e = e - first_expert
        e = tl.where((e >= 0) & (e < n_routed), e, -1)
    return e


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def shared_tile(q, n_tokens, topk, n_routed, PAIRS_PER_TOKEN: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """(expert, pair per row, real rows) of M-tile `q` of the aligned layout when it is a
    shared expert's (q < n_shared * cdiv(tokens, BLOCK_M)): read off the sizes alone."""
    per = tl.cdiv(n_tokens, BLOCK_M)
    s = q // per
    tok = (q - s * per) * BLOCK_M + tl.arange(0, BLOCK_M)
    return n_routed + s, tok * PAIRS_PER_TOKEN + topk + s, tok < n_tokens


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def direct_tile(q, ids_ptr, n_tokens, topk, n_routed, first_expert,
                PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, LOCAL: tl.constexpr):
    """(expert, pair per row, real rows) of M-tile `q` of the direct layout (docstring)."""
    rows = tl.arange(0, BLOCK_M)
    n_pairs = n_tokens * topk
    routed = q < n_pairs
    t = q // topk
    e = tl.load(ids_ptr + q, mask=routed, other=0).to(tl.int32)  # no ids read for shared
    e = local_expert(e, first_expert, n_routed, LOCAL)
    e = tl.where(routed, e, n_routed + q - n_pairs)
    one = t * PAIRS_PER_TOKEN + q - t * topk
    pair = tl.where(routed, one + rows * 0, rows * PAIRS_PER_TOKEN + topk + q - n_pairs)
    row_ok = tl.where(routed, rows == t, rows < n_tokens)
    return e, pair, row_ok


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, n_tokens, topk, n_routed,
         first_expert, PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr,
         DIRECT: tl.constexpr, LOCAL: tl.constexpr):
    """(expert, pair per row, real rows) of M-tile `pid_m` of either layout, as `fused_moe`'s
    GEMMs read it. The tile's activations live in rows pid_m * BLOCK_M.. of `act` in both
    layouts: affine rows keep the down GEMM's A loads cheap (gathered rows cost it ~100
    registers on sm90)."""
    if DIRECT:
        e, pair, row_ok = direct_tile(pid_m, ids_ptr, n_tokens, topk, n_routed, first_expert,
                                      PAIRS_PER_TOKEN, BLOCK_M, LOCAL)
    elif is_shared_tile(pid_m, n_tokens, topk, PAIRS_PER_TOKEN, BLOCK_M, DIRECT):
        e, pair, row_ok = shared_tile(pid_m, n_tokens, topk, n_routed, PAIRS_PER_TOKEN, BLOCK_M)
    else:
        rows = tl.arange(0, BLOCK_M)
        e = tl.load(block_expert_ptr + pid_m)
        row_ok = rows < tl.load(block_rows_ptr + pid_m)
        pair = tl.load(sorted_ptr + pid_m * BLOCK_M + rows, mask=row_ok, other=0)
    return e, pair, row_ok


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def tail_tile(q, sorted_ptr, block_expert_ptr, block_rows_ptr, n_tiles, BLOCK_M: tl.constexpr):
    """M-tile `q` of the aligned layout under `MoEConfig.merge_tail`: (expert, pair per row,
    real rows, whether the program also takes the tail, the tail's pair per row, its real
    rows). A tail is an expert's last tile of at most BLOCK_M // 2 real rows after a tile of
    its own: the program of that tile before it takes its first BLOCK_M // 2 rows, and the
    tail's own program gets expert -1 (as unused tiles do)."""
    e = tl.load(block_expert_ptr + q)
    n_rows = tl.load(block_rows_ptr + q)
    more = q + 1 < n_tiles
    e_next = tl.load(block_expert_ptr + q + 1, mask=more, other=-1)
    rows_next = tl.load(block_rows_ptr + q + 1, mask=more, other=BLOCK_M)
    e_prev = tl.load(block_expert_ptr + q - 1, mask=q > 0, other=-1)
    taken = (e == e_prev) & (n_rows <= BLOCK_M // 2)  # only a run's last tile is short
    merge = (e_next == e) & (rows_next <= BLOCK_M // 2)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    pair = tl.load(sorted_ptr + q * BLOCK_M + rows, mask=row_ok, other=0)
    t_rows = tl.arange(0, BLOCK_M // 2)
    t_ok = t_rows < tl.where(merge, rows_next, 0)
    t_pair = tl.load(sorted_ptr + (q + 1) * BLOCK_M + t_rows, mask=t_ok, other=0)
    return tl.where(taken, -1, e), pair, row_ok, merge, t_pair, t_ok


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def is_shared_tile(pid_m, n_tokens, topk, PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr,
                   DIRECT: tl.constexpr):
    """Whether M-tile `pid_m` is a shared expert's: found without the routing (direct layout:
    the last tiles; aligned: the first, `shared_tile`)."""
    if DIRECT:
        shared = pid_m >= n_tokens * topk
    else:
        shared = pid_m < (PAIRS_PER_TOKEN - topk) * tl.cdiv(n_tokens, BLOCK_M)
    return shared
