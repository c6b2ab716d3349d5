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


def _swap_asm(order: str, expect: int, new: int) -> str:
    """PTX that swaps a slot `expect` -> `new` (a compare-and-swap with memory order `order`,
    system scope), spinning until the slot held `expect`."""
    return f"""
        {{
            .reg .u32 %old;
            .reg .pred %done;
            again:
                atom.global.{order}.sys.cas.b32 %old, [$1], {expect}, {new};
                setp.eq.u32 %done, %old, {expect};
                @!%done bra again;
            mov.u32 $0, %old;
        }}
        """


# The send swaps a peer's slot 0 -> 1 (release: this program's writes go first), spinning
# while it still holds the previous 1; the wait swaps this rank's slot 1 -> 0 (acquire),
# spinning until the peer's 1 lands.
_SEND = tl.constexpr(_swap_asm("release", 0, 1))
_WAIT = tl.constexpr(_swap_asm("acquire", 1, 0))


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _swap(slot, ASM: tl.constexpr):
    """One slot swapped by `ASM` (`_SEND` or `_WAIT`)."""
    return tl.inline_asm_elementwise(ASM, "=r,l", [slot], dtype=tl.int32, is_pure=False,
                                     pack=1)


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
        _swap(theirs + slot * WORLD + RANK, _SEND)
        mine = tl.load(pads + RANK).to(tl.pointer_type(tl.int32))
        _swap(mine + slot * WORLD + peer, _WAIT)
    tl.debug_barrier()  # no thread reads the peers' rows before every signal has landed
