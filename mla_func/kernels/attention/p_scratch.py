"""The hand-off of softmax p and its rescale factor from the score dot to the value product of
the absorbed MLA decode (`mla_decode`, `DecodePlan.shared_p`), through per-program scratch.

Why a detour through memory: Triton lays out a dot whose result reaches another dot (flash
attention's score, FlashAttention-2, Dao 2023) with every warp along M. At 64 heads a program
and 8 warps both warpgroups then compute the same 64-row score tile. With the values passing
through global scratch there is no SSA path from one dot to the other, and the score dot
splits its keys over the two warpgroups instead (sm90 compile: `warpsPerCTA [4, 2]`).
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def through_memory(p, alpha, p_buf, a_buf, n0, start, end, BLOCK_H: tl.constexpr,
                   BLOCK_N: tl.constexpr, ASM_SYNC: tl.constexpr):
    """p and alpha as the value product reads them: stored to this program's scratch, then
    reloaded after a barrier. Two tiles by parity: a warp may store tile i + 1 while another
    still reads tile i, never tile i + 2 (the barrier of tile i + 1 stands between). Store,
    barrier and reload sit in one always-taken branch because the loop pipeliner schedules
    the ops of the loop body, not those inside a branch: in the body it prefetched the reload
    ahead of its store and moved the barrier above the stores (sm90 compiles, 2026-11-23)."""
    slot = ((n0 - start) // BLOCK_N) % 2
    hh = tl.arange(0, BLOCK_H)
    nn = tl.arange(0, BLOCK_N)
    p_at = p_buf + slot * (BLOCK_H * BLOCK_N) + hh[:, None] * BLOCK_N + nn[None, :]
    a_at = a_buf + slot * BLOCK_H + hh
    if n0 < end:  # always
        tl.store(p_at, p)
        tl.store(a_at, alpha)
        # bar.sync: every warp's stores are visible to the whole program after it. Inline
        # assembly, because the pipeliner gives up on a loop that holds tl.debug_barrier
        # (which the interpreter, running a program as one, needs no more than this).
        if ASM_SYNC:
            tl.inline_asm_elementwise("bar.sync 0;\n mov.u32 $0, 0;", "=r,r", [slot],
                                      dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.debug_barrier()
        p_in = tl.load(p_at)
        a_in = tl.load(a_at)
    else:  # never taken; not p itself, which would restore the SSA path
        p_in = tl.zeros([BLOCK_H, BLOCK_N], p.dtype)
        a_in = tl.zeros([BLOCK_H], alpha.dtype)
    return p_in, a_in
