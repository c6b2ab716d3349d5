"""Several GPUs of one host: tensor-parallel attention, expert-parallel MoE, one process a GPU.

- `group`: `TensorParallel`, this rank's place in the group (the static part of sharded
  params), built from a `torch.distributed` device mesh or process group; `init_from_env`
  for a process `torchrun` started.
- `shard`: `shard_params(params, mesh)`, a pure function from the whole parameters to this
  rank's, and the sizes each rank holds.
- `comm`: the collectives the step calls (`all_reduce`, the logits' gather) as custom ops,
  single nodes inside captured graphs.
- `schedule`: the check that every rank runs the same step.
"""
