"""Test setup: jaxtyping+beartype checks are on for the whole package (pyproject addopts);
without a GPU, Triton kernels run in the interpreter and tests marked `cuda` are skipped. With
one, tests marked `interpret` are skipped: they launch Triton kernels on CPU tensors (small
shapes the interpreter allows), which only the interpreter can run, and the interpreter is
chosen once per process, before any kernel is defined. CI runs them; on a GPU machine,
`CUDA_VISIBLE_DEVICES= python3 -m pytest -q -m "not cuda"` does.

`-n auto` (pytest-xdist, the README's command): one worker process a CPU core without a GPU,
none (the tests run in this process, one at a time) with one. Each test process keeps to one
CPU thread: two processes on 2 cores with torch's default 2 OpenMP threads each ran an MoE
test in 9.5 s against 1.4 s with one thread each (threads waiting on descheduled ones)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any module defines a @triton.jit kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Inherited by xdist workers and subprocesses, which read them at start (numpy's OpenBLAS
# included); this process's torch is set below.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker a CPU core, at most 8 (each imports torch; the longest tests, ~30 s
    compiles, bound the run before that), none with a GPU (its tests would share one device
    and its memory: they run in this process). PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if torch.cuda.is_available():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(8, cores or 1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1":
            return
        marker, reason = "interpret", ("runs Triton on CPU tensors in the interpreter: run it "
                                       "with no GPU visible (CUDA_VISIBLE_DEVICES=)")
    else:
        marker, reason = "cuda", "needs a CUDA GPU"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def nan_empty(monkeypatch):
    """New buffers (`torch.empty`, `torch.empty_like`) start as NaN, or -7 for integer ones:
    a kernel that reads a row or a layout entry nothing wrote shows."""
    def poisoned(alloc):
        def make(*args, **kwargs):
            t = alloc(*args, **kwargs)
            if t.is_floating_point():
                return t.fill_(float("nan"))
            return t.fill_(-7) if t.dtype in (torch.int32, torch.int64) else t
        return make

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))
