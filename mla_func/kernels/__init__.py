"""Triton (and Gluon) kernels, by concern. Each sub-package's docstring lists its modules and
the entry points the layers above call; nothing here imports a sibling package's internals but
`launch` (the launch runtime every kernel family shares).

- `attention`: the MLA attention backend (`backend.TritonMLA`): query absorption with the
  prologue, paged split-KV decode (Triton, and the warp-specialised Gluon kernel on sm90), the
  LSE merges, the MHA-form prefill, the cache write, and the decode's launch plan.
- `moe`: the fused MoE experts (`fused.fused_experts`): tile layout, grouped gate_up / down
  GEMMs, the pair sum, the shared experts apart, and the tile table (`config`).
- `router`: the fused MoE router (`route.route_fused`): split-K logits and selection in one
  launch, its cost-model launch plan, and the one-program-an-expert form at a few rows.
- `linear`: norms and few-row projections (`norm`, `proj_norm`, `small_linear`,
  `norm_linear`) that fuse the residual add and RMSNorm or load their weights before the wait.
- `collective`: kernels that write into other GPUs' memory (tensor parallel): the pushed sum
  over ranks, alone or with a sub-layer's residual add and norm in the same launch.
- `e4m3`, `act_quant`, `swap_ab` (modules): what the FP8 kernels share: rounding to e4m3,
  activations quantised per token group, few-row e4m3 products swapped onto the warp-group MMA.
- `launch`: programmatic dependent launch (`pdl`), arrival counters (`counters`), bulk L2
  prefetches (`l2_prefetch`), and the `Runtime` a state owns (`runtime`).
- `plan`: one plan decides: `KernelOptions`, and `plan_step`, every kernel choice of a step
  from config, device, static shape and options; the kernels take their own choices from the
  same functions (`plan_rules`: the device's spec and the shape predicates, re-exported by
  `plan`).

Importing a kernel module imports Triton, which reads TRITON_INTERPRET then: set it first.
"""
