"""A warp-specialised Gluon GEMM for sm90 (run 102's `exp_ws.py --variants gluon4`): C [M, N] =
A [M, K] x B[rows of expert te[m-tile]]^T, 128 x BN tiles, one program a tile (not
persistent). Partitions: two consumer warpgroups (rows 0-63 and 64-127 of the tile, wgmma
64 x BN from shared memory, one group in flight) and a one-warp TMA loader; a ring of STAGES
stages guarded by `ready` (TMA bytes) and `empty` (both consumers' arrivals)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_ptr, N, K, HALF: gl.constexpr,
              BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BN, 16])
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    acc = gl.zeros([64, BN], gl.float32, layout)
    steps = gl.cdiv(K, BK)
    for i in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(2 * s + HALF), b_bufs.index(s).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc,))
        # The product of step i - 1 has retired: its stage may take the next loads.
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    rows = pid_m * 128 + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    gl.store(c_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def _consumer0(a_bufs, b_bufs, ready, empty, c_ptr, N, K, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr):
    _consumer(a_bufs, b_bufs, ready, empty, c_ptr, N, K, 0, BN, BK, STAGES)


@gluon.jit
def _consumer1(a_bufs, b_bufs, ready, empty, c_ptr, N, K, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr):
    _consumer(a_bufs, b_bufs, ready, empty, c_ptr, N, K, 1, BN, BK, STAGES)


@gluon.jit
def _loader(a_desc, b_desc, te_ptr, a_bufs, b_bufs, ready, empty, c_ptr, N, K,
            BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    e = gl.maximum(gl.load(te_ptr + pid_m), 0)
    row_w = e * N + pid_n * BN
    for i in range(gl.cdiv(K, BK)):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma_load(a_desc, [pid_m * 128, i * BK], ready.index(s), a_bufs.index(2 * s))
        tma_load(a_desc, [pid_m * 128 + 64, i * BK], ready.index(s), a_bufs.index(2 * s + 1))
        tma_load(b_desc, [row_w, i * BK], ready.index(s), b_bufs.index(s))


@gluon.jit
def ws_mm(a_desc, b_desc, te_ptr, c_ptr, N, K, BN: gl.constexpr, BK: gl.constexpr,
          STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, 64, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumers
    fence_async_shared()
    gl.warp_specialize([
        (_consumer0, (a_bufs, b_bufs, ready, empty, c_ptr, N, K, BN, BK, STAGES)),
        (_consumer1, (a_bufs, b_bufs, ready, empty, c_ptr, N, K, BN, BK, STAGES)),
        (_loader, (a_desc, b_desc, te_ptr, a_bufs, b_bufs, ready, empty, c_ptr, N, K, BN, BK,
                   STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


# Persistent form (`exp_ws.py --variants pgluon4`): `grid` programs (one an SM) walk the tiles
# t = pid, pid + grid, ... (N-tiles fastest); the ring's step counter runs on across tiles, so
# the loader fills the next tile's stages while the consumers store the last one.


@gluon.jit
def _p_consumer(a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, HALF: gl.constexpr,
                BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BN, 16])
    n_n = N // BN
    tiles = (M // 128) * n_n
    steps = gl.cdiv(K, BK)
    c = 0
    for t in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_m = t // n_n
        pid_n = t % n_n
        acc = gl.zeros([64, BN], gl.float32, layout)
        for i in range(steps):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(2 * s + HALF), b_bufs.index(s).permute((1, 0)),
                                acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=i > 0)
            c += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES))  # the tile's last stage
        rows = pid_m * 128 + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        gl.store(c_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def _p_consumer0(a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, BN: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr):
    _p_consumer(a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, 0, BN, BK, STAGES)


@gluon.jit
def _p_consumer1(a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, BN: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr):
    _p_consumer(a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, 1, BN, BK, STAGES)


@gluon.jit
def _p_loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K,
              BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    n_n = N // BN
    tiles = (M // 128) * n_n
    steps = gl.cdiv(K, BK)
    c = 0
    for t in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_m = t // n_n
        pid_n = t % n_n
        row_w = gl.maximum(gl.load(te_ptr + pid_m), 0) * N + pid_n * BN
        for i in range(steps):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s),
                            2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma_load(a_desc, [pid_m * 128, i * BK], ready.index(s), a_bufs.index(2 * s))
            tma_load(a_desc, [pid_m * 128 + 64, i * BK], ready.index(s),
                     a_bufs.index(2 * s + 1))
            tma_load(b_desc, [row_w, i * BK], ready.index(s), b_bufs.index(s))
            c += 1


@gluon.jit
def ws_mm_persistent(a_desc, b_desc, te_ptr, c_ptr, M, N, K, BN: gl.constexpr,
                     BK: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, 64, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_p_consumer0, (a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, BN, BK, STAGES)),
        (_p_consumer1, (a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, BN, BK, STAGES)),
        (_p_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, c_ptr, te_ptr, M, N, K, BN,
                     BK, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])
