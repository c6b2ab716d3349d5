"""The MoE's routed down GEMM for Hopper (sm90) at large token counts: persistent, in Gluon.

The math is `moe_gemm.down_kernel`'s on the aligned layout (`moe_align`; whole M-tiles, the
shared experts apart): for every M-tile of expert e and N-tile of hidden, act W_down[e]^T,
rounded to the model dtype, times each pair's routing weight, stored to the pair's row of a
[pairs, hidden] buffer that `moe_sum` reduces.

Why a second form: at 4096 V2-Lite tokens the Triton kernel (one tile a program) computes at
~500-540 TFLOP/s where cuBLAS runs the dense GEMM of that shape at ~770 (H100,
docs/perf/2026-11-24-h100-run74). K is short (moe_inter 1408: 22 steps of 64), so each
program's pipeline fill and its epilogue are a large share of its time. Here one program a
SM walks its tiles (tile i of program p is p + i * programs; N-tiles fastest, so the programs
running at once share a few experts' weights in L2) in one flat loop over (tile, K step): the
TMA loads run STAGES - 1 steps ahead across tile boundaries, so the next tile's operands
arrive while this tile's epilogue stores. The schedule follows the persistent pipelined
matmul of Triton's Gluon tutorials (07-persistence); the code is our own.

Graph safety: the grid and the tile table's size are static (`moe_align.max_blocks`); each
program counts the table's real tiles on the device (they are its first tiles: runs are laid
out in order, unused tiles hold expert -1) and walks only those.
"""

from typing import no_type_check

import torch
import triton
from jaxtyping import Float, Int
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Triton 3.6 (the GPU machines) names the TMA load async_copy_global_to_shared; later
# versions (3.9 in CI) async_load, with the old name raising.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

BLOCK_M = 128  # two warpgroups of 64 rows
NUM_WARPS = 8


def device_ok(device: torch.device) -> bool:
    """An sm90 CUDA device (wgmma and TMA as this kernel uses them)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


@gluon.jit
@no_type_check  # keeps the jaxtyping import hook off Gluon kernels
def _issue(s, total, a_desc, w_desc, a_bufs, w_bufs, ready, block_expert, first, programs,
           n_n, k_steps, n_hidden, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
           STAGES: gl.constexpr):
    """The TMA loads of flat step s (tile s // k_steps of this program, K step s % k_steps)
    into stage s % STAGES; nothing past the last step."""
    ok = s < total
    item = first + (s // k_steps) * programs
    m = item // n_n
    e = gl.load(block_expert + m, mask=ok, other=0)
    k = (s % k_steps) * BLOCK_K
    st = s % STAGES
    bar = ready.index(st)
    mbarrier.expect(bar, a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=ok)
    _tma_load(a_desc, [m * a_desc.block_type.shape[0], k], bar, a_bufs.index(st), ok)
    _tma_load(w_desc, [e * n_hidden + (item % n_n) * BLOCK_N, k], bar, w_bufs.index(st), ok)


@gluon.jit
@no_type_check  # keeps the jaxtyping import hook off Gluon kernels
def _epilogue(acc, item, out, weights, sorted_ids, block_rows, n_n, topk, n_hidden,
              PAIRS_PER_TOKEN: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """acc rounded to the model dtype, times each pair's routing weight, to the pairs' rows."""
    bm: gl.constexpr = acc.shape[0]
    m = item // n_n
    rows = gl.arange(0, bm, layout=gl.SliceLayout(1, layout))
    row_ok = rows < gl.load(block_rows + m)
    pair = gl.load(sorted_ids + m * bm + rows, mask=row_ok, other=0)
    j = pair % PAIRS_PER_TOKEN
    w = gl.load(weights + (pair // PAIRS_PER_TOKEN) * topk + j, mask=row_ok & (j < topk),
                other=1.0)
    y = acc.to(out.dtype.element_ty).to(gl.float32) * w[:, None]
    cols = (item % n_n) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    ptrs = out + pair.to(gl.int64)[:, None] * n_hidden + cols[None, :]
    gl.store(ptrs, y.to(out.dtype.element_ty), mask=row_ok[:, None])


@gluon.jit
@no_type_check  # keeps the jaxtyping import hook off Gluon kernels
def _down_kernel(a_desc, w_desc, out, weights, sorted_ids, block_expert, block_rows, n_tiles,
                 topk, n_hidden, n_inter, PAIRS_PER_TOKEN: gl.constexpr,
                 TILES_P2: gl.constexpr, STAGES: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, 16])
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BLOCK_K], a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    # The real tiles lead the table (expert -1 after them).
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    t = gl.arange(0, TILES_P2, layout=flat)
    used = gl.sum((gl.load(block_expert + t, mask=t < n_tiles, other=-1) >= 0).to(gl.int32), 0)
    n_n = n_hidden // BLOCK_N
    k_steps = n_inter // BLOCK_K
    first = gl.program_id(0)
    programs = gl.num_programs(0)
    mine = gl.maximum(used * n_n - first + programs - 1, 0) // programs
    total = mine * k_steps

    for s in gl.static_range(STAGES - 1):
        _issue(s, total, a_desc, w_desc, a_bufs, w_bufs, ready, block_expert, first, programs,
               n_n, k_steps, n_hidden, BLOCK_N, BLOCK_K, STAGES)
    acc = gl.zeros([BM, BLOCK_N], gl.float32, layout)
    for c in range(total):
        st = c % STAGES
        kk = c % k_steps
        mbarrier.wait(ready.index(st), (c // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(st), w_bufs.index(st).permute((1, 0)), acc,
                            use_acc=kk != 0, is_async=True)
        # Step c - 1's product has retired: its stage takes step c + STAGES - 1.
        acc = warpgroup_mma_wait(1, deps=(acc,))
        _issue(c + STAGES - 1, total, a_desc, w_desc, a_bufs, w_bufs, ready, block_expert,
               first, programs, n_n, k_steps, n_hidden, BLOCK_N, BLOCK_K, STAGES)
        if kk == k_steps - 1:
            acc = warpgroup_mma_wait(0, deps=(acc,))
            _epilogue(acc, first + (c // k_steps) * programs, out, weights, sorted_ids,
                      block_rows, n_n, topk, n_hidden, PAIRS_PER_TOKEN, BLOCK_N, layout)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


def supported(act: Tensor, down: Tensor, block_n: int, block_k: int) -> bool:
    """Whether the kernel takes these shapes: bf16 / fp16 contiguous operands whose hidden and
    moe_inter are whole tiles, on an sm90 device."""
    hidden, inter = down.shape[1], down.shape[2]
    return (device_ok(act.device) and act.dtype in (torch.bfloat16, torch.float16)
            and down.dtype == act.dtype and act.is_contiguous() and down.is_contiguous()
            and hidden % block_n == 0 and inter % block_k == 0)


def down_launch(
    act: Float[Tensor, "rows moe_inter"],
    down: Float[Tensor, "experts hidden moe_inter"],
    out: Float[Tensor, "pairs hidden"],
    weights: Float[Tensor, "tokens topk"],
    sorted_ids: Int[Tensor, " rows"],
    block_expert: Int[Tensor, " m_tiles"],
    block_rows: Int[Tensor, " m_tiles"],
    pairs_per_token: int,
    block_n: int,
    block_k: int,
    stages: int,
    programs: int,
) -> tuple[tuple[int], tuple, dict]:
    """(grid, args, kwargs) of `_down_kernel` (the sm90 compile test builds them on the CPU)."""
    n_tiles = block_expert.shape[0]
    hidden, inter = down.shape[1], down.shape[2]
    a_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, block_k], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    a_desc = TensorDescriptor.from_tensor(act, [BLOCK_M, block_k], a_layout)
    w_desc = TensorDescriptor.from_tensor(down.view(-1, inter), [block_n, block_k], w_layout)
    grid = (max(1, min(programs, n_tiles * (hidden // block_n))),)
    args = (a_desc, w_desc, out, weights, sorted_ids, block_expert, block_rows, n_tiles,
            weights.shape[1], hidden, inter)
    kwargs = dict(PAIRS_PER_TOKEN=pairs_per_token,
                  TILES_P2=max(triton.next_power_of_2(n_tiles), 32), STAGES=stages,
                  num_warps=NUM_WARPS)
    return grid, args, kwargs


def down_sm90(
    act: Float[Tensor, "rows moe_inter"],
    down: Float[Tensor, "experts hidden moe_inter"],
    out: Float[Tensor, "pairs hidden"],
    weights: Float[Tensor, "tokens topk"],
    layout: tuple[Tensor, Tensor, Tensor],
    pairs_per_token: int,
    block_n: int = 256,
    block_k: int = 64,
    stages: int = 4,
) -> None:
    """Each pair's weighted routed-expert output into its row of `out` (aligned layout
    `layout` = (sorted pair per row, expert per M-tile, real rows per M-tile), M-tiles of
    BLOCK_M rows, `act` in that layout)."""
    sorted_ids, block_expert, block_rows = layout
    programs = torch.cuda.get_device_properties(act.device).multi_processor_count
    grid, args, kwargs = down_launch(act, down, out, weights, sorted_ids, block_expert,
                                     block_rows, pairs_per_token, block_n, block_k, stages,
                                     programs)
    _down_kernel[grid](*args, **kwargs)
