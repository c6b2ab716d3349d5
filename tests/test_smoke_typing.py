import pytest
import torch

import mla_func as mf


def test_forward_runs_under_checks_and_rejects_bad_shapes():
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    pages = state.allocator.reserve(0, 6)
    batch = mf.make_batch([mf.SeqWork([1, 2, 3], 0, pages)], 4, 4)
    logits, _ = mf.forward(params, state, batch)
    assert logits.shape == (1, cfg.vocab_size)
    bad = mf.Batch(**{**batch.__dict__, "positions": batch.positions[:2]}) if False else None
    with pytest.raises(Exception, match="tokens"):
        mf.Batch(**{**{k: getattr(batch, k) for k in batch.__dataclass_fields__},
                    "positions": torch.zeros(2, dtype=torch.int32)})
    del bad
