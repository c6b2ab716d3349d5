"""Float32 weights on a GPU: the plan's defaults run the torch reference ops there (the fused
kernels' tiles are sized for bf16/fp16), `generate(..., attention_backend="auto")` picks the
torch backend and runs (`pytest -m cuda`), and the triton backend, asked for explicitly, ends
in one line where its tiles do not fit, never in Triton's traceback. Block-FP8 weights: the
plan's FP8 experts (`plan_step(weights="fp8")`)."""

import pytest
import torch

import mla_func as mf
from mla_func.kernels import plan as P


def test_float32_on_cuda_defaults_to_the_reference_ops():
    for dtype in (torch.float32, "unknown"):
        kw = {} if dtype == "unknown" else {"dtype": dtype}
        opts = P.default_options("cuda", "auto", **kw)
        if dtype == "unknown":  # the weights' dtype not known: the GPU's kernels, as before
            assert (opts.attention, opts.fused, opts.experts) == ("triton", True, "triton")
        else:
            assert (opts.attention, opts.fused, opts.experts) == ("torch", False,
                                                                   "sorted_torch")
    for dtype in P.KERNEL_DTYPES:
        opts = P.default_options("cuda", "auto", dtype)
        assert (opts.attention, opts.fused, opts.experts) == ("triton", True, "triton")
    # Asked for, the triton backend stays (its kernels run float32 where their tiles fit);
    # the rest is the reference.
    opts = P.options_for("cuda", None, "triton", unset="auto", dtype=torch.float32)
    assert (opts.attention, opts.fused) == ("triton", False)
    # Planning on meta sees what a GPU runs with half-precision weights; the CPU, the reference.
    assert P.default_options("meta", dtype=torch.float32).fused
    assert P.default_options("cpu", "auto", torch.bfloat16) == P.KernelOptions()
    # Options given are the caller's: the dtype does not override them.
    mine = P.KernelOptions(attention="triton", fused=True, experts="triton")
    assert P.options_for("cuda", mine, "auto", unset="auto", dtype=torch.float32) is mine


def test_the_plan_of_float32_on_cuda_names_no_fused_kernel():
    cfg = mf.MLAConfig.preset("v2-lite")
    opts = P.default_options("cuda", "auto", torch.float32)
    spec = P.DeviceSpec("cuda", 132, (9, 0))
    for tokens, query in ((1, 1), (4096, 4096)):
        step = P.plan_step(cfg, spec, tokens, 1, options=opts, max_pages=256, page_size=16,
                           dtype=torch.float32, max_query_len=query)
        assert (step.qkv_a, step.o_proj, step.router, step.experts, step.moe, step.decode) == (
            "gemm", "gemm", "torch", "sorted_torch", None, None)


def test_fp8_weights_plan_the_fp8_experts():
    """The Triton experts run block-FP8 GEMMs from the FP8 rows of the tile table, the shared
    experts folded in where moe_inter is whole scale groups (V2-Lite's 1408 = 11 x 128);
    every other implementation and pre-sm89 GPUs dequantise (the bf16 rows)."""
    from mla_func.kernels.moe.config import pick_config

    v2 = mf.MLAConfig.preset("v2-lite")
    opts = P.KernelOptions(attention="triton", fused=True, experts="triton")
    h100, a100 = P.DeviceSpec("cuda", 132, (9, 0)), P.DeviceSpec("cuda", 108, (8, 0))

    def plan(tokens, cfg=v2, device=h100, options=opts, **kw):
        return P.plan_step(cfg, device, tokens, 1, options=options, max_pages=256,
                           page_size=16, **kw)

    for tokens in (1, 128, 1024):
        step = plan(tokens, weights="fp8")
        assert step.experts_precision == "fp8" and step.moe == pick_config(tokens, fp8=True)
        assert step.shared_experts == ("folded" if tokens <= 512 else "apart")
        assert step.summary()["experts_precision"] == "fp8"
        assert plan(tokens).experts_precision == "bfloat16"
    assert plan(8, v2.with_(moe_intermediate_size=1000), weights="fp8").shared_experts == "apart"
    assert plan(8, v2.with_(moe_intermediate_size=1000)).shared_experts == "folded"
    old = plan(8, device=a100, weights="fp8")
    assert old.experts_precision == "dequantised" and old.moe == pick_config(8)
    ref = plan(8, options=P.KernelOptions(), weights="fp8")
    assert ref.experts_precision == "dequantised" and ref.moe is None
    assert plan(8, mf.MLAConfig.preset("tiny").with_(n_routed_experts=0, n_shared_experts=0),
                weights="fp8").experts_precision == "none"
    with pytest.raises(ValueError, match="unknown weights 'int4'"):
        plan(8, weights="int4")


@pytest.mark.parametrize("dtype, says", [(torch.float32, True), (torch.bfloat16, False)])
def test_triton_backend_out_of_resources_is_one_line_at_float32(dtype, says, monkeypatch):
    """A kernel's OutOfResources at an operand dtype the kernels are not tuned for becomes a
    ValueError naming the dtypes they are and the torch backend; at bf16 it stays Triton's
    (a tile the plan should not have chosen)."""
    from triton.runtime.errors import OutOfResources

    from mla_func.kernels.attention.backend import TritonMLA

    def tight(self, *args, **kwargs):
        raise OutOfResources(409624, 232448, "shared memory")

    monkeypatch.setattr(TritonMLA, "attend", tight)
    q = torch.zeros(3, 128, 8, dtype=dtype)
    if not says:
        with pytest.raises(OutOfResources):
            TritonMLA().run(q)
        return
    with pytest.raises(ValueError) as info:
        TritonMLA().run(q)
    text = str(info.value)
    assert "\n" not in text and "bf16/fp16" in text and "attention_backend='torch'" in text
    assert "shared memory (409624 needed, 232448 there) with float32 weights" in text


def wide_config() -> mf.MLAConfig:
    """The tiny preset with 128 heads of V3's head dims (and its 512-wide latent)."""
    return mf.MLAConfig.preset("tiny").with_(
        num_attention_heads=128, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        kv_lora_rank=512, hidden_size=256, num_hidden_layers=2)


@pytest.mark.cuda
def test_float32_on_cuda_generates_with_auto(tmp_path):
    """Weights loaded in float32 onto CUDA (`load_hf(dir, device="cuda", dtype=float32)`), 128
    heads, a 3000-token prompt: "auto" runs the torch backend and the reference ops, and the
    logits of a shorter prompt are the CPU's."""
    from mla_func.checkpoint import save_hf

    cfg = wide_config()
    save_hf(cfg, mf.init_params(cfg, seed=0), tmp_path)
    _, params = mf.load_hf(tmp_path, device="cuda", dtype=torch.float32)
    _, cpu = mf.load_hf(tmp_path, device="cpu", dtype="fp32")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, cfg.vocab_size, (3000,), generator=g).tolist()
    out = mf.generate(cfg, params, [prompt], 2, eos_token_id=None, return_logits=True)
    assert out.attention_backend == "torch" and len(out.tokens[0]) == 2
    assert torch.isfinite(out.logits[0]).all()
    want, got = (mf.generate(cfg, p, [prompt[:300]], 1, eos_token_id=None, return_logits=True)
                 for p in (cpu, params))
    torch.testing.assert_close(got.logits[0], want.logits[0], rtol=2e-3, atol=2e-3)
