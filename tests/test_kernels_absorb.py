"""The absorbed decode's fused prologue launch (mla_func/kernels/absorb.py) against torch: the
bmm it replaces, `ops.attention.prologue` and `reference_write`, on fresh random inputs,
NaN-poisoned outputs and padded rows (slot -1) whose cache rows must stay untouched. CPU runs
use the Triton interpreter."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any @triton.jit kernel is defined (CPU only)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mla_helpers import DEV, NAN, TOL, rel_err  # noqa: E402

from mla_func.kernels.attention.absorb import NewRows, absorb_prologue, reference_absorb  # noqa: E402
from mla_func.kernels.attention.cache_write import reference_write  # noqa: E402
from mla_func.ops.attention import prologue  # noqa: E402

ROPE = 16


def absorb_case(tokens, heads, nope, kv_lora, page_size, dtype, seed):
    """q and kv as the input projection leaves them (q_nope and q_pe strided views of q), the
    prologue's weights, a random cache, and distinct slots with every third row padding."""
    g = torch.Generator().manual_seed(seed)
    latent = kv_lora + ROPE

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(DEV, dtype)

    q = rnd(tokens, heads, nope + ROPE)
    w_uk = rnd(heads, nope, kv_lora, s=nope ** -0.5)
    pages = -(-tokens // page_size) + 2
    # A page of margin either side: a padding row written at slot -1 would land in the first.
    cache = rnd(pages + 2, page_size, latent)[1:-1]
    kv = rnd(tokens, latent + 8)[:, 8:]  # row-strided, as a slice of the projection's output
    slots = torch.randperm(pages * page_size, generator=g)[:tokens].to(torch.int32)
    slots[1::3] = -1
    positions = torch.randint(0, 9000, (tokens,), generator=g).to(torch.int32)
    inv_freq = (1.0 / 900.0 ** (torch.arange(0, ROPE, 2).float() / ROPE)).repeat_interleave(2)
    new = NewRows(q[..., nope:], kv, slots.to(DEV), positions.to(DEV), 1 + 0.1 * rnd(kv_lora),
                  inv_freq.to(DEV), 1.2, 1e-6)
    return q, w_uk, cache, new


def check(tokens, heads, nope, kv_lora, page_size=4, dtype=torch.float32, tol=TOL, seed=0):
    q, w_uk, cache, new = absorb_case(tokens, heads, nope, kv_lora, page_size, dtype, seed)
    whole = cache.as_strided((cache.shape[0] + 2, *cache.shape[1:]), cache.stride(),
                             cache.storage_offset() - cache.stride(0))
    want_q_pe, want_rows = prologue(new.q_pe, new.kv, new.kv_norm, new.positions, new.inv_freq,
                                    new.rope_scale, new.eps)
    want = whole.clone()
    reference_write(want[1:-1], want_rows, new.slot_mapping)
    q_lat = torch.full((heads, tokens, kv_lora), NAN, dtype=dtype, device=DEV)
    q_pe = torch.full((tokens, heads, ROPE), NAN, dtype=dtype, device=DEV)
    absorb_prologue(q[..., :nope], w_uk, q_lat, q_pe, cache, new)
    assert rel_err(q_lat, reference_absorb(q[..., :nope].float(), w_uk.float(),
                                           torch.float32)) < tol
    assert rel_err(q_pe, want_q_pe) < tol
    # Live rows written (close to the reference: two implementations of the norm and the
    # rope), every other row (padding's would-be targets, the margins) untouched.
    live = torch.zeros(whole.shape[0] * whole.shape[1], dtype=torch.bool, device=DEV)
    slots = new.slot_mapping[new.slot_mapping >= 0].long() + whole.shape[1]  # past the margin
    live[slots] = True
    got_flat, want_flat = whole.reshape(-1, whole.shape[-1]), want.reshape(-1, want.shape[-1])
    assert rel_err(got_flat[live], want_flat[live]) < tol
    assert torch.equal(got_flat[~live], want_flat[~live])


@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("heads", [16, 128])
def test_absorb_prologue_matches_torch(tokens, heads):
    check(tokens, heads, nope=16, kv_lora=32, seed=tokens * heads)


def test_absorb_prologue_odd_sizes_and_several_token_blocks():
    """qk_nope and kv_lora not powers of two, kv_lora over two column blocks, tokens over
    three absorb programs per (head, column block), page size 1."""
    check(133, 2, nope=24, kv_lora=136, page_size=1, seed=1)


def test_absorb_prologue_real_sizes_few_tokens():
    check(3, 128, nope=128, kv_lora=512, seed=2)


def test_absorb_prologue_no_tokens_is_a_no_op():
    q, w_uk, cache, new = absorb_case(0, 4, 16, 32, 4, torch.float32, 3)
    before = cache.clone()
    q_lat, q_pe = torch.empty(4, 0, 32, device=DEV), torch.empty(0, 4, ROPE, device=DEV)
    absorb_prologue(q[..., :16], w_uk, q_lat, q_pe, cache, new)
    assert torch.equal(cache, before)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("heads", [16, 128])
def test_cuda_absorb_prologue_real_sizes_bf16(tokens, heads):
    check(tokens, heads, nope=128, kv_lora=512, page_size=64, dtype=torch.bfloat16, tol=1e-2)
