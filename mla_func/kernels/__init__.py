"""Triton (and Gluon) kernels, one concern per file with its launcher (DESIGN.md, "Layout").

- cache_write: [c_kv, k_pe] rows into the paged latent cache at the slot mapping.
- mla_decode, mla_merge, decode_plan: paged absorbed MLA decode: the split-KV kernel, the LSE
  merge kernels, and the launch plan (`plan_decode`) with its `DecodeWorkspace`; mla_absorbed:
  the absorbed attention those make up with the query absorption and the value product.
- mla_prefill: MHA-form causal prefill/extend (expanded K/V, flash attention).
- backend: registers the "triton" attention backend (imported lazily by get_backend).
- norm, rope: fused RMSNorm and the MLA prologue (rope, c_kv norm, cache row).
- moe_align, moe_tile, moe_inline_align, moe_config, moe_gemm, moe_gate_up, moe_down, moe_sum,
  fused_moe: expert alignment, the M-tile a GEMM program reads (aligned or direct layout; or
  the GEMM programs find their tiles themselves), the tile table, the grouped GEMMs' shared
  operands, the gate_up and down GEMM kernels, the pair sum, and the fused MoE that lays out
  and launches them.
- router, router_plan, router_select, router_rows: the fused MoE router (logits, then scoring,
  group mask, top-k) in one launch, its launch plan (token block and hidden split, by a cost
  model); at 1-4 rows one program an expert (router_rows).
- swiglu: the shared experts' SwiGLU apart (large steps): cuBLAS GEMMs, one fused silu * up.
- pdl: where programmatic dependent launch (sm90+) is available, and its rules.
- l2_prefetch: bulk L2 prefetches the decode's early-launched split and merge issue before they
  wait; absorb: the decode's query absorption and new rows in one launch; p_scratch: the
  64-head split kernel's p hand-off through scratch; mla_merge_uv: the split-KV merge fused
  with the W_UV product (a few decode rows).
- proj_norm, small_linear, norm_linear: few-row projections that load their weights before
  the PDL wait (o_proj + residual add + RMSNorm in one launch; a matrix-vector product; the
  fused q + kv_a projection of one row, which normalises the residual row itself).
- counters: the last-program arrival the router, proj_norm and the decode's fused merges
  share, and the per-op, per-device counters of the router and proj_norm.
- mla_decode_ws, mla_ws_partitions: the decode's split kernel at 64 heads a program on sm90,
  warp-specialised in Gluon (TMA loader warp, score and value warpgroups), and its partitions.
"""
