"""Norms and few-row projections.

- `norm`: RMSNorm and the fused residual add + RMSNorm.
- `proj_norm`: output projection + residual add + RMSNorm in one launch at a few rows.
- `small_linear`: x w^T at one row, its weights loaded before the PDL wait.
- `norm_linear`: a layer's first projection that, at one row, normalises the residual itself.
- `fp8_linear`: x w^T for a block-FP8 weight, the activations quantised per token and 128
  columns (DeepSeek-V3's numerics); `fp8_tiles`: its launches, by shape.
"""
