"""The fused MoE experts (after vLLM's fused_moe kernel; DeepSeekMoE, arXiv:2401.06066).

- `fused`: `fused_experts`, which lays out the tiles and launches the kernels below.
- `config`: `MoEConfig` and the tile table per static token count (`pick_config`).
- `align`, `inline_align`, `tile`: pairs sorted by expert into M-tiles (a launch, or found by
  the GEMM programs), and the M-tile a program reads.
- `gemm`, `gate_up`, `down`, `pair_sum`: the grouped GEMMs' shared loads, the gate_up GEMM with
  SiLU*up, the down GEMM with the routing weights, and the sum of each token's pairs (+ the
  residual add and RMSNorm).
- `fp8_gemm`: the GEMMs' block-FP8 K step (activations quantised per token group of 128) and
  the scales' layout.
- `swiglu`, `shared_fp8`: the shared experts apart (at large steps), on cuBLAS or in block FP8.
"""
