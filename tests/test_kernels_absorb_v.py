"""The value up-projection kernel (mla_func/kernels/absorb_v.py) against the torch bmm it
replaces, on fresh random inputs and NaN-poisoned outputs whose columns past v_head must stay
untouched. CPU runs use the Triton interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import DEV, NAN, TOL, rel_err  # noqa: E402

from mla_func.kernels.absorb_v import absorb_v, reference_absorb_v  # noqa: E402


def check(tokens, heads, v_head, kv_lora, dtype=torch.float32, tol=TOL, seed=0):
    """o_lat as a strided view (rows of a larger buffer), o as the first v_head columns of a
    NaN-filled wider buffer: the product lands in o, the other columns stay NaN."""
    g = torch.Generator().manual_seed(seed)
    o_lat = torch.randn(heads, tokens + 2, kv_lora, generator=g).to(DEV, dtype)[:, 1:-1]
    w_uv = (torch.randn(heads, v_head, kv_lora, generator=g) * kv_lora ** -0.5).to(DEV, dtype)
    wide = torch.full((tokens, heads, v_head + 16), NAN, dtype=dtype, device=DEV)
    o = wide[..., :v_head]
    assert absorb_v(o_lat, w_uv, o) is o
    want = reference_absorb_v(o_lat.float(), w_uv.float(), torch.float32)
    assert rel_err(o, want) < tol
    assert wide[..., v_head:].isnan().all()


@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("heads", [16, 128])
def test_absorb_v_matches_torch(tokens, heads):
    check(tokens, heads, v_head=16, kv_lora=32, seed=tokens * heads)


def test_absorb_v_odd_sizes_and_several_token_blocks():
    """v_head and kv_lora not powers of two, v_head over three column blocks, tokens over
    three programs per (head, column block)."""
    check(133, 2, v_head=72, kv_lora=40, seed=1)


def test_absorb_v_real_sizes_few_tokens():
    check(3, 128, v_head=128, kv_lora=512, seed=2)


def test_absorb_v_no_tokens_is_a_no_op():
    o = torch.empty(0, 4, 16, device=DEV)
    assert absorb_v(torch.empty(4, 0, 32, device=DEV), torch.randn(4, 16, 32, device=DEV),
                    o) is o


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("heads", [16, 128])
def test_cuda_absorb_v_real_sizes_bf16(tokens, heads):
    check(tokens, heads, v_head=128, kv_lora=512, dtype=torch.bfloat16, tol=1e-2)
