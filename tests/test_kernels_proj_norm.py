"""The projection + residual add + RMSNorm launch (mla_func/kernels/proj_norm.py) against the
torch reference: fresh random inputs, outputs NaN-poisoned (`nan_empty`).

CPU runs use the Triton interpreter at small sizes (V2-Lite sizes in bf16 on a GPU: the
`cuda` test below; the sm90 compile: test_kernels_mla_sm90.py).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linear_helpers import projection_inputs, replay_matches_eager  # noqa: E402

from mla_func.kernels.launch.runtime import Runtime, op_counters  # noqa: E402
from mla_func.kernels.linear import proj_norm  # noqa: E402
from mla_func.kernels.linear.proj_norm import fits, proj_add_rmsnorm  # noqa: E402
from mla_func.kernels.plan import PROJ_NORM_MAX_WIDTH  # noqa: E402
from mla_func.ops.norm import rmsnorm  # noqa: E402

_RUNTIMES: dict[str, Runtime] = {}


def counters(t: torch.Tensor) -> torch.Tensor:
    """The counters of one runtime per device, shared by this module's calls."""
    key = str(t.device)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = Runtime(t.device)
    return _RUNTIMES[key].counters


def _inputs(rows: int, n_in: int, n_out: int, dtype: torch.dtype, seed: int, o_stride: int = 0):
    """(o, w, h, norm weight)."""
    return projection_inputs(rows, n_in, n_out, dtype, seed, pad=o_stride, residual=True)


def _reference(o, w, h, weight, eps):
    """The model's unfused path: the projection rounded to the dtype, h + it, the norm."""
    a = (o.float() @ w.float().T).to(h.dtype)
    hn = (h.float() + a.float()).to(h.dtype)
    return hn, rmsnorm(hn, weight, eps)


# (rows, n_in, n_out, K block): 44 outputs are 6 programs of BLOCK_N = 8, the last partly
# masked; 48 inputs under one 64-wide block; 40 inputs over 16-wide blocks take the K loop
# (3 blocks, the last partly masked).
@pytest.mark.parametrize("rows,n_in,n_out,block_k", [
    (1, 48, 44, None), (3, 48, 44, None), (4, 40, 64, 16), (2, 32, 16, None),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(rows, n_in, n_out, block_k, dtype, nan_empty):
    assert proj_norm.BLOCK_N == 8  # the cases above are laid out for it
    o, w, h, weight = _inputs(rows, n_in, n_out, dtype, seed=rows * 100 + n_in)
    assert fits(o, w, h)
    if block_k is None:
        h_new, y = proj_add_rmsnorm(o, w, h, weight, 1e-6, counters(h))
    else:  # the K loop: the kernel itself, with narrower steps than the model's
        h_new, y = proj_norm.run(o, w, h, weight, 1e-6, counters(h), block_k)
    h_ref, y_ref = _reference(o, w, h, weight, 1e-6)
    # fp32: summation order only; bf16: the projection's rounding can differ by one step.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(h_new.float(), h_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=tol, atol=tol)
    assert int(op_counters(counters(h), "proj_add_rmsnorm")[0]) == 0  # zero for the next


@pytest.mark.interpret
def test_strided_rows_and_repeated_calls(nan_empty):
    """o as a column slice of a wider buffer; back-to-back calls reuse the counter."""
    o, w, h, weight = _inputs(3, 48, 40, torch.float32, seed=7, o_stride=16)
    assert o.stride(0) == 64
    for _ in range(3):
        h_new, y = proj_add_rmsnorm(o, w, h, weight, 1e-6, counters(h))
        h_ref, y_ref = _reference(o, w, h, weight, 1e-6)
        torch.testing.assert_close(h_new, h_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)


def test_more_rows_run_the_gemm_and_add_norm():
    """Past the plan's rows (or width) the op runs the GEMM and add_rmsnorm."""
    o, w, h, weight = _inputs(proj_norm.MAX_ROWS + 1, 48, 40, torch.float32, seed=3)
    assert not fits(o, w, h)
    h_new, y = proj_add_rmsnorm(o, w, h, weight, 1e-6, counters(h))
    h_ref, y_ref = _reference(o, w, h, weight, 1e-6)
    torch.testing.assert_close(h_new, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    wide = _inputs(1, 16, PROJ_NORM_MAX_WIDTH + 16, torch.float32, seed=4)
    assert not fits(*wide[:3])


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_cuda_v2_lite_size_after_a_kernel_and_in_a_graph(rows):
    """bf16 at V2-Lite's sizes (16 heads x 128 -> 2048), launched right behind another kernel
    that writes `o` (PDL: the weights load early, `o` is read after the wait), eagerly and
    replayed from a CUDA graph: equal to the reference within bf16 rounding, replay = eager."""
    o, w, h, weight = _inputs(rows, 2048, 2048, torch.bfloat16, seed=rows)
    src = torch.randn_like(o)

    def step():
        o.copy_(src * 2)  # a kernel before, writing what the projection reads
        return proj_add_rmsnorm(o, w, h, weight, 1e-6, counters(h))

    h_new, y = step()
    h_ref, y_ref = _reference(o, w, h, weight, 1e-6)
    torch.testing.assert_close(h_new.float(), h_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    replay_matches_eager(step, src)
    assert int(op_counters(counters(h), "proj_add_rmsnorm")[0]) == 0
