"""The Triton MLA attention backend and its kernels (DeepSeek-V2, arXiv:2405.04434).

- `backend`: `TritonMLA.run`, the "triton" attention backend (one mixed step: absorbed rows,
  MHA-form prefill rows).
- `absorbed`: the absorbed form: query absorption, split-KV decode, merge, value product.
- `absorb`: the query absorption with the new rows' prologue and cache write in one launch.
- `decode`, `decode_ws`, `ws_partitions`, `p_scratch`: the split-KV decode kernel (Triton), its
  warp-specialised Gluon form on sm90 and that kernel's partitions, and the p hand-off scratch.
- `merge`, `merge_uv`: the split-KV LSE merge, and the merge fused with the W_UV product.
- `decode_plan`: `plan_decode` (split count and tiles from static shapes) and the workspace.
- `prefill`: MHA-form causal prefill/extend (flash attention over the expanded K/V).
- `rope`, `cache_write`: the prologue (rope, latent norm) and the latent cache write.
"""
