"""mla_func.state (PageAllocator, init_state) and mla_func.batch (make_batch layout and errors)."""

import jaxtyping
import pytest
import torch

import mla_func as mf
from mla_func.batch import HOST_FIELDS
from mla_func.state import SCRATCH_PAGE


def test_allocator_never_hands_out_the_scratch_page():
    alloc = mf.PageAllocator(num_pages=5, page_size=4)
    assert alloc.free_pages == 4 and alloc.capacity_tokens == 16
    pages = alloc.reserve(0, 16)
    assert sorted(pages) == [1, 2, 3, 4] and SCRATCH_PAGE not in pages
    assert alloc.free_pages == 0


def test_allocator_grows_all_or_nothing_and_releases():
    alloc = mf.PageAllocator(num_pages=6, page_size=4)
    assert alloc.pages_needed(7, 9) == 3
    first = list(alloc.reserve(7, 5))
    assert len(first) == 2 and alloc.pages_needed(7, 9) == 1
    grown = alloc.reserve(7, 9)
    assert grown[:2] == first and len(grown) == 3  # growing keeps the pages it had
    alloc.reserve(8, 4)
    with pytest.raises(mf.CacheFullError, match="needs 2 more page"):
        alloc.reserve(9, 5)
    assert alloc.free_pages == 1 and 9 not in alloc.pages  # nothing taken on failure
    assert issubclass(mf.CacheFullError, ValueError)
    alloc.release(7)
    assert alloc.free_pages == 4 and 7 not in alloc.pages
    alloc.release(7)  # releasing twice is harmless
    assert alloc.free_pages == 4
    assert sorted(alloc.reserve(9, 16)) == [1, 2, 3, 5]


def test_allocator_needs_two_pages():
    with pytest.raises(ValueError, match="at least 2 pages"):
        mf.PageAllocator(1, 4)


@pytest.mark.parametrize("kw, words", [
    (dict(num_pages=1), r"num_pages must be an int >= 2 \(page 0 is scratch\), got 1"),
    (dict(num_pages=8, page_size=0), "page_size must be an int >= 1, got 0"),
    # Past the host's memory: the sizes named, not the allocator's raw error.
    (dict(num_pages=10**12), r"a cache of 1000000000000 pages x 16 tokens x 40 values x 3 "
                             r"layers in torch.float32 needs .* TiB but cpu has .* available"),
])
def test_init_state_checks_its_sizes(kw, words):
    with pytest.raises(ValueError, match=words):
        mf.init_state(mf.MLAConfig.preset("tiny"), **kw)


def test_init_state_shapes():
    cfg = mf.MLAConfig.preset("tiny")
    state = mf.init_state(cfg, num_pages=6, page_size=4)
    assert state.cache.shape == (cfg.num_hidden_layers, 6, 4, cfg.latent_dim)
    assert state.page_size == 4 and state.num_pages == 6
    assert state.allocator.free_pages == 5 and torch.all(state.cache == 0)


def test_make_batch_layout_decodes_first():
    work = [mf.SeqWork([7], 5, [3, 4]), mf.SeqWork([8], 2, [5]),
            mf.SeqWork([1, 2, 3], 4, [6, 2]), mf.SeqWork([9], 0, [1])]
    b = mf.make_batch(work, page_size=4, max_pages=3, vocab_size=16)
    assert b.token_ids.tolist() == [7, 8, 1, 2, 3, 9]
    assert b.positions.tolist() == [5, 2, 4, 5, 6, 0]
    # slot = page * page_size + offset: pos 5 -> page 4, pos 4..6 -> page 2
    assert b.slot_mapping.tolist() == [4 * 4 + 1, 5 * 4 + 2, 2 * 4, 2 * 4 + 1, 2 * 4 + 2, 4]
    assert b.token_seq.tolist() == [0, 1, 2, 2, 2, 3]
    assert b.page_table.tolist() == [[3, 4, 0], [5, 0, 0], [6, 2, 0], [1, 0, 0]]
    assert b.seq_lens.tolist() == [6, 3, 7, 1]
    assert b.query_start.tolist() == [0, 1, 2, 5]
    assert b.query_lens.tolist() == [1, 1, 3, 1]
    assert b.logits_index.tolist() == [0, 1, 4, 5]
    host = dict(zip(HOST_FIELDS, b.host.tolist(), strict=True))
    assert host == {"num_tokens": 6, "num_seqs": 4, "num_decodes": 2, "max_seq_len": 7,
                    "max_query_len": 3}
    assert b.host.device.type == "cpu" and not b.is_pure_decode
    assert b.num_tokens == 6 and b.num_seqs == 4 and b.num_decodes == 2
    # One buffer behind every device field, each starting 16-byte aligned and int32.
    for name in ("token_ids", "positions", "slot_mapping", "token_seq", "page_table",
                 "seq_lens", "query_start", "query_lens", "logits_index"):
        t = getattr(b, name)
        assert t.dtype == torch.int32 and t.is_contiguous(), name
        assert t.data_ptr() % 16 == 0, name


def test_one_token_prompt_is_a_prefill():
    b = mf.make_batch([mf.SeqWork([4], 0, [1])], page_size=4, max_pages=1)
    assert b.num_decodes == 0 and b.seq_lens.tolist() == [1]
    d = mf.make_batch([mf.SeqWork([4], 3, [1])], page_size=4, max_pages=1)
    assert d.is_pure_decode


@pytest.mark.parametrize("work,kw,words", [
    ([], {}, "at least one sequence"),
    ([mf.SeqWork([], 0, [1])], {}, "no new tokens"),
    ([mf.SeqWork([1, 2], 0, [1]), mf.SeqWork([3], 4, [2, 3])], {}, "decodes go first"),
    ([mf.SeqWork([1, 16], 0, [1])], {"vocab_size": 16},
     r"token id 16 \(sequence 0, position 1\) is outside the vocabulary \[0, 16\)$"),
    ([mf.SeqWork([2], 5, [1, 2]), mf.SeqWork([3, -1, 40, 3], 2, [3, 4])], {"vocab_size": 16},
     r"token id -1 \(sequence 1, position 3\) is outside .* \[0, 16\) \(and 1 more\)$"),
    ([mf.SeqWork([3, -1], 0, [1])], {}, r"token id -1 \(sequence 0, position 1\) is negative"),
    ([mf.SeqWork([2**31], 0, [1])], {}, "token id 2147483648 .* does not fit .* int32"),
    ([mf.SeqWork([1] * 5, 0, [1])], {}, "5 tokens need more than 1 pages"),
    ([mf.SeqWork([1], 0, [1, 2, 3, 4])], {}, "max_pages is 3"),
    ([mf.SeqWork([1], 0, [0])], {}, "scratch page"),
    ([mf.SeqWork([1], 0, [-3])], {}, r"negative page id\(s\) \[-3\]"),
    ([mf.SeqWork([1], -2, [1])], {}, "starts at -2"),
])
def test_make_batch_errors(work, kw, words):
    with pytest.raises(mf.BatchError, match=words):
        mf.make_batch(work, page_size=4, max_pages=3, **kw)
    assert issubclass(mf.BatchError, ValueError)


def test_forward_names_a_token_id_outside_the_vocabulary():
    """A CPU batch made without `vocab_size`: forward names the id, its sequence and position
    and the vocabulary before the embedding's IndexError (and before any cache write)."""
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg)
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    state.cache.normal_()
    before = state.cache.clone()
    work = [mf.SeqWork([5], 3, [1]), mf.SeqWork([5, 6, cfg.vocab_size + 7], 0, [2])]
    batch = mf.make_batch(work, page_size=4, max_pages=2)
    words = (r"token id 263 \(sequence 1, position 2\) is outside the vocabulary \[0, 256\)")
    with pytest.raises(mf.BatchError, match=words):
        mf.forward(params, state, batch)
    assert torch.equal(state.cache, before)
    ok = mf.make_batch([mf.SeqWork([5], 3, [1]), mf.SeqWork([5, 6, 255], 0, [2])], 4, 2)
    assert mf.forward(params, state, ok)[0].shape == (2, cfg.vocab_size)


@pytest.mark.cuda
def test_init_state_past_free_gpu_memory():
    """On a GPU the bound is the free device memory, named in the error; nothing allocated."""
    cfg = mf.MLAConfig.preset("v2-lite")
    free, _ = torch.cuda.mem_get_info()
    before = torch.cuda.memory_allocated()
    pages = free // (cfg.num_hidden_layers * 64 * cfg.latent_dim * 2) + 16
    words = r"needs [0-9.]+ GiB but cuda\S* has [0-9.]+ GiB available"
    with pytest.raises(ValueError, match=words):
        mf.init_state(cfg, num_pages=pages, page_size=64, device="cuda", dtype=torch.bfloat16)
    assert torch.cuda.memory_allocated() == before


def test_kv_state_refuses_a_cache_the_kernels_would_misread():
    """A permuted (non-contiguous) cache, a cache of another rank, or an allocator of another
    geometry is refused by name when the state is built."""
    from mla_func.state import KVState, PageAllocator

    cache = torch.zeros(2, 8, 4, 6)
    KVState(cache, PageAllocator(8, 4))  # the layout init_state makes
    with pytest.raises(ValueError, match="must be contiguous"):
        KVState(cache.transpose(1, 2), PageAllocator(4, 8))
    # jaxtyping's check (on in the tests) refuses the rank first; without it, __post_init__.
    with pytest.raises((ValueError, jaxtyping.TypeCheckError),
                       match=r"layers pages page_size latent|\[layers, pages, page_size"):
        KVState(cache[0], PageAllocator(8, 4))
    with pytest.raises(ValueError, match="allocator's 9 pages of 4 tokens"):
        KVState(cache, PageAllocator(9, 4))
