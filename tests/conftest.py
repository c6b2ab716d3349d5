"""Test setup: jaxtyping+beartype checks are on for the whole package (pyproject addopts);
tests marked `cuda` are skipped without a GPU."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
