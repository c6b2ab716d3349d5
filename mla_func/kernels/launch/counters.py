"""The last-program arrival of the kernels whose last program to arrive finishes a launch's work.

`last_to_arrive` is the arrival itself, in every such kernel: the MoE router's split sum,
`proj_norm`'s add + norm, the MoE down GEMM's pair sum and the decode's fused merge
(`merge_uv`). The counters are int32 zeros owned by the state's runtime (`runtime.Runtime`:
fixed addresses for captured graphs; each op its own slice, since launches of different ops
may overlap under PDL); every launch leaves its counters zero again. Where the programs of a
tile each add one slice of K (the FP8 GEMM's few-row launches, the MoE's split GEMMs), the last
to arrive adds their float32 partials in slice order (`slices_summed`): the same bits whatever
the order they arrived in, so a graph replay equals eager.
"""

from typing import no_type_check

import triton
import triton.language as tl


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def last_to_arrive(counter, programs):
    """Whether this program is the last of `programs` to arrive at `counter`. Every thread's
    stores before the call happen-before the release (a barrier, then an acq_rel add at gpu
    scope), so the last program reads the others' results. It must store 0 to `counter` once
    done, for the next launch (and graph replay)."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == programs - 1


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def slices_summed(ptrs, slice_stride, mask, SLICES: tl.constexpr):
    """The float32 tiles at ptrs + s * slice_stride summed over the slices s = 0 .. SLICES - 1
    in that order (from zero), read past L1 (.cg: other programs of the launch wrote them)."""
    total = tl.zeros(ptrs.shape, dtype=tl.float32)
    for s in tl.static_range(SLICES):
        total += tl.load(ptrs + s * slice_stride, mask=mask, other=0.0, cache_modifier=".cg")
    return total
