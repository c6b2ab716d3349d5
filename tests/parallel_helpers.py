"""Running a function on several ranks for the tests: `run_ranks(world, fn, ...)`.

Each rank is a process (`torch.multiprocessing`, spawn) in one gloo group on the CPU (NCCL
where `device` is "cuda": rank r on cuda:r), joined through a file store; a rank that raises
stops the others and the test fails with its traceback; none may run past `timeout`.
Workers save what the test compares under `out` (a directory).
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, store: str, device: str, fn, args) -> None:
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, tmp: Path, *args, device: str = "cpu",
              timeout: float = 240.0) -> None:
    """fn(rank, world, *args) on `world` ranks; raises what a rank raised."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.start_processes(_entry, args=(world, str(tmp / "store"), device, fn, args),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{world} ranks still running after {timeout} s (a hang)")


def rank_group():
    """The default group as `parallel.TensorParallel` (what a 1-D mesh gives)."""
    from mla_func.parallel.group import tensor_parallel

    return tensor_parallel(dist.group.WORLD)


def _bad_prompt_on_rank_1() -> None:
    """torchrun's job for tests/test_parallel.py: rank 1's prompt is out of the vocabulary."""
    import mla_func as mf
    from mla_func.parallel.group import init_from_env

    tp, device = init_from_env("cpu")
    cfg = mf.MLAConfig.preset("tiny")
    prompt = [5, 6, 999] if tp.rank == 1 else [5, 6, 7]
    mf.generate(cfg, mf.init_params(cfg), [prompt], 4, mesh=tp, page_size=4)


if __name__ == "__main__":
    import sys

    {"bad-prompt-on-rank-1": _bad_prompt_on_rank_1}[sys.argv[1]]()
