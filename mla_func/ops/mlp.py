"""SwiGLU MLP (Shazeer 2020): down(silu(gate x) * up x), the dense FFN and shared experts."""

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor


def swiglu(
    x: Float[Tensor, "tokens hidden"],
    gate_up: Float[Tensor, "2 inter hidden"],
    down: Float[Tensor, "hidden inter"],
) -> Float[Tensor, "tokens hidden"]:
    gu = x @ gate_up.flatten(0, 1).T
    gate, up = gu.chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.T
