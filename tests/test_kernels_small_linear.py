"""x w^T for a few rows (mla_func/kernels/small_linear.py) against torch: fresh random inputs,
outputs NaN-poisoned (`nan_empty`).

CPU runs use the Triton interpreter at small sizes; the CUDA test runs V2-Lite's fused q +
kv_a shape in bf16 behind another kernel and in a CUDA graph (the sm90 compile:
test_kernels_mla_sm90.py).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linear_helpers import DEV, projection_inputs, replay_matches_eager  # noqa: E402

from mla_func.kernels.linear import small_linear as sl  # noqa: E402
from mla_func.kernels.linear.small_linear import fits, small_linear  # noqa: E402


def _inputs(rows: int, n_in: int, n_out: int, dtype: torch.dtype, seed: int, x_pad: int = 0):
    """(x, w)."""
    return projection_inputs(rows, n_in, n_out, dtype, seed, pad=x_pad)


def _reference(x, w):
    return (x.float() @ w.float().T).to(x.dtype)


# (rows, n_in, n_out, K block): 22 outputs are 6 programs of BLOCK_N = 4, the last partly
# masked; 40 inputs over 16-wide blocks take the K loop (3 blocks, the last partly masked).
@pytest.mark.parametrize("rows,n_in,n_out,block_k", [
    (1, 48, 22, None), (3, 48, 22, None), (4, 40, 24, 16), (2, 32, 8, None),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(rows, n_in, n_out, block_k, dtype, nan_empty):
    """The kernel takes any row count (the model's plan gives it one row) and K blocks."""
    assert sl.BLOCK_N == 4  # the cases above are laid out for it
    x, w = _inputs(rows, n_in, n_out, dtype, seed=rows * 100 + n_in)
    assert fits(x, w) == (rows == 1)
    got = sl.run(x, w, max_rows=4, block_k=block_k or sl.BLOCK_K)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding step either way
    torch.testing.assert_close(got.float(), _reference(x, w).float(), rtol=tol, atol=tol)
    if rows == 1:  # the op, as the model calls it
        torch.testing.assert_close(small_linear(x, w).float(), got.float(), rtol=0, atol=0)


@pytest.mark.parametrize("block_k", [None, 16])
def test_strided_rows(block_k, nan_empty):
    """Rows further apart than they are wide (a column slice of a wider buffer, as the fused
    q + kv_a output's slices are): every row m > 0 is read at m * stride, not m * n_in; with
    16-wide K blocks, in the K loop too."""
    g = torch.Generator().manual_seed(5)
    # Sliced where it lives: `.to()` of a non-dense slice may come back contiguous.
    wide = torch.randn(3, 64, generator=g).to(DEV, torch.float32)
    x = wide[:, :48]
    w = (torch.randn(20, 48, generator=g) * 48**-0.5).to(DEV, torch.float32)
    assert x.stride() == (64, 1) and not x.is_contiguous()
    got = sl.run(x, w, max_rows=4, block_k=block_k or sl.BLOCK_K)
    torch.testing.assert_close(got, _reference(x, w), rtol=1e-5, atol=1e-5)


def test_more_rows_run_a_gemm():
    x, w = _inputs(sl.MAX_ROWS + 1, 48, 20, torch.float32, seed=6)
    assert not fits(x, w)
    torch.testing.assert_close(small_linear(x, w), x @ w.T)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_cuda_v2_lite_size_after_a_kernel_and_in_a_graph(rows):
    """V2-Lite's fused q + kv_a (2048 -> 3648) in bf16, right behind a kernel that writes x
    (PDL: the weights load early, x is read after the wait), eagerly and replayed from a CUDA
    graph: equal to the reference within bf16 rounding, replay = eager."""
    x, w = _inputs(rows, 2048, 3648, torch.bfloat16, seed=rows)
    src = torch.randn_like(x)

    def step():
        x.copy_(src * 2)  # a kernel before, writing what the product reads
        return sl.run(x, w, max_rows=4)

    y = step()
    torch.testing.assert_close(y.float(), _reference(x, w).float(), rtol=1e-2, atol=1e-2)
    replay_matches_eager(step, src)
