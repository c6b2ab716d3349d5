"""mla_func.staging.HostStaging: pinned ring buffers for the step inputs (CUDA), and its errors."""

import pytest
import torch

import mla_func as mf
from mla_func.staging import HostStaging


def test_needs_a_cuda_device_and_two_slots():
    with pytest.raises(ValueError, match="feeds a CUDA device"):
        HostStaging("cpu")
    with pytest.raises(ValueError, match="at least 2 slots"):
        HostStaging("cuda", slots=1)


@pytest.mark.cuda
def test_cuda_copies_stay_intact_while_slots_are_reused():
    staging = HostStaging("cuda", slots=2)
    with pytest.raises(ValueError, match="copies CPU tensors"):
        staging.to_device(torch.zeros(3, device="cuda"))
    torch.cuda._sleep(100_000_000)  # the copies queue behind this: slots turn over in flight
    sent = []
    for i in range(9):
        n = 50 + 997 * i if i != 4 else 40_000  # one copy grows its slot past the first size
        src = torch.randint(-(2**30), 2**30, (n,), dtype=torch.int64 if i % 2 else torch.int32)
        sent.append((src.clone(), staging.to_device(src)))
        src.fill_(7)  # the caller's tensor may change at once: the slot holds the bytes
    rows = torch.arange(12, dtype=torch.int32).view(3, 4)
    sent.append((rows.clone(), staging.to_device(rows)))
    torch.cuda.synchronize()
    for want, got in sent:
        assert got.is_cuda and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)


@pytest.mark.cuda
def test_cuda_make_batch_through_staging_matches():
    work = [mf.SeqWork([5], 3, [1, 2]), mf.SeqWork([1, 2, 3], 0, [3])]
    staging = HostStaging("cuda")
    for _ in range(3):  # every slot once
        plain = mf.make_batch(work, page_size=4, max_pages=2, device="cuda")
        staged = mf.make_batch(work, page_size=4, max_pages=2, device="cuda", staging=staging)
        for name in ("token_ids", "positions", "slot_mapping", "token_seq", "page_table",
                     "seq_lens", "query_start", "query_lens", "logits_index", "host"):
            a, b = getattr(plain, name), getattr(staged, name)
            assert a.device == b.device and torch.equal(a, b), name
