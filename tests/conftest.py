"""Test setup: jaxtyping+beartype checks are on for the whole package (pyproject addopts);
without a GPU, Triton kernels run in the interpreter and tests marked `cuda` are skipped."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any module defines a @triton.jit kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
