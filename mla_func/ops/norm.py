"""RMSNorm (Zhang & Sennrich 2019) with HF DeepseekV2RMSNorm's numerics: normalise in float32,
cast back to the input dtype, then scale."""

import torch
from jaxtyping import Float
from torch import Tensor


def rmsnorm(
    x: Float[Tensor, "*rows width"], weight: Float[Tensor, " width"], eps: float = 1e-6
) -> Float[Tensor, "*rows width"]:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
