"""The sum over ranks, the residual add and the RMSNorm of a sub-layer's end, in one launch.

Tensor parallel (`mla_func.parallel`) ends each attention and MoE sub-layer with a sum of
the ranks' partial rows, then h + sum and its RMSNorm. Apart, that is PyTorch's one-shot
all-reduce (copy in, barrier, read every rank's buffer, barrier) and then the fused add +
norm (`kernels.linear.norm`): two launches and a round trip of the summed rows through
memory. Here one kernel does both (the one-shot all-reduce of PyTorch's symmetric memory,
with the add and norm of `norm.add_rmsnorm` in its epilogue; vLLM and TensorRT-LLM fuse the
same pattern):

1. each program copies its rows of this rank's partial into this rank's symmetric buffer;
2. a barrier with its twin program on every rank (`signals.rank_barrier`);
3. it reads row r of every rank's buffer over NVLink (rank 0 first on every rank, float32
   sums, rounded to the rows' dtype as the all-reduce's output is), adds the residual
   (rounded as torch's `h + r`) and writes h and its norm (`norm.rms_scaled`'s numerics);
4. a second barrier, so that no rank overwrites its buffer (the next sum's step 1) while a
   peer still reads it.

With two ranks the result is bitwise that of the two launches apart (a sum of two terms is
the same in either order). Programs take rows `pid, pid + GRID, ...`; at most `MAX_PROGRAMS`
programs, each with two barrier slot rows at the end of the signal pad (PyTorch's own kernels
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
from mla_func.kernels.linear.norm import rms_scaled

MAX_PROGRAMS = 128  # the most programs of one launch (each with two barrier slot rows)
TORCH_SLOT_ROWS = 32  # the slot rows left to PyTorch's symmetric-memory kernels


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _reduce_add_norm_kernel(x_ptr, h_ptr, w_ptr, h_out_ptr, y_ptr, buffers, signal_pads,
                            slot_base, rows, width, eps, RANK: tl.constexpr,
                            WORLD: tl.constexpr, GRID: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    bufs = buffers.to(tl.pointer_type(tl.int64))
    # symmetric buffers are allocated 16-byte aligned: vector loads and stores
    own = tl.multiple_of(tl.load(bufs + RANK).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)
    for row in range(pid, rows, GRID):
        part = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0)
        tl.store(own + row * width + cols, part, mask=mask)
    rank_barrier(signal_pads, slot_base + pid, RANK, WORLD)
    for row in range(pid, rows, GRID):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            peer = tl.multiple_of(
                tl.load(bufs + r).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)
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
    rank_barrier(signal_pads, slot_base + GRID + pid, RANK, WORLD)


def slot_base(pad_bytes: int, world: int) -> int:
    """The first slot row this kernel uses: 2 * MAX_PROGRAMS rows of `world` slots at the end
    of a pad of `pad_bytes` (a ValueError where the pad is too small to leave PyTorch's
    kernels their TORCH_SLOT_ROWS rows at its start)."""
    rows = TORCH_SLOT_ROWS + 2 * MAX_PROGRAMS
    base = pad_bytes // 4 // world - 2 * MAX_PROGRAMS
    if base < TORCH_SLOT_ROWS:
        raise ValueError(f"a symmetric-memory signal pad of {pad_bytes} bytes holds too few "
                         f"slots for {world} ranks (needs {rows * world * 4}: "
                         "torch.distributed._symmetric_memory.set_signal_pad_size)")
    return base


def all_reduce_add_rmsnorm(x: Tensor, h: Tensor, weight: Tensor, eps: float, buffer: Tensor,
                           handle, ) -> tuple[Tensor, Tensor]:
    """(h + sum over ranks of x, its rmsnorm * weight) of [rows, width] rows; `buffer` this
    rank's symmetric buffer (at least x's size) and `handle` its rendezvous."""
    rows, width = x.shape
    if x.numel() > buffer.numel() or buffer.dtype != x.dtype:
        raise ValueError(f"the symmetric buffer ({buffer.numel()} x {buffer.dtype}) cannot "
                         f"hold {rows} x {width} rows of {x.dtype}")
    x, h = x.contiguous(), h.contiguous()
    h_out = torch.empty_like(h)
    y = torch.empty(h.shape, dtype=torch.promote_types(h.dtype, weight.dtype), device=h.device)
    if rows:
        grid = min(rows, MAX_PROGRAMS)
        _reduce_add_norm_kernel[(grid,)](
            x, h, weight, h_out, y, handle.buffer_ptrs_dev, handle.signal_pad_ptrs_dev,
            slot_base(handle.signal_pad_size, handle.world_size), rows, width, eps,
            RANK=handle.rank, WORLD=handle.world_size, GRID=grid,
            BLOCK=triton.next_power_of_2(width), num_warps=4)
    return h_out, y


__all__ = ["MAX_PROGRAMS", "TORCH_SLOT_ROWS", "all_reduce_add_rmsnorm", "slot_base"]
