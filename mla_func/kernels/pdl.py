"""Programmatic dependent launch (PDL, sm90+): a kernel launched with `launch_pdl=True` may
start once every program of the kernel before it has called `gdc_launch_dependents`, and must
call `gdc_wait` before it touches anything that kernel writes (or memory the allocator might
hand out again: the stream-ordered allocator assumes the kernels run one after another).
Only the MLA decode split kernel and the MoE router trigger early; every other kernel lets its
dependants start at its end, as without PDL.

Kernels whose first act is `gdc_wait` (they read nothing before it: the decode split kernel,
the router, the experts' down GEMM and their final sum) are launched as dependents of the
kernel before them (`dependent`): their launch then overlaps that kernel's end, 0.3-0.4 us a
kernel boundary in a graph (docs/PERF.md, 2026-11-23 run 79).
"""

import torch

# Off: those kernels are launched plainly (the same results; for side-by-side timing).
DEPENDENT_LAUNCH = True


def supported(device: torch.device) -> bool:
    """CUDA from sm90 on (the interpreter has no grid dependency control)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def dependent(device: torch.device) -> bool:
    """Whether a kernel that waits at its top is launched as a programmatic dependent."""
    return DEPENDENT_LAUNCH and supported(device)
