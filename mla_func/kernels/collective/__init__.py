"""Kernels that write into other GPUs' memory.

- `push_sum`: the ranks' rows summed by pushing (each rank stores its rows into every other
  rank's symmetric buffer over NVLink, then reads theirs from its own; no barrier), as a
  plain sum (`push_all_reduce`) or with the residual add and the RMSNorm of a sub-layer's end
  in the same launch (`push_all_reduce_add_rmsnorm`).

On the GPU the buffers are PyTorch's symmetric memory; the interpreter runs the same kernel
over ordinary tensors, one rank's launch after another. The CPU path of the step's sums is
gloo's all-reduce followed by the add and norm (`mla_func.parallel.comm`).
"""
