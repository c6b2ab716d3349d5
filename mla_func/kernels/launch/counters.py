"""Arrival counters of the kernels whose last program to arrive finishes the launch's work.

`last_to_arrive` is the arrival itself, in every such kernel: the MoE router's split sum,
`proj_norm`'s add + norm and the decode's merge fused with W_UV (`mla_merge_uv`).
`device_counters` owns the counters of the router and `proj_norm` (the decode's live in its
`DecodeWorkspace`): int32 zeros, allocated on the op's first call and never reallocated,
so that captured CUDA graphs keep their address; every launch leaves its counters zero
again.

One buffer per op, not one for all: launches of different ops may overlap (PDL lets the router
start while `proj_norm` still runs). Two launches of one op must not run at once on different
streams of one device.
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

_COUNTERS: dict[tuple[str, torch.device], Tensor] = {}


def device_counters(op: str, device: torch.device, n: int) -> Tensor:
    """The n counters of custom op `mla_func::<op>` on `device` (zeros when first made). The
    first call must not be inside a CUDA-graph capture: run the op once eagerly before (the
    warm-up does)."""
    buf = _COUNTERS.get((op, device))
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"mla_func::{op}: run it once before CUDA-graph capture")
        buf = _COUNTERS[(op, device)] = torch.zeros(n, dtype=torch.int32, device=device)
    return buf


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def last_to_arrive(counter, programs):
    """Whether this program is the last of `programs` to arrive at `counter`. Every thread's
    stores before the call happen-before the release (a barrier, then an acq_rel add at gpu
    scope), so the last program reads the others' results. It must store 0 to `counter` once
    done, for the next launch (and graph replay)."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == programs - 1
