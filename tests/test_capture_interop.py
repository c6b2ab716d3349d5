"""`capture.interop`: the dim table as `torch.export` dynamic shapes (the tiny model's step
exported with a dynamic `tokens` dim, run at other sizes against eager) and as dynamo marks."""

import pytest
import torch
from jaxtyping import Float, Int
from torch import Tensor

import mla_func as mf
from mla_func.capture import BindingError
from mla_func.capture.interop import export, export_dims, mark_dynamic, signature_of
from mla_func.dims import VOCABULARY


@pytest.fixture(scope="module")
def tiny():
    cfg = mf.MLAConfig.preset("tiny")
    return cfg, mf.init_params(cfg, seed=4)


def _state(cfg, device="cpu", dtype=torch.float32):
    """A state whose sequences 0 and 1 own the same pages in every call (one allocator
    order), so that two states' caches compare row for row."""
    state = mf.init_state(cfg, num_pages=16, page_size=4, device=device, dtype=dtype)
    return state, state.allocator.reserve(0, 24), state.allocator.reserve(1, 16)


def _prompt(n, seed):
    return torch.randint(2, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_export_dims_are_the_vocabularys(tiny):
    cfg, params = tiny
    state, a, b = _state(cfg)
    batch = mf.make_batch([mf.SeqWork(_prompt(4, 0), 0, a), mf.SeqWork([5, 6], 0, b)], 4, 6)
    dims = export_dims(signature_of(mf.forward, (params, state, batch)))
    assert sorted(dims) == ["seqs", "tokens"]
    for name, dim in dims.items():
        assert dim.__name__ == name
        assert (dim.min, dim.max) == (1, VOCABULARY[name].max_size)


def test_exported_step_runs_at_other_token_counts_as_eager(tiny):
    """Exported at 6 tokens of 2 sequences; run at 1..9 tokens, prefills then decodes, with
    the cache written in place as eager writes it."""
    exported_matches_eager(*tiny)


def exported_matches_eager(cfg, params, device="cpu", dtype=torch.float32, tol=1e-5):
    state, a, b = _state(cfg, device, dtype)
    pa, pb = _prompt(9, 1), _prompt(3, 2)

    def batch(work):
        return mf.make_batch(work, 4, 6, device, backend="auto")

    example = batch([mf.SeqWork(pa[:4], 0, a), mf.SeqWork(pb[:2], 0, b)])
    with torch.no_grad():
        exported = export(mf.forward, params, state, example)
    assert exported.dims == ("tokens", "seqs")
    program_state, _, _ = _state(cfg, device, dtype)
    eager_state, _, _ = _state(cfg, device, dtype)
    steps = [[mf.SeqWork(pa[:1], 0, a)],  # one token, one sequence
             [mf.SeqWork(pa[1:9], 1, a), mf.SeqWork(pb, 0, b)],
             [mf.SeqWork([7], 9, a), mf.SeqWork([8], 3, b)]]
    for work in steps:
        with torch.no_grad():
            got, out_state = exported(params, program_state, batch(work))
            want, eager_state = mf.forward(params, eager_state, batch(work))
        assert out_state.cache is program_state.cache  # donated: a new handle, same buffers
        program_state = out_state
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        torch.testing.assert_close(program_state.cache, eager_state.cache, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_exported_v2_lite_shape_on_gpu():
    """The same on the GPU: V2-Lite's shape (4 layers) in bf16, the fused kernels and the
    Triton attention inside the exported program (the same ops as eager: equal results)."""
    cfg = mf.MLAConfig.preset("v2-lite").with_(num_hidden_layers=4)
    params = mf.init_params(cfg, seed=7, device="cuda", dtype=torch.bfloat16)
    exported_matches_eager(cfg, params, "cuda", torch.bfloat16, tol=0.0)


def test_exported_step_refuses_other_static_fields(tiny):
    cfg, params = tiny
    state, a, b = _state(cfg)
    batch = mf.make_batch([mf.SeqWork([3, 4], 0, a)], 4, 6)
    with torch.no_grad():
        exported = export(mf.forward, params, state, batch)
    assert exported.dims == ("tokens",)  # one sequence: `seqs` stays static
    other = mf.make_batch([mf.SeqWork([3, 4], 0, a)], 4, 6,
                          kernels=mf.KernelOptions(mha_min_query=2))
    with pytest.raises(BindingError, match="batch.kernels"):
        exported(params, state, other)


def _rows(x: Float[Tensor, "tokens hidden"], s: Int[Tensor, " seqs"]
          ) -> Float[Tensor, "tokens hidden"]:
    return x


def test_mark_dynamic_skips_sizes_torch_specialises():
    """A dynamic axis of size 1 stays unmarked (dynamo would refuse the mark)."""

    x, s = torch.zeros(5, 3), torch.zeros(1, dtype=torch.int64)
    mark_dynamic(_rows, x, s)
    assert x._dynamo_dynamic_indices == {0}
    assert not getattr(s, "_dynamo_dynamic_indices", set())
