"""Step-function invariances on the tiny preset: chunked prefill, mixed batches, attention forms."""

import pytest
import torch

import mla_func as mf
from mla_func import kernel_ops
from mla_func.kernels.plan import MHA_MIN_QUERY, KernelOptions


@pytest.fixture(scope="module")
def tiny():
    cfg = mf.MLAConfig.preset("tiny")
    return cfg, mf.init_params(cfg, seed=1)


def _prompt(n, seed):
    return torch.randint(2, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_chunked_prefill_and_decode_match_one_shot(tiny):
    cfg, params = tiny
    tokens = _prompt(13, 0)
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    pages = state.allocator.reserve(0, 13)
    ref, _ = mf.forward(params, state, mf.make_batch([mf.SeqWork(tokens, 0, pages)], 4, 8))

    state = mf.init_state(cfg, num_pages=16, page_size=4)
    pages = list(reversed(state.allocator.reserve(0, 13)))  # pages out of order on purpose
    for lo, hi in ((0, 5), (5, 12), (12, 13)):
        batch = mf.make_batch([mf.SeqWork(tokens[lo:hi], lo, pages)], 4, 8)
        logits, state = mf.forward(params, state, batch)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


def test_mixed_batch_rows_equal_separate_runs(tiny):
    cfg, params = tiny
    a, b = _prompt(9, 1), _prompt(4, 2)
    state = mf.init_state(cfg, num_pages=32, page_size=4)
    pa, pb = state.allocator.reserve(0, 10), state.allocator.reserve(1, 4)
    _, state = mf.forward(params, state, mf.make_batch([mf.SeqWork(a, 0, pa)], 4, 8))
    # a decodes while b prefills, in one step.
    mixed = mf.make_batch([mf.SeqWork([7], 9, pa), mf.SeqWork(b, 0, pb)], 4, 8)
    assert mixed.num_decodes == 1 and not mixed.is_pure_decode
    logits, state = mf.forward(params, state, mixed)

    solo = mf.init_state(cfg, num_pages=32, page_size=4)
    p = solo.allocator.reserve(0, 10)
    ref_a, _ = mf.forward(params, solo, mf.make_batch([mf.SeqWork(a + [7], 0, p)], 4, 8))
    solo = mf.init_state(cfg, num_pages=32, page_size=4)
    p = solo.allocator.reserve(0, 4)
    ref_b, _ = mf.forward(params, solo, mf.make_batch([mf.SeqWork(b, 0, p)], 4, 8))
    torch.testing.assert_close(logits, torch.cat([ref_a, ref_b]), rtol=1e-4, atol=1e-4)


def test_long_prompt_uses_mha_form_and_agrees_with_absorbed(tiny, monkeypatch):
    from mla_helpers import mha_calls

    cfg, params = tiny
    tokens = _prompt(MHA_MIN_QUERY + 3, 3)
    outs = []
    mha = mha_calls(monkeypatch)["torch"]
    # The MHA form in every layer, then (threshold out of reach) in none.
    for threshold, calls in ((MHA_MIN_QUERY, cfg.num_hidden_layers), (10**9, 0)):
        mha.clear()
        opts = KernelOptions(mha_min_query=threshold)
        state = mf.init_state(cfg, num_pages=64, page_size=4)
        pages = state.allocator.reserve(0, len(tokens))
        logits, _ = mf.forward(params, state, mf.make_batch(
            [mf.SeqWork(tokens, 0, pages)], 4, 32, kernels=opts))
        outs.append(logits)
        assert len(mha) == calls
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_padded_rows_change_nothing(tiny):
    """A padded row (slot -1, scratch page) writes no live page and leaves real rows alone."""
    cfg, params = tiny
    tokens = _prompt(6, 4)
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    pages = state.allocator.reserve(0, 6)
    batch = mf.make_batch([mf.SeqWork(tokens, 0, pages)], 4, 4)
    ref, ref_state = mf.forward(params, state, batch)
    live = ref_state.cache[:, 1:].clone()

    state = mf.init_state(cfg, num_pages=16, page_size=4)
    pad = {}
    for name, f in batch.__dataclass_fields__.items():
        value = getattr(batch, name)
        if "pad" in f.metadata:
            extra = torch.full((2, *value.shape[1:]), f.metadata["pad"], dtype=value.dtype)
            value = torch.cat([value, extra])
        pad[name] = value
    logits, state = mf.forward(params, state, mf.Batch(**pad))
    torch.testing.assert_close(logits[:1], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.cache[:, 1:], live)


def test_meta_device_plans_v3_without_memory():
    params = mf.init_params(mf.MLAConfig.preset("v3"), device="meta")
    assert params.layers[3].mlp.gate_up.shape == (256, 2, 2048, 7168)
    assert params.embed.device.type == "meta"


def _decode_after(cfg, params, prompt, kernels=None):
    """The logits of one decode row (token 9) after `prompt`'s prefill, on a fresh cache."""
    state = mf.init_state(cfg, num_pages=16, page_size=4)
    pages = state.allocator.reserve(0, len(prompt) + 1)
    _, state = mf.forward(params, state, mf.make_batch([mf.SeqWork(prompt, 0, pages)], 4, 4,
                                                       kernels=kernels))
    batch = mf.make_batch([mf.SeqWork([9], len(prompt), pages)], 4, 4, kernels=kernels)
    return mf.forward(params, state, batch)[0]


@pytest.mark.interpret
def test_fused_kernels_match_the_reference_path(tiny):
    """The fused Triton norm/prologue kernels (interpreted on CPU) give the reference logits."""
    cfg, params = tiny
    tokens = _prompt(11, 5)
    outs = []
    for fused in (False, True):
        outs.append(_decode_after(cfg, params, tokens, KernelOptions(fused=fused)))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.interpret
def test_one_row_leaves_the_moe_norm_to_the_next_projection(tiny, monkeypatch):
    """The fused path with the Triton MoE (interpreted on CPU): at one decode row every MoE
    layer but the last is told to leave its norm out (`defer_norm`), and the next layer's
    `norm_linear` normalises h itself: with those norms NaN, the logits are still the
    reference path's."""
    from mla_func import kernel_ops

    cfg, params = tiny
    tokens = _prompt(11, 5)
    inner, seen = kernel_ops.experts_add_norm, []

    def triton_moe(*args, **kwargs):
        h, y = inner(*args, **kwargs)
        defer_norm = kwargs.get("defer_norm", args[9])
        seen.append((h.shape[0], defer_norm))
        if defer_norm and h.shape[0] == 1:
            y = torch.full_like(y, float("nan"))  # what nothing may read
        return h, y

    outs = [_decode_after(cfg, params, tokens, KernelOptions())]
    monkeypatch.setattr(kernel_ops, "experts_add_norm", triton_moe)  # a spy, no switch
    outs.append(_decode_after(cfg, params, tokens, KernelOptions(fused=True, experts="triton")))
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    assert moe_layers == 2 and seen == [(11, True), (11, False), (1, True), (1, False)]
    assert not outs[1].isnan().any()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_batch_for_another_page_size_is_refused(tiny):
    """Slots and page ids laid out for 8-token pages address other rows of a 16-token-page
    cache: forward refuses the batch before writing anything."""
    cfg, params = tiny
    state = mf.init_state(cfg, num_pages=8, page_size=16)
    batch = mf.make_batch([mf.SeqWork([5, 6, 7], 0, [1])], page_size=8, max_pages=4)
    before = state.cache.clone()
    with pytest.raises(mf.BatchError, match="pages of 8 tokens; this state's pages hold 16"):
        mf.forward(params, state, batch)
    assert torch.equal(state.cache, before)


def test_params_need_a_floating_dtype():
    with pytest.raises(ValueError, match="floating-point dtype .*; got torch.int32"):
        mf.init_params(mf.MLAConfig.preset("tiny"), dtype=torch.int32)


@pytest.mark.parametrize("name,dtype", [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                        ("fp16", torch.float16), ("float32", torch.float32)])
def test_dtypes_by_name(name, dtype):
    """`init_params` and `init_state` take a dtype or its name, the same table everywhere."""
    cfg = mf.MLAConfig.preset("tiny")
    assert mf.init_params(cfg, dtype=name).dtype == dtype
    assert mf.init_state(cfg, num_pages=4, page_size=4, dtype=name).cache.dtype == dtype
    with pytest.raises(ValueError, match="'bf17' is not a dtype name"):
        mf.init_state(cfg, num_pages=4, page_size=4, dtype="bf17")


def test_logits_are_float32_products_of_the_selected_rows():
    x = torch.randn(7, 64, dtype=torch.float64)
    lm_head = torch.randn(50, 64, dtype=torch.float64)
    index = torch.tensor([6, 0, 3])
    out = kernel_ops.logits(x.float(), index, lm_head.float(), KernelOptions())
    assert out.dtype == torch.float32 and out.shape == (3, 50)
    torch.testing.assert_close(out.double(), x[index] @ lm_head.T, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_keep_the_fp32_accumulator(dtype):
    """On CUDA, half-precision weights give logits unrounded to their dtype: closer to the exact
    product of the same half-precision inputs than one half-precision rounding step."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(33, 2048, device="cuda", generator=g).to(dtype)
    lm_head = (torch.randn(4096, 2048, device="cuda", generator=g) / 45).to(dtype)
    index = torch.arange(32, -1, -1, device="cuda")
    out = kernel_ops.logits(x, index, lm_head, KernelOptions())
    exact = x[index].double() @ lm_head.double().T
    rounded = (x[index] @ lm_head.T).double()  # what half-precision logits would be
    assert out.dtype == torch.float32
    err, half_err = (out.double() - exact).abs().max(), (rounded - exact).abs().max()
    assert err < 1e-4 * exact.abs().max() and err < half_err / 20
