"""Programmatic dependent launch (PDL, sm90+): a kernel launched with `launch_pdl=True` may
start once every program of the kernel before it has called `gdc_launch_dependents`, and must
call `gdc_wait` before it touches anything that kernel writes (or memory the allocator might
hand out again: the stream-ordered allocator assumes the kernels run one after another).
The MLA decode's absorb, split and fused merge (`mla_merge_uv`) kernels, the MoE router and
the MoE's final sum (with the add + norm) trigger early; every other kernel lets its
dependants start at its end, as without PDL.
"""

import torch


def supported(device: torch.device) -> bool:
    """CUDA from sm90 on (the interpreter has no grid dependency control)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
