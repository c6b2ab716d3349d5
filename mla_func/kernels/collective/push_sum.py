"""The sum over ranks of decode-sized rows, pushed: each rank writes its rows into every other
rank's symmetric buffer and reads the others' rows from its own, with no barrier.

Tensor parallel (`mla_func.parallel`) ends each attention and MoE sub-layer with a sum of the
ranks' partial rows, then h + sum and its RMSNorm. A pulled one-shot sum (PyTorch's
symmetric-memory kernel) copies the rows into this rank's buffer, waits at a barrier with
every rank (a signal sent over NVLink and one received), then reads every peer's buffer over
NVLink: two round trips between the GPUs before the first add. Here each program stores its
rows straight into its row of every peer's buffer (stores over NVLink, posted: nothing waits
for them) and polls its own buffer until every peer's row has landed: one crossing of NVLink.

How a row is known to have landed: a buffer's empty element holds the sentinel, the bits of
-0.0 (the sign bit alone). Every rank stores -0.0 as +0.0, so a landed element never looks
empty, and a program polls (volatile loads, past L1) until no element of the row does. The
sum is float32 from zero, in which -0.0 and +0.0 add alike: the result's bits are those of
the rows as given. Having read a row, the program empties it again (stores the sentinel).

The launches alternate between two halves of the buffer (`phase[0]`, flipped by the last
program of each launch to arrive). A peer writes into this half again two launches later,
which it starts only after it has read this rank's rows of the launch between, which this
rank pushes only after this launch has ended (reads and emptying included, in stream order):
neither barrier nor epoch is needed, and a captured graph replays the same launches. Every
rank must make the same sequence of calls (the step's schedule is the same on every rank).

Each half holds WORLD slots (one per sender) of `slot` elements; the rows are added rank 0
first on every rank, so every rank receives the same bits (with two ranks, those of any sum
of the two). With `NORM`, the residual add and the RMSNorm follow in the same launch (the
numerics of `norm.add_rmsnorm`: the sum rounded to the rows' dtype, then h + sum rounded as
torch's). A program pushes a row, waits for the peers' copies of it, then takes its next row
(`pid + GRID`, ...): a program a row up to MAX_PROGRAMS. Pushing all of a program's rows
before the waits kept their addresses live across two loops (164 registers against 72 at
2048 wide).

The peers are unrolled (`static_range`): spill-free on sm90 at 2 ranks, 4-12 bytes at 4
ranks 8192 wide with the norm (measured on 4 GPUs as it is), 12-346 bytes at 8 ranks (Triton
3.6 and 3.9, ahead of time; never run). A run-time loop over the peers compiled to at most
24 bytes at 8 ranks but spilled at 2; it was not measured.

CUDA only on several GPUs (peer memory); the interpreter runs it over ordinary tensors, each
rank's launch in turn (tests/test_push_sum.py).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.linear.norm import rms_scaled

MAX_PROGRAMS = 128  # the most programs of one launch
# The bits of -0.0, the empty element, for each element size (as a signed integer).
_SENTINEL = {2: -(1 << 15), 4: -(1 << 31)}
_BITS = {2: tl.int16, 4: tl.int32}


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _push_sum_kernel(x_ptr, h_ptr, w_ptr, h_out_ptr, y_ptr, buffers, phase_ptr, slot, rows,
                     width, eps, RANK: tl.constexpr, WORLD: tl.constexpr, GRID: tl.constexpr,
                     BLOCK: tl.constexpr, BITS: tl.constexpr, SENTINEL: tl.constexpr,
                     NORM: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    empty = tl.full([BLOCK], SENTINEL, BITS)
    bufs = buffers.to(tl.pointer_type(tl.int64))
    # This launch's half; the phase changes only once every program has arrived.
    phase = tl.load(phase_ptr, cache_modifier=".cg")
    half = phase * WORLD * slot
    mine = tl.multiple_of(tl.load(bufs + RANK).to(tl.pointer_type(BITS)), 16)
    for row in range(pid, rows, GRID):
        part = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0).to(BITS, bitcast=True)
        part = tl.where(part == empty, tl.zeros_like(part), part)  # -0.0 sent as +0.0
        for r in tl.static_range(WORLD):
            if r != RANK:  # into rank r's buffer, this rank's slot (symmetric: 16-byte aligned)
                theirs = tl.multiple_of(tl.load(bufs + r).to(tl.pointer_type(BITS)), 16)
                dest = tl.multiple_of(theirs + half + RANK * slot, 16)
                tl.store(dest + row * width + cols, part, mask=mask)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            if r == RANK:
                got = part  # +0.0 for -0.0: the same sum from zero
            else:
                src = tl.multiple_of(mine + half + r * slot, 16) + row * width + cols
                got = tl.load(src, mask=mask, other=0, volatile=True)
                while tl.max((got == empty).to(tl.int32), axis=0) > 0:  # not all landed
                    got = tl.load(src, mask=mask, other=0, volatile=True)
                tl.store(src, empty, mask=mask)  # emptied for this half's next launch
            acc += got.to(x_ptr.dtype.element_ty, bitcast=True).to(tl.float32)
        total = acc.to(x_ptr.dtype.element_ty)
        if NORM:
            h = tl.load(h_ptr + row * width + cols, mask=mask, other=0.0)
            hx = (h.to(tl.float32) + total.to(tl.float32)).to(h.dtype)
            tl.store(h_out_ptr + row * width + cols, hx, mask=mask)
            hf = hx.to(tl.float32)
            y = rms_scaled(hf, tl.sum(hf * hf, axis=0), width, eps, w_ptr, cols, mask,
                           hx.dtype)
            tl.store(y_ptr + row * width + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(y_ptr + row * width + cols, total, mask=mask)
    if last_to_arrive(phase_ptr + 1, GRID):  # every program has read the phase: flip it
        tl.store(phase_ptr, 1 - phase)
        tl.store(phase_ptr + 1, 0)


def launch_options(block: int) -> dict:
    """num_warps (and maxnreg) for rows `block` wide. Past 4096 (V3's 7168), 8 warps: 4.6-10.4
    us plain and 5.3-11.1 with the norm at 1-128 rows, against 4 warps' 5.3-11.3 and 6.1-11.7
    (2xH200, b79a0b6, docs/DECISIONS.md); at up to 255 registers, where ptxas keeps them
    spill-free under Triton 3.6 and 3.9 alike (3.9 caps 8 warps at 128 registers otherwise
    and spills 84 bytes)."""
    return dict(num_warps=8, maxnreg=255) if block > 4096 else dict(num_warps=4)


def buffer_elements(slot: int, world: int) -> int:
    """The elements of a rank's push buffer: two halves of `world` slots of `slot`."""
    return 2 * world * slot


def empty_buffer(buffer: Tensor) -> Tensor:
    """`buffer` filled with the empty element (-0.0): how every rank's buffer starts."""
    return buffer.fill_(-0.0)


def _launch(x: Tensor, h: Tensor | None, weight: Tensor | None, eps: float, y: Tensor,
            h_out: Tensor | None, buffer: Tensor, ptrs: int, rank: int, world: int,
            phase: Tensor) -> None:
    rows, width = x.shape
    slot = buffer.numel() // (2 * world)
    if (x.numel() > slot or buffer.dtype != x.dtype or slot * x.element_size() % 16
            or x.element_size() not in _SENTINEL):
        raise ValueError(f"a push buffer of {buffer.numel()} x {buffer.dtype} for {world} "
                         f"ranks cannot take {rows} x {width} rows of {x.dtype}")
    if not rows:
        return
    grid, block = min(rows, MAX_PROGRAMS), triton.next_power_of_2(width)
    norm = h is not None
    _push_sum_kernel[(grid,)](
        x, h if norm else x, weight if norm else x, h_out if norm else y, y, ptrs, phase,
        slot, rows, width, eps, RANK=rank, WORLD=world, GRID=grid,
        BLOCK=block, BITS=_BITS[x.element_size()], SENTINEL=_SENTINEL[x.element_size()],
        NORM=norm, **launch_options(block))


def push_all_reduce(x: Tensor, buffer: Tensor, ptrs: int, rank: int, world: int,
                    phase: Tensor) -> Tensor:
    """The sum over the ranks of [rows, width] x. `buffer`: this rank's symmetric push buffer
    (`buffer_elements`, emptied by `empty_buffer` on every rank before any launch); `ptrs`:
    the device address of an int64 array of every rank's buffer address, in rank order
    (symmetric memory's `buffer_ptrs_dev`); `phase`: two int32 zeros at first, then the
    launches' own (every rank passes through the same calls)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _launch(x, None, None, 0.0, y, None, buffer, ptrs, rank, world, phase)
    return y


def push_all_reduce_add_rmsnorm(x: Tensor, h: Tensor, weight: Tensor, eps: float,
                                buffer: Tensor, ptrs: int, rank: int, world: int,
                                phase: Tensor) -> tuple[Tensor, Tensor]:
    """(h + the sum over ranks of x, its rmsnorm * weight), one launch; the buffer's
    arguments as `push_all_reduce`'s."""
    x, h = x.contiguous(), h.contiguous()
    h_out = torch.empty_like(h)
    y = torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
    _launch(x, h, weight, eps, y, h_out, buffer, ptrs, rank, world, phase)
    return h_out, y


__all__ = ["MAX_PROGRAMS", "buffer_elements", "empty_buffer", "push_all_reduce",
           "push_all_reduce_add_rmsnorm"]
