"""Experiment: a warp-specialised persistent GEMM in Gluon (Triton 3.6) for Hopper.

C[rows, N] = A[rows, K] @ B[N, K]^T, bf16 in, fp32 accumulate. One producer warp issues the TMA
loads of A and B tiles into a ring of STAGES shared-memory buffers (mbarriers `ready` / `empty`);
the default partition (8 warps, two warpgroups cooperating on one 128-row tile) runs async
wgmma and the epilogue, so the loads of the next tile run while this tile's epilogue stores.

GROUPED: the MoE down GEMM of `fused_moe`'s aligned layout. M-tile m belongs to expert
block_expert[m] (-1: unused), B is the [experts * N, K] view of the down weights, and each row r
of the tile is written, times its routing weight, to row sorted[m * BLOCK_M + r] (its pair) of C.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _tile_coords(tile, n_n):
    return tile // n_n, tile % n_n  # N-tiles fastest: an M-tile's A rows stay in L2


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, block_expert, n_m, n_n, n_k, N,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              STAGES: gl.constexpr, GROUPED: gl.constexpr):
    it = 0
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile_coords(tile, n_n)
        row_b = pn * BLOCK_N
        live = True
        if GROUPED:
            e = gl.load(block_expert + pm)
            live = e >= 0
            row_b += e * N
        if live:
            for kk in range(n_k):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s),
                                a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [pm * BLOCK_M, kk * BLOCK_K],
                                                ready.index(s), a_bufs.index(s))
                tma.async_copy_global_to_shared(b_desc, [row_b, kk * BLOCK_K],
                                                ready.index(s), b_bufs.index(s))
                it += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_desc, c_smem, c_ptr, block_expert, block_rows,
              sorted_ptr, weights_ptr, n_m, n_n, n_k, N, topk, PAIRS_PER_TOKEN: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              GROUPED: gl.constexpr, EPI_TMA: gl.constexpr, PART: gl.constexpr,
              N_PARTS: gl.constexpr, WARPS: gl.constexpr):
    """One consumer: the tiles t with (live tiles before t) % N_PARTS == PART. With two
    (ping-pong) one warpgroup's epilogue runs while the other's products use the tensor cores;
    the ring orders them (a tile's stages are filled after the previous tile's)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    it = 0
    own = 0
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile_coords(tile, n_n)
        live = True
        if GROUPED:
            live = gl.load(block_expert + pm) >= 0
        if live:
            if own % N_PARTS == PART:
                acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
                for kk in range(n_k):
                    i = it + kk
                    s = i % STAGES
                    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                    acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc,
                                        is_async=True)
                    # One product in flight: the one before it is done, so its stage is free.
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=kk > 0)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index((it + n_k + STAGES - 1) % STAGES))
                if EPI_TMA:  # dense: through shared memory, the global write left in flight
                    tma.store_wait(0)
                    c_smem.store(acc.to(gl.bfloat16))
                    fence_async_shared()
                    tma.async_copy_shared_to_global(c_desc, [pm * BLOCK_M, pn * BLOCK_N],
                                                    c_smem)
                else:
                    n = pn * BLOCK_N + cols
                    if GROUPED:
                        ok = rows < gl.load(block_rows + pm)
                        pair = gl.load(sorted_ptr + pm * BLOCK_M + rows, mask=ok, other=0)
                        j = pair % PAIRS_PER_TOKEN
                        w = gl.load(weights_ptr + (pair // PAIRS_PER_TOKEN) * topk + j,
                                    mask=ok, other=1.0)
                        y = acc.to(gl.bfloat16).to(gl.float32) * w[:, None]
                        out_rows = pair.to(gl.int64)
                    else:
                        ok = rows >= 0
                        y = acc
                        out_rows = (pm * BLOCK_M + rows).to(gl.int64)
                    ptrs = c_ptr + out_rows[:, None] * N + n[None, :]
                    gl.store(ptrs, y.to(gl.bfloat16), mask=ok[:, None] & (n < N)[None, :])
            it += n_k
            own += 1
    if EPI_TMA:
        tma.store_wait(0)


@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, c_desc, c_ptr, block_expert, block_rows, sorted_ptr,
                   weights_ptr, n_m, N, K, topk, PAIRS_PER_TOKEN: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   STAGES: gl.constexpr, GROUPED: gl.constexpr, EPI_TMA: gl.constexpr,
                   PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    n_n = gl.cdiv(N, BLOCK_N)
    n_k = gl.cdiv(K, BLOCK_K)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    parts: gl.constexpr = 2 if PINGPONG else 1
    if EPI_TMA:
        c_smem = gl.allocate_shared_memory(gl.bfloat16, [parts, BLOCK_M, BLOCK_N], c_desc.layout)
    else:
        c_smem = a_bufs  # unused
    fence_async_shared()
    if PINGPONG:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_smem.index(0), c_ptr,
                         block_expert, block_rows, sorted_ptr, weights_ptr, n_m, n_n, n_k, N,
                         topk, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, STAGES, GROUPED, EPI_TMA, 0,
                         2, num_warps)),
            (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_smem.index(parts - 1), c_ptr,
                         block_expert, block_rows, sorted_ptr, weights_ptr, n_m, n_n, n_k, N,
                         topk, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, STAGES, GROUPED, EPI_TMA, 1,
                         2, 4)),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, block_expert, n_m,
                         n_n, n_k, N, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUPED)),
        ], [4, 1], [232, 24])
    else:
        gl.warp_specialize([
            (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_smem.index(0), c_ptr,
                         block_expert, block_rows, sorted_ptr, weights_ptr, n_m, n_n, n_k, N,
                         topk, PAIRS_PER_TOKEN, BLOCK_M, BLOCK_N, STAGES, GROUPED, EPI_TMA, 0,
                         1, num_warps)),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, block_expert, n_m,
                         n_n, n_k, N, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUPED)),
        ], [1], [24])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


def descriptors(a, b, block_m, block_n, block_k):
    la = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    lb = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    return (TensorDescriptor.from_tensor(a, [block_m, block_k], la),
            TensorDescriptor.from_tensor(b, [block_n, block_k], lb))


def c_descriptor(c, block_m, block_n):
    lc = gl.NVMMASharedLayout.get_default_for([block_m, block_n], gl.bfloat16)
    return TensorDescriptor.from_tensor(c, [block_m, block_n], lc)


def ws_gemm(a, b, c, block_m=128, block_n=256, block_k=64, stages=3, num_sms=132,
            grouped=None, pingpong=False, epi_tma=False):
    """Dense: c = a @ b^T. Grouped: `grouped` = (block_expert, block_rows, sorted, weights,
    topk, pairs_per_token); b is [experts * N, K]; c is [pairs, N]. `pingpong`: two
    consumer warpgroups on alternate tiles (4 warps each), else one 8-warp consumer."""
    N = c.shape[1]
    K = a.shape[1]
    n_m = triton.cdiv(a.shape[0], block_m)
    a_desc, b_desc = descriptors(a, b, block_m, block_n, block_k)
    c_desc = c_descriptor(c, block_m, block_n)
    if grouped is None:
        be = br = srt = wts = c
        topk, ppt = 1, 1
    else:
        be, br, srt, wts, topk, ppt = grouped
        n_m = be.shape[0]
    tiles = n_m * triton.cdiv(N, block_n)
    ws_gemm_kernel[(min(num_sms, tiles),)](
        a_desc, b_desc, c_desc, c, be, br, srt, wts, n_m, N, K, topk, PAIRS_PER_TOKEN=ppt,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
        GROUPED=grouped is not None, EPI_TMA=epi_tma, PINGPONG=pingpong,
        num_warps=4 if pingpong else 8, maxnreg=168)
    return c
