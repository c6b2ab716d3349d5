"""Static-shape alignment of token-expert pairs for a grouped MoE GEMM (vLLM's
`moe_align_block_size`, rewritten without host syncs).

A step routes `tokens` tokens to `topk` experts each; DeepSeek's shared experts are folded in as
`shared` extra pairs per token with expert ids `experts .. experts+shared-1` (weight 1). Pair
`p = t * (topk + shared) + j` is token `t`'s j-th pair. The alignment lays the pairs out sorted
by expert, each expert's run padded to a multiple of `block_m` rows, so that one M-tile of the
GEMM holds rows of exactly one expert. The shared experts' runs come first, in token order, so
that the GEMM finds their tiles without this layout (`moe_tile.shared_tile`: it can start them
before the alignment ends); the routed experts' runs follow in expert order:

- `sorted_pairs [max_blocks * block_m]`: pair index per row (rows past an expert's count are
  padding: never read, their value is unspecified),
- `block_expert [max_blocks]`: the expert of each M-tile, -1 for unused tiles,
- `block_rows [max_blocks]`: the number of real rows in each M-tile (0 for unused tiles).

`max_blocks` is a static worst case, a function of the (static) sizes only:
sum_e ceil(c_e / block_m) <= (pairs + min(experts, pairs) * (block_m - 1)) / block_m, so that
the whole layout can live in a CUDA graph; unused tiles cost one early-exiting program each.

Two implementations: `align_torch` (stable argsort, scatter-add counts, cumsum, searchsorted;
static shapes, traceable on fake tensors) and `align_triton`, one or two launches instead of ~15
(which matters inside a graph at small token counts). Small steps run one program (histogram counts,
then the rows: shared pairs in token order, routed pairs by atomic row claims, so that inside a
routed expert's run the order follows atomic timing on a GPU, which changes no result: every
row of the GEMMs is computed independently). Large steps run two launches of one program per
slice of the pairs: the first counts its slice per expert, the second reads every slice's
counts, places its slice and writes a share of the tile table: no atomics, and align_torch's
order.

Expert parallelism (`first_expert`): `ids` hold global expert ids and the `experts` routed
experts of the layout are the global ones first_expert .. first_expert + experts - 1. A pair
routed to another rank's expert is in no run and no row (its key is the spare one, as past the
end): the layout, its ids and its bounds are those of the local experts alone.

The GEMM programs read their M-tile of this layout, or of the direct layout that needs no
alignment launch, through tile.py.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Int
from torch import Tensor

from mla_func.kernels.moe.tile import local_expert

# align() uses the Triton kernels up to TRITON_ALIGN_MAX_PAIRS pairs: one program (atomics) while
# pairs * bins <= ONE_PROGRAM_MAX_BINNED (its histograms cost ~ pairs * bins), beyond that the two
# sliced launches (ceil(pairs / ALIGN_SLICE) programs; the second reads every slice's counts,
# ~ slices^2 * bins); past 65536 pairs torch's ops were as fast or faster (docs/DECISIONS.md,
# `moe.align.TRITON_ALIGN_MAX_PAIRS`).
TRITON_ALIGN_MAX_PAIRS = 65536
ONE_PROGRAM_MAX_BINNED = 1024 * 128
ALIGN_SLICE = 128  # pairs placed per program of the sliced kernel


def max_blocks(pairs: int | torch.SymInt, experts: int, block_m: int) -> int | torch.SymInt:
    """Static upper bound on the M-tiles `pairs` pairs over `experts` experts can need."""
    # Symbolic sizes (tracing): the looser `experts` bound keeps the expression guard-free.
    busy = min(experts, pairs) if isinstance(pairs, int) else experts
    return (pairs + busy * (block_m - 1)) // block_m


def pair_experts(
    ids: Int[Tensor, "tokens topk"], experts: int, shared: int, first_expert: int | None = None
) -> Int[Tensor, " pairs"]:
    """Expert id of each pair, shared experts appended per token (torch; the kernel inlines it).
    `first_expert`: `ids` are global, the local ids returned, -1 for another rank's expert."""
    if first_expert is not None:
        ids = ids - first_expert
        ids = torch.where((ids >= 0) & (ids < experts), ids, -1)
    if shared == 0:
        return ids.flatten()
    extra = torch.arange(experts, experts + shared, device=ids.device, dtype=ids.dtype)
    return torch.cat((ids, extra.expand(ids.shape[0], shared)), dim=1).flatten()


def align_torch(
    ids: Int[Tensor, "tokens topk"], experts: int, shared: int, block_m: int,
    first_expert: int | None = None,
) -> tuple[Int[Tensor, " aligned"], Int[Tensor, " blocks"], Int[Tensor, " blocks"]]:
    """`(sorted_pairs, block_expert, block_rows)`, see the module docstring (`first_expert`:
    expert parallelism, there)."""
    experts_of_pairs = pair_experts(ids, experts, shared, first_expert).long()
    # Run keys: the shared experts' runs first (0..shared-1), then the routed experts'.
    flat = torch.where(experts_of_pairs >= experts, experts_of_pairs - experts,
                       experts_of_pairs + shared)
    n, n_exp = flat.shape[0], experts + shared
    spare = int(first_expert is not None)  # another rank's pairs: key n_exp, after every run
    if spare:
        flat = torch.where(experts_of_pairs < 0, n_exp, flat)
    nb = max_blocks(n, n_exp, block_m)
    torch._check(nb > 0)  # tells a symbolic tracer what it cannot prove through the floor div
    counts = torch.zeros(n_exp + spare, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    order = flat.argsort(stable=True)
    sorted_exp = flat[order]
    rank = torch.arange(n, device=flat.device) - (counts.cumsum(0) - counts)[sorted_exp]
    counts = counts[:n_exp] if spare else counts
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    starts = ends - padded
    # With the spare key its pairs land on one dump row past the layout, cut off below.
    sorted_pairs = torch.full((nb * block_m + spare,), n, dtype=torch.int32, device=flat.device)
    if spare:
        dest = torch.where(sorted_exp < n_exp, starts[sorted_exp.clamp(max=n_exp - 1)] + rank,
                           nb * block_m)
    else:
        dest = starts[sorted_exp] + rank
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    sorted_pairs = sorted_pairs[: nb * block_m] if spare else sorted_pairs
    row0 = torch.arange(nb, device=flat.device) * block_m
    block_expert = torch.searchsorted(ends, row0, right=True)
    used = block_expert < n_exp
    e = block_expert.clamp(max=n_exp - 1)
    rows = (counts[e] - (row0 - starts[e])).clamp(0, block_m) * used
    expert = torch.where(block_expert < shared, block_expert + experts, block_expert - shared)
    block_expert = torch.where(used, expert, -1)
    return sorted_pairs, block_expert.to(torch.int32), rows.to(torch.int32)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _pair_key(ids_ptr, p, n_pairs, topk, n_routed, first_expert, PAIRS_PER_TOKEN: tl.constexpr,
              LOCAL: tl.constexpr):
    """Run key of pair p: j - topk for shared expert j - topk, n_shared + e for routed expert e,
    -1 past the end (LOCAL: and for another rank's expert)."""
    tok = p // PAIRS_PER_TOKEN
    j = p % PAIRS_PER_TOKEN
    routed = (j < topk) & (p < n_pairs)
    e = tl.load(ids_ptr + tok * topk + j, mask=routed, other=0).to(tl.int32)
    e = local_expert(e, first_expert, n_routed, LOCAL)
    key = tl.where(j < topk, e + PAIRS_PER_TOKEN - topk, j - topk)
    if LOCAL:
        key = tl.where((j < topk) & (e < 0), -1, key)
    return tl.where(p < n_pairs, key, -1)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _placed(k, p, n_pairs, LOCAL: tl.constexpr):
    """Whether pair p (run key k) has a row: it is a pair and, LOCAL, a local expert's."""
    if LOCAL:
        placed = k >= 0  # -1: past the end or another rank's expert
    else:
        placed = p < n_pairs
    return placed


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _tiles(block_expert_ptr, block_rows_ptr, counts, first, step, n_blocks, n_routed, n_shared,
           BLOCK_M: tl.constexpr, E_P2: tl.constexpr, BLOCK_CHUNK: tl.constexpr):
    """Run starts per key from the pair counts per key; writes the expert and real-row count
    of M-tiles first, first + 1, ... (BLOCK_CHUNK at a time, every `step` tiles)."""
    keys = tl.arange(0, E_P2)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    blanes = tl.arange(0, BLOCK_CHUNK)
    for b0 in range(first, n_blocks, step):
        blk = b0 + blanes
        row0 = blk * BLOCK_M
        inside = ((row0[:, None] >= starts[None, :]) & (row0[:, None] < ends[None, :]))
        inside = inside.to(tl.int32)
        used = tl.sum(inside, axis=1)
        key = tl.sum(inside * keys[None, :], axis=1)
        expert = tl.where(key < n_shared, key + n_routed, key - n_shared)
        rows = tl.sum(inside * (counts[None, :] - (row0[:, None] - starts[None, :])), axis=1)
        rows = tl.minimum(rows, BLOCK_M)
        tl.store(block_expert_ptr + blk, tl.where(used > 0, expert, -1), mask=blk < n_blocks)
        tl.store(block_rows_ptr + blk, rows, mask=blk < n_blocks)
    return starts


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _count(ids_ptr, first, end, n_pairs, topk, n_routed, first_expert,
           PAIRS_PER_TOKEN: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr,
           LOCAL: tl.constexpr):
    """Pairs per run key, of pairs first..end (CHUNK at a time)."""
    keys = tl.arange(0, E_P2)
    lanes = tl.arange(0, CHUNK)
    counts = tl.zeros([E_P2], dtype=tl.int32)
    for start in range(first, end, CHUNK):
        k = _pair_key(ids_ptr, start + lanes, n_pairs, topk, n_routed, first_expert,
                      PAIRS_PER_TOKEN, LOCAL)
        counts += tl.histogram(tl.where(k < 0, E_P2 - 1, k), E_P2)  # past the end: spare bin
    return tl.where(keys == E_P2 - 1, 0, counts)


# Sizes that change with the token count are not specialised: one compile serves every bucket.
@triton.jit(do_not_specialize=["n_pairs", "n_blocks", "first_expert"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _align_one_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, cursor_ptr,
    n_pairs, n_blocks, topk, n_routed, first_expert,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, PDL: tl.constexpr, LOCAL: tl.constexpr,
):
    """One program: counts, the whole tile table, then the rows: shared pairs in token order,
    routed pairs by atomic row claims."""
    if PDL:  # launched early behind the router: the experts' GEMM may launch too, then wait
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    n_shared = PAIRS_PER_TOKEN - topk
    counts = _count(ids_ptr, 0, n_pairs, n_pairs, topk, n_routed, first_expert,
                    PAIRS_PER_TOKEN, E_P2, CHUNK, LOCAL)
    starts = _tiles(block_expert_ptr, block_rows_ptr, counts, 0, BLOCK_CHUNK, n_blocks,
                    n_routed, n_shared, BLOCK_M, E_P2, BLOCK_CHUNK)
    # A routed pair takes the next free row of its run: the order inside a routed expert's
    # run follows atomic timing, which changes no result (every row of the GEMMs is computed
    # independently). Shared runs start at s * cdiv(tokens, BLOCK_M) * BLOCK_M.
    tl.store(cursor_ptr + tl.arange(0, E_P2), starts)
    tl.debug_barrier()
    lanes = tl.arange(0, CHUNK)
    per = tl.cdiv(n_pairs // PAIRS_PER_TOKEN, BLOCK_M) * BLOCK_M
    for start in range(0, n_pairs, CHUNK):
        p = start + lanes
        k = _pair_key(ids_ptr, p, n_pairs, topk, n_routed, first_expert, PAIRS_PER_TOKEN,
                      LOCAL)
        routed = (p < n_pairs) & (k >= n_shared)
        dest = tl.atomic_add(cursor_ptr + k, 1, mask=routed, sem="relaxed")
        dest = tl.where(routed, dest, k * per + p // PAIRS_PER_TOKEN)
        tl.store(sorted_ptr + dest, p, mask=_placed(k, p, n_pairs, LOCAL))


@triton.jit(do_not_specialize=["n_pairs", "first_expert"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _slice_counts_kernel(
    ids_ptr, hist_ptr, n_pairs, topk, n_routed, first_expert,
    PAIRS_PER_TOKEN: tl.constexpr, E_P2: tl.constexpr, SLICE: tl.constexpr, PDL: tl.constexpr,
    LOCAL: tl.constexpr,
):
    """Pairs per run key of slice `pid` (pairs pid * SLICE..) into row pid of `hist`."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    first = tl.program_id(0) * SLICE
    counts = _count(ids_ptr, first, first + SLICE, n_pairs, topk, n_routed, first_expert,
                    PAIRS_PER_TOKEN, E_P2, SLICE, LOCAL)
    tl.store(hist_ptr + tl.program_id(0) * E_P2 + tl.arange(0, E_P2), counts)


@triton.jit(do_not_specialize=["n_pairs", "n_blocks", "first_expert"])
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _align_sliced_kernel(
    ids_ptr, hist_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
    n_pairs, n_blocks, topk, n_routed, first_expert,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr,
    SLICE: tl.constexpr, HIST_ROWS: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
    PDL: tl.constexpr, LOCAL: tl.constexpr,
):
    """Program `pid` places pairs pid * SLICE.. (its slice) and a share of the tile table,
    from every slice's counts (`_slice_counts_kernel`, read from L2): no atomics."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    n_slices = tl.num_programs(0)
    keys = tl.arange(0, E_P2)
    rows = tl.arange(0, HIST_ROWS)
    # Summed elementwise, reduced over the rows once after the loop, not in every step: the
    # whole alignment a third to a half faster (docs/DECISIONS.md, `moe.align` rows kernel).
    counts = tl.zeros([HIST_ROWS, E_P2], dtype=tl.int32)
    before = tl.zeros([HIST_ROWS, E_P2], dtype=tl.int32)
    for r0 in range(0, n_slices, HIST_ROWS):
        r = r0 + rows
        h = tl.load(hist_ptr + r[:, None] * E_P2 + keys[None, :], mask=(r < n_slices)[:, None],
                    other=0, cache_modifier=".cg")  # other SMs wrote them: read from L2
        counts += h
        before += tl.where((r < pid)[:, None], h, 0)
    counts = tl.sum(counts, axis=0)
    before = tl.sum(before, axis=0)
    starts = _tiles(block_expert_ptr, block_rows_ptr, counts, pid * BLOCK_CHUNK,
                    n_slices * BLOCK_CHUNK, n_blocks, n_routed,
                    PAIRS_PER_TOKEN - topk, BLOCK_M, E_P2, BLOCK_CHUNK)
    # The slice's pairs: row = start of the run + its pairs before the slice + its pairs
    # earlier in the slice. Pair order is kept inside every run (a stable sort).
    s = tl.arange(0, SLICE)
    p = pid * SLICE + s
    k = _pair_key(ids_ptr, p, n_pairs, topk, n_routed, first_expert, PAIRS_PER_TOKEN, LOCAL)
    earlier = (k[:, None] == k[None, :]) & (s[None, :] < s[:, None])
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    base = tl.sum(tl.where(k[:, None] == keys[None, :], (starts + before)[None, :], 0), axis=1)
    tl.store(sorted_ptr + base + rank, p, mask=_placed(k, p, n_pairs, LOCAL))


def empty_layout(
    ids: Int[Tensor, "tokens topk"], experts: int, shared: int, block_m: int
) -> tuple[Int[Tensor, " aligned"], Int[Tensor, " blocks"], Int[Tensor, " blocks"]]:
    """`(sorted_pairs, block_expert, block_rows)` of the aligned layout, allocated at their
    static worst case (`max_blocks`) and left unset, on `ids`' device, for a kernel to fill."""
    tokens, topk = ids.shape
    nb = max_blocks(tokens * (topk + shared), experts + shared, block_m)
    return tuple(torch.empty(size, dtype=torch.int32, device=ids.device)
                 for size in (nb * block_m, nb, nb))


def align_triton(
    ids: Int[Tensor, "tokens topk"], experts: int, shared: int, block_m: int, pdl: bool = False,
    first_expert: int | None = None,
) -> tuple[Int[Tensor, " aligned"], Int[Tensor, " blocks"], Int[Tensor, " blocks"]]:
    """The layout of `align_torch` (padding rows of `sorted_pairs` left unset): up to
    ONE_PROGRAM_MAX_BINNED pairs x bins one launch of one program with atomic row claims (the order
    inside a routed expert's run may differ from align_torch's), beyond that two launches of
    ceil(pairs / ALIGN_SLICE) programs (counts per slice, then the rows) and align_torch's
    order. `pdl`: each launch is a programmatic dependent (sm90+) of the kernel before it
    (the router first), and lets the kernel after it launch at once. `first_expert`: as in
    `align_torch`."""
    tokens, topk = ids.shape
    ids = ids.contiguous()
    n, n_exp = tokens * (topk + shared), experts + shared
    sorted_pairs, block_expert, block_rows = empty_layout(ids, experts, shared, block_m)
    nb = block_expert.shape[0]
    e_p2 = triton.next_power_of_2(n_exp + 1)  # one spare bin
    local = (experts, first_expert or 0)  # the routed experts: how many, the first's global id
    common = dict(PAIRS_PER_TOKEN=topk + shared, E_P2=e_p2, PDL=pdl, num_warps=4,
                  LOCAL=first_expert is not None, **({"launch_pdl": True} if pdl else {}))
    if n * e_p2 <= ONE_PROGRAM_MAX_BINNED:
        cursor = torch.empty(e_p2, dtype=torch.int32, device=ids.device)
        _align_one_kernel[(1,)](
            ids, sorted_pairs, block_expert, block_rows, cursor, n, nb, topk, *local,
            **common | dict(num_warps=8), BLOCK_M=block_m, CHUNK=1024,
            BLOCK_CHUNK=max(16, 8192 // e_p2))
    else:
        n_slices = triton.cdiv(n, ALIGN_SLICE)
        hist = torch.empty(n_slices, e_p2, dtype=torch.int32, device=ids.device)
        _slice_counts_kernel[(n_slices,)](ids, hist, n, topk, *local, **common,
                                          SLICE=ALIGN_SLICE)
        _align_sliced_kernel[(n_slices,)](
            ids, hist, sorted_pairs, block_expert, block_rows, n, nb, topk, *local, **common,
            BLOCK_M=block_m, SLICE=ALIGN_SLICE, HIST_ROWS=max(1, 4096 // e_p2),
            BLOCK_CHUNK=max(16, 2048 // e_p2))
    return sorted_pairs, block_expert, block_rows


def align(
    ids: Int[Tensor, "tokens topk"], experts: int, shared: int, block_m: int, pdl: bool = False,
    first_expert: int | None = None,
) -> tuple[Int[Tensor, " aligned"], Int[Tensor, " blocks"], Int[Tensor, " blocks"]]:
    """Triton up to TRITON_ALIGN_MAX_PAIRS pairs (one launch; `pdl` as in align_triton),
    torch ops beyond (`first_expert`: `align_torch`)."""
    pairs = ids.shape[0] * (ids.shape[1] + shared)
    if ids.is_cuda and pairs <= TRITON_ALIGN_MAX_PAIRS:
        return align_triton(ids, experts, shared, block_m, pdl, first_expert)
    return align_torch(ids, experts, shared, block_m, first_expert)
