"""Barriers between the same program of every rank, over symmetric-memory signal pads.

PyTorch's symmetric memory (`torch.distributed._symmetric_memory.rendezvous`) gives every
rank a signal pad of 32-bit slots that the other ranks can address. A slot carries one signal
at a time: the sender swaps it 0 -> 1 (spinning while the previous signal is still unread),
the receiver swaps it 1 -> 0 (spinning until it arrives). Nothing needs resetting between
calls, so a captured graph can replay the barrier (an epoch counter in a kernel argument would
be frozen by the capture). The send is a release and the wait an acquire at system scope:
every write the program made before the barrier is visible to the peers that passed it.

Threads `0 .. WORLD - 1` of a program each talk to one rank (the thread index comes from PTX,
so a Triton "scalar" differs per thread here); the other threads wait at the CTA barriers.
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _thread_index():
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _send(slot):
    """Swap a peer's slot 0 -> 1 (release, system scope); spin while it still holds 1."""
    return tl.inline_asm_elementwise(
        """
        {
            .reg .u32 %old;
            .reg .pred %sent;
            send_again:
                atom.global.release.sys.cas.b32 %old, [$1], 0, 1;
                setp.eq.u32 %sent, %old, 0;
                @!%sent bra send_again;
            mov.u32 $0, %old;
        }
        """,
        "=r,l", [slot], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _wait(slot):
    """Swap this rank's slot 1 -> 0 (acquire, system scope); spin until the peer's 1 lands."""
    return tl.inline_asm_elementwise(
        """
        {
            .reg .u32 %old;
            .reg .pred %got;
            wait_again:
                atom.global.acquire.sys.cas.b32 %old, [$1], 1, 0;
                setp.eq.u32 %got, %old, 1;
                @!%got bra wait_again;
            mov.u32 $0, %old;
        }
        """,
        "=r,l", [slot], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def rank_barrier(signal_pads, slot, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Wait until this program's twin on every rank reaches the same barrier `slot`.

    `signal_pads`: the device array of the ranks' signal-pad addresses (int64); `slot`: this
    program's row of WORLD slots (distinct per program and per barrier of a kernel)."""
    tl.debug_barrier()  # the program's writes are done before thread `peer` signals
    peer = _thread_index()
    if peer < WORLD:
        pads = signal_pads.to(tl.pointer_type(tl.int64))
        theirs = tl.load(pads + peer).to(tl.pointer_type(tl.int32))
        _send(theirs + slot * WORLD + RANK)
        mine = tl.load(pads + RANK).to(tl.pointer_type(tl.int32))
        _wait(mine + slot * WORLD + peer)
    tl.debug_barrier()  # no thread reads the peers' rows before every signal has landed
