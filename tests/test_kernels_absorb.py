"""The fused query absorption + cache write (mla_func/kernels/absorb.py) against torch: the bmm
it replaces and `reference_write`, on fresh random inputs, NaN-poisoned outputs and padded rows
(slot -1) whose cache rows must stay untouched. CPU runs use the Triton interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import DEV, NAN, TOL, rel_err  # noqa: E402

from mla_func.kernels.absorb import absorb_and_write, reference_absorb  # noqa: E402
from mla_func.kernels.cache_write import reference_write  # noqa: E402


def absorb_case(tokens, heads, nope, kv_lora, page_size, dtype, seed):
    """q_nope as the model slices it from q (strided), w_uk, a random cache and kv_new, and
    distinct slots with every third row padding (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    latent = kv_lora + 16

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(DEV, dtype)

    q_nope = rnd(tokens, heads, nope + 16)[..., :nope]  # [q_nope, q_pe]: last dim contiguous
    w_uk = rnd(heads, nope, kv_lora, s=nope ** -0.5)
    pages = -(-tokens // page_size) + 2
    # A page of margin either side: a padding row written at slot -1 would land in the first.
    cache = rnd(pages + 2, page_size, latent)[1:-1]
    kv_new = rnd(tokens, latent)
    slots = torch.randperm(pages * page_size, generator=g)[:tokens].to(torch.int32)
    slots[1::3] = -1
    return q_nope, w_uk, cache, kv_new, slots.to(DEV)


def check(tokens, heads, nope, kv_lora, page_size=4, dtype=torch.float32, tol=TOL, seed=0):
    q_nope, w_uk, cache, kv_new, slots = absorb_case(tokens, heads, nope, kv_lora, page_size,
                                                     dtype, seed)
    whole = cache.as_strided((cache.shape[0] + 2, *cache.shape[1:]), cache.stride(),
                             cache.storage_offset() - cache.stride(0))
    want = whole.clone()
    reference_write(want[1:-1], kv_new, slots)
    q_lat = torch.full((heads, tokens, kv_lora), NAN, dtype=dtype, device=DEV)
    absorb_and_write(q_nope, w_uk, q_lat, cache, kv_new, slots)
    assert rel_err(q_lat, reference_absorb(q_nope.float(), w_uk.float(), torch.float32)) < tol
    # Live rows written, every other row (padding's would-be targets, margins) untouched.
    assert torch.equal(whole, want)


@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("heads", [16, 128])
def test_absorb_and_write_matches_torch(tokens, heads):
    check(tokens, heads, nope=16, kv_lora=32, seed=tokens * heads)


def test_absorb_and_write_odd_sizes_and_several_token_blocks():
    """qk_nope and kv_lora not powers of two, kv_lora over two column blocks, tokens over
    three absorb programs per (head, column block), page size 1."""
    check(133, 2, nope=24, kv_lora=136, page_size=1, seed=1)


def test_absorb_and_write_real_sizes_few_tokens():
    check(3, 128, nope=128, kv_lora=512, seed=2)


def test_absorb_and_write_no_tokens_is_a_no_op():
    q_nope, w_uk, cache, kv_new, slots = absorb_case(0, 4, 16, 32, 4, torch.float32, 3)
    before = cache.clone()
    q_lat = torch.empty(4, 0, 32, device=DEV)
    absorb_and_write(q_nope, w_uk, q_lat, cache, kv_new, slots)
    assert torch.equal(cache, before)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("heads", [16, 128])
def test_cuda_absorb_and_write_real_sizes_bf16(tokens, heads):
    check(tokens, heads, nope=128, kv_lora=512, page_size=64, dtype=torch.bfloat16, tol=1e-2)
