"""Rotary position embedding (Su et al. 2021) with DeepSeek's YaRN scaling (Peng et al. 2023).

DeepSeek checkpoints rotate interleaved pairs (x0, x1), (x2, x3), ...; we keep that layout in
the cache. HF's V3 code de-interleaves both q_pe and k_pe instead: the same permutation on both
sides, so every q_pe . k_pe (and so every logit) is unchanged.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor


def rope_cos_sin(
    positions: Int[Tensor, " tokens"], inv_freq: Float[Tensor, " qk_rope"], scale: float
) -> tuple[Float[Tensor, "tokens qk_rope"], Float[Tensor, "tokens qk_rope"]]:
    """cos/sin of position x frequency (float32), times YaRN's attention factor."""
    angles = positions.float()[:, None] * inv_freq.float()[None, :]
    return angles.cos() * scale, angles.sin() * scale


def apply_rope(
    x: Float[Tensor, "tokens *heads qk_rope"],
    cos: Float[Tensor, "tokens qk_rope"],
    sin: Float[Tensor, "tokens qk_rope"],
) -> Float[Tensor, "tokens *heads qk_rope"]:
    """Rotate each interleaved pair (a, b) to (a cos - b sin, b cos + a sin), in float32."""
    xf = x.float()
    pairs = xf.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    extra = (1,) * (x.dim() - 2)
    cos = cos.view(cos.shape[0], *extra, cos.shape[-1])
    sin = sin.view(sin.shape[0], *extra, sin.shape[-1])
    return (xf * cos + rotated * sin).to(x.dtype)
