"""rmsnorm(h) w^T for one row, normalised by the projection's programs
(mla_func/kernels/norm_linear.py), against torch: fresh random inputs, x (the norm the op
before may leave unwritten) NaN where the kernel must not read it.

CPU runs use the Triton interpreter at small sizes; the CUDA test runs V2-Lite's fused q +
kv_a shape in bf16 behind another kernel and in a CUDA graph (the sm90 compile:
test_kernels_mla_sm90.py).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linear_helpers import projection_inputs, replay_matches_eager  # noqa: E402

from mla_func.kernels.linear import norm_linear as nl  # noqa: E402
from mla_func.kernels.linear import small_linear as sl  # noqa: E402
from mla_func.kernels.plan import NORM_LINEAR_MAX_WIDTH  # noqa: E402
from mla_func.ops.norm import rmsnorm  # noqa: E402

# The half-precision case: bf16 on a GPU; fp16 under the CPU interpreter, whose casts from
# float32 to bf16 truncate (Triton 3.9: 1 + 0.9 * 2**-7 became 1.0, not 1 + 2**-7).
HALF = torch.bfloat16 if torch.cuda.is_available() else torch.float16


def _inputs(rows, n_in, n_out, dtype, seed):
    """(h, norm weight, w): the row scaled away from 1, so that the norm matters."""
    h, w = projection_inputs(rows, n_in, n_out, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    weight = (1 + 0.1 * torch.randn(n_in, generator=g)).to(h.device, dtype)
    return 3 * h, weight, w


def _reference(h, weight, w):
    """The two launches it replaces: the norm rounded to the model dtype, then the product."""
    return (rmsnorm(h, weight, 1e-6).float() @ w.float().T).to(h.dtype)


# 22 outputs are 6 programs of BLOCK_N = 4, the last partly masked; 48 inputs a masked row.
@pytest.mark.parametrize("n_in,n_out", [(48, 22), (32, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_one_row_from_h_alone(n_in, n_out, dtype):
    assert sl.BLOCK_N == 4 and sl.MAX_ROWS == 1 and nl.normalises(1, n_in)
    h, weight, w = _inputs(1, n_in, n_out, dtype, seed=n_in)
    x = torch.full_like(h, float("nan"))  # unwritten: the kernel must not read it
    assert nl.fits(h, weight, w)
    got = nl.norm_linear(x, h, weight, 1e-6, w)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # half: one rounding step either way
    torch.testing.assert_close(got.float(), _reference(h, weight, w).float(), rtol=tol,
                               atol=tol)


def test_other_operands_more_rows_and_wider_rows():
    """An operand the kernel does not take (a float32 norm weight) is normalised in torch,
    still from h; past one row, and for rows wider than one program holds, the op is x w^T
    (`small_linear` or a GEMM) and reads x, not h."""
    h, weight, w = _inputs(1, 48, 20, HALF, seed=3)
    x = torch.full_like(h, float("nan"))
    assert not nl.fits(h, weight.float(), w)
    got = nl.norm_linear(x, h, weight.float(), 1e-6, w.float())
    want = rmsnorm(h, weight.float(), 1e-6) @ w.float().T
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    h, weight, w = _inputs(3, 48, 20, torch.float32, seed=4)
    x = torch.randn_like(h)
    assert not nl.normalises(3, 48)
    torch.testing.assert_close(nl.norm_linear(x, h, weight, 1e-6, w), x @ w.T)
    wide = NORM_LINEAR_MAX_WIDTH + 16  # no longer fits one program
    h, weight, w = _inputs(1, wide, 20, torch.float32, seed=5)
    x = torch.randn_like(h)
    assert not nl.normalises(1, wide) and sl.fits(x, w)
    got = nl.norm_linear(x, h, weight, 1e-6, w)
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cuda_v2_lite_size_after_a_kernel_and_in_a_graph():
    """The fused q + kv_a (V2-Lite 2048 -> 3648) in bf16, right behind a kernel that writes h
    (PDL: the weights load early, h is read after the wait), eagerly and replayed from a CUDA
    graph: equal to the reference within bf16 rounding, replay = eager."""
    h, weight, w = _inputs(1, 2048, 3648, torch.bfloat16, seed=7)
    src = torch.randn_like(h)
    x = torch.full_like(h, float("nan"))
    assert nl.fits(h, weight, w)

    def step():
        h.copy_(src * 2)  # a kernel before, writing what the product reads
        return nl.norm_linear(x, h, weight, 1e-6, w)

    y = step()
    torch.testing.assert_close(y.float(), _reference(h, weight, w).float(), rtol=1e-2,
                               atol=1e-2)
    replay_matches_eager(step, src)
