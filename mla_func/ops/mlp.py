"""SwiGLU MLP (Shazeer 2020): down(silu(gate x) * up x), the dense FFN and shared experts.
Block-FP8 weights are dequantised to x's dtype on the fly (`fp8.dense`)."""

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from mla_func.fp8 import Fp8Weight, dense


def swiglu(
    x: Float[Tensor, "tokens hidden"],
    gate_up: Float[Tensor, "2 inter hidden"] | Fp8Weight,
    down: Float[Tensor, "hidden inter"] | Fp8Weight,
) -> Float[Tensor, "tokens hidden"]:
    gate_up, down = dense(gate_up, x.dtype), dense(down, x.dtype)
    gu = x @ gate_up.flatten(0, 1).T
    gate, up = gu.chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.T
