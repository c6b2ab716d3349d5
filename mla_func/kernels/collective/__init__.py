"""Kernels that read other GPUs' memory: symmetric-memory signals and the fused sum.

- `signals`: per-program barriers across ranks over symmetric-memory signal pads (a
  compare-and-swap handshake at system scope, safe to replay in a CUDA graph).
- `reduce_norm`: the ranks' partial rows summed straight from their symmetric buffers, the
  residual added and the RMSNorm taken, in one launch (`all_reduce_add_rmsnorm`).

CUDA only: the interpreter has no peer memory. The CPU path of the same op is NCCL's or
gloo's all-reduce followed by the add and norm (`mla_func.parallel.comm`).
"""
