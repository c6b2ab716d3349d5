"""The sum over ranks, the residual add and the RMSNorm of a sub-layer's end, in one launch.

Tensor parallel (`mla_func.parallel`) ends each attention and MoE sub-layer with a sum of
the ranks' partial rows, then h + sum and its RMSNorm. Apart, that is PyTorch's one-shot
all-reduce (copy in, barrier, read every rank's buffer, barrier) and then the fused add +
norm (`kernels.linear.norm`): two launches and a round trip of the summed rows through
memory. Here one kernel does both (the one-shot all-reduce of PyTorch's symmetric memory,
with the add and norm of `norm.add_rmsnorm` in its epilogue; vLLM and TensorRT-LLM fuse the
same pattern):

1. each program copies its rows of this rank's partial into this rank's symmetric buffer,
   into the half the launch's phase names;
2. a barrier with its twin program on every rank (`signals.rank_barrier`);
3. it reads row r of every rank's buffer over NVLink (rank 0 first on every rank, float32
   sums, rounded to the rows' dtype as the all-reduce's output is), adds the residual
   (rounded as torch's `h + r`) and writes h and its norm (`norm.rms_scaled`'s numerics);
4. the last program to arrive flips the phase (`phase[0]`, an int32 of the runtime's that
   every rank flips alike: every rank makes the same calls).

No barrier after the reads: the next launch writes the other half, and the one after it
writes this half only once its programs passed the next launch's barrier, which a peer's
twin reaches only after its whole launch before (this one, reads and all) has finished, in
stream order. PyTorch's one-shot sum uses the buffer's first third, these halves the rest.

With two ranks the result is bitwise that of the two launches apart (a sum of two terms is
the same in either order). Programs take rows `pid, pid + GRID, ...`; at most `MAX_PROGRAMS`
programs, each with one barrier slot row at the end of the signal pad (PyTorch's own kernels
use its first `TORCH_SLOT_ROWS`). A program a row up to MAX_PROGRAMS rows: each row's reads
over NVLink are a round trip of their own, and a program that loops over rows waits for
them one after another.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from mla_func.kernels.collective.signals import rank_barrier
from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.linear.norm import rms_scaled

MAX_PROGRAMS = 128  # the most programs of one launch (each with a barrier slot row)
TORCH_SLOT_ROWS = 32  # the slot rows left to PyTorch's symmetric-memory kernels


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _reduce_add_norm_kernel(x_ptr, h_ptr, w_ptr, h_out_ptr, y_ptr, buffers, signal_pads,
                            slot_base, phase_ptr, half, rows, width, eps, RANK: tl.constexpr,
                            WORLD: tl.constexpr, GRID: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    bufs = buffers.to(tl.pointer_type(tl.int64))
    # This launch's half (elements `half` long, 16-byte multiples) past PyTorch's third; the
    # phase changes only once every program has arrived (its last program, at the end).
    phase = tl.load(phase_ptr, cache_modifier=".cg")
    base = (1 + phase) * half
    # symmetric buffers are allocated 16-byte aligned: vector loads and stores
    own = tl.multiple_of(tl.load(bufs + RANK).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)
    own = tl.multiple_of(own + base, 16)
    for row in range(pid, rows, GRID):
        part = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0)
        tl.store(own + row * width + cols, part, mask=mask)
    rank_barrier(signal_pads, slot_base + pid, RANK, WORLD)
    for row in range(pid, rows, GRID):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            peer = tl.multiple_of(
                tl.load(bufs + r).to(tl.pointer_type(x_ptr.dtype.element_ty)) + base, 16)
            # ".cv": fetched from the peer again, never a line cached by an earlier sum
            acc += tl.load(peer + row * width + cols, mask=mask, other=0.0,
                           cache_modifier=".cv").to(tl.float32)
        total = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        h = tl.load(h_ptr + row * width + cols, mask=mask, other=0.0)
        hx = (h.to(tl.float32) + total).to(h.dtype)
        tl.store(h_out_ptr + row * width + cols, hx, mask=mask)
        hf = hx.to(tl.float32)
        y = rms_scaled(hf, tl.sum(hf * hf, axis=0), width, eps, w_ptr, cols, mask, hx.dtype)
        tl.store(y_ptr + row * width + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if last_to_arrive(phase_ptr + 1, GRID):  # every program has read the phase: flip it
        tl.store(phase_ptr, 1 - phase)
        tl.store(phase_ptr + 1, 0)


def slot_base(pad_bytes: int, world: int) -> int:
    """The first slot row this kernel uses: MAX_PROGRAMS rows of `world` slots at the end of
    a pad of `pad_bytes` (a ValueError where the pad is too small to leave PyTorch's kernels
    their TORCH_SLOT_ROWS rows at its start)."""
    rows = TORCH_SLOT_ROWS + MAX_PROGRAMS
    base = pad_bytes // 4 // world - MAX_PROGRAMS
    if base < TORCH_SLOT_ROWS:
        raise ValueError(f"a symmetric-memory signal pad of {pad_bytes} bytes holds too few "
                         f"slots for {world} ranks (needs {rows * world * 4}: "
                         "torch.distributed._symmetric_memory.set_signal_pad_size)")
    return base


def all_reduce_add_rmsnorm(x: Tensor, h: Tensor, weight: Tensor, eps: float, buffer: Tensor,
                           handle, phase: Tensor) -> tuple[Tensor, Tensor]:
    """(h + sum over ranks of x, its rmsnorm * weight) of [rows, width] rows; `buffer` this
    rank's symmetric buffer (three thirds, each at least x's size, in 16-byte multiples) and
    `handle` its rendezvous; `phase` the buffer's two int32 (zeros at first; every rank's
    passes through the same calls)."""
    rows, width = x.shape
    third = buffer.numel() // 3
    if x.numel() > third or buffer.dtype != x.dtype or third * x.element_size() % 16:
        raise ValueError(f"the symmetric buffer ({buffer.numel()} x {buffer.dtype}) cannot "
                         f"hold three times {rows} x {width} rows of {x.dtype}")
    x, h = x.contiguous(), h.contiguous()
    h_out = torch.empty_like(h)
    y = torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
    if rows:
        grid = min(rows, MAX_PROGRAMS)
        _reduce_add_norm_kernel[(grid,)](
            x, h, weight, h_out, y, handle.buffer_ptrs_dev, handle.signal_pad_ptrs_dev,
            slot_base(handle.signal_pad_size, handle.world_size), phase, third, rows, width,
            eps,
            RANK=handle.rank, WORLD=handle.world_size, GRID=grid,
            BLOCK=triton.next_power_of_2(width), num_warps=4)
    return h_out, y


__all__ = ["MAX_PROGRAMS", "TORCH_SLOT_ROWS", "all_reduce_add_rmsnorm", "slot_base"]
