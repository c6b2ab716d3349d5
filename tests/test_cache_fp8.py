"""mla_func.cache_fp8 (the FP8 latent cache's rows) and what carries it: the state, the page
counts, the plans and plan.json, and a generation on the reference ops (the Triton kernels that
read and write the rows: test_kernels_mla_fp8.py)."""

import jaxtyping
import pytest
import torch

import mla_func as mf
from mla_func.cache_fp8 import GROUP, fp8_layout, is_fp8, layout_of, pack_rows, unpack_rows
from mla_func.fp8 import FP8_MAX
from mla_func.kernels import plan as P
from mla_func.kernels.attention.decode_plan import plan_decode
from mla_func.memory import cache_pages, cache_row_bytes, cache_sequences

V2_LITE = mf.MLAConfig.preset("v2-lite")
H100 = P.DeviceSpec("cuda", 132, (9, 0))


def test_layout_is_flashmla_656_bytes():
    lay = fp8_layout(512, 64)
    assert (lay.groups, lay.group, lay.scales_at, lay.rope_at, lay.row_bytes) == (
        4, 128, 512, 528, 656)
    assert layout_of(torch.empty(3, 656, dtype=torch.uint8), 512) == lay
    assert fp8_layout(32, 8).row_bytes == 32 + 4 + 16  # the tiny preset: one group of 32
    for kv_lora, rope in ((200, 64), (512, 63), (30, 8)):
        with pytest.raises(ValueError, match="FP8 cache"):
            fp8_layout(kv_lora, rope)


def test_pack_unpack_round_trip():
    """Values on the e4m3 grid of a group's scale come back exactly (the group's largest is
    448 x scale, so the scale is that power of two); random values within half an e4m3 step
    (2**-4 relative, 2**-10 x scale among subnormals); rope values rounded to bf16."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (6, 2, 2 * GROUP), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    grid = codes.view(torch.float8_e4m3fn).float()
    grid[..., ::GROUP] = FP8_MAX  # every group's largest |value| is 448
    scale = 2.0 ** torch.randint(-8, 8, (6, 2, 2, 1), generator=g).float()
    c_kv = (grid.unflatten(-1, (2, GROUP)) * scale).flatten(-2)
    k_pe = torch.randn(6, 2, 64, generator=g).bfloat16().float()
    rows = torch.cat((c_kv, k_pe), -1)
    packed = pack_rows(rows, 2 * GROUP)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 2, 2 * GROUP + 8 + 128)
    assert torch.equal(unpack_rows(packed, 2 * GROUP), rows)

    rows = torch.randn(64, 576, generator=g) * torch.randn(64, 1, generator=g).exp()
    rows[3] = 0  # an all-zero group: scale 1, zeros back
    back = unpack_rows(pack_rows(rows, 512), 512)
    c, c_back = rows[:, :512].unflatten(-1, (4, GROUP)), back[:, :512].unflatten(-1, (4, GROUP))
    step = c.abs().amax(-1, keepdim=True) / FP8_MAX * 2.0**-10
    assert ((c_back - c).abs() <= c.abs() * 2.0**-4 + step).all()
    assert torch.equal(back[:, 512:], rows[:, 512:].bfloat16().float())
    assert torch.equal(back[3], torch.zeros(576))
    assert unpack_rows(pack_rows(rows, 512), 512, torch.bfloat16).dtype == torch.bfloat16


def test_state_builds_and_reports_the_fp8_cache():
    state = mf.init_state(V2_LITE, num_pages=3, page_size=4, device="meta", kv_dtype="fp8")
    assert state.cache.shape == (27, 3, 4, 656) and is_fp8(state.cache)
    assert (state.kv_dtype, state.row_bytes) == ("fp8", 656)
    bf16 = mf.init_state(V2_LITE, 3, 4, device="meta", dtype="bf16")
    assert (bf16.kv_dtype, bf16.row_bytes) == ("bfloat16", 1152)
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        mf.init_state(V2_LITE, 3, 4, device="meta", kv_dtype="int8")
    with pytest.raises((ValueError, jaxtyping.TypeCheckError)):  # checked, or refused
        mf.KVState(torch.zeros(1, 2, 4, 8, dtype=torch.int32), mf.PageAllocator(2, 4))


def test_fp8_cache_holds_one_and_three_quarter_times_the_sequences():
    budget = 40 * 2**30
    assert (cache_row_bytes(V2_LITE), cache_row_bytes(V2_LITE, "fp8")) == (1152, 656)
    assert cache_row_bytes(V2_LITE, dtype=torch.float32) == 2304
    bf16, fp8 = (cache_pages(V2_LITE, budget, 64, k) for k in ("auto", "fp8"))
    assert abs(fp8 / bf16 - 1152 / 656) < 1e-3
    seqs = [cache_sequences(V2_LITE, budget, 4096, 64, k) for k in ("auto", "fp8")]
    assert seqs[1] >= 1.7 * seqs[0], seqs


def test_plans_pick_the_triton_decode_and_record_the_cache():
    """An FP8 cache: the split-KV Triton kernel (never the warp-specialised one, which reads
    bf16 rows), said by the plan; the bf16 plan at 128 heads on sm90 would run `ws`."""
    v3 = mf.MLAConfig.preset("v3")
    opts = P.KernelOptions(attention="triton", fused=True, experts="triton")
    plans = {k: P.plan_step(v3, H100, 4, 4, options=opts, max_pages=64, page_size=64,
                            kv_dtype=k) for k in ("auto", "fp8")}
    assert plans["auto"].decode.ws and not plans["auto"].decode.fp8
    assert plans["fp8"].decode.fp8 and not plans["fp8"].decode.ws
    assert (plans["auto"].cache, plans["fp8"].cache) == ("bfloat16", "fp8")
    summary = plans["fp8"].summary()
    assert summary["cache"] == "fp8" and summary["decode"].endswith("fp8")
    at16 = plan_decode(128, 4096, 132, 16, fp8=True, ws=True)
    assert (at16.block_n, at16.num_stages, at16.fp8, at16.ws) == (32, 3, True, False)


def test_plan_json_records_the_fp8_cache():
    """What compile_step's plan writes of an FP8 state ("cache"; each bucket's `StepPlan` is
    the test above's; tracing the step is the golden test's), and the capture signature names
    the cache's last axis `cache_row`."""
    from mla_func.capture.signature import analyze
    from mla_func.compile_step import cache_precision, decode_batch
    from mla_func.dims import VOCABULARY
    from mla_func.model import forward

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, device="meta")
    state = mf.init_state(cfg, num_pages=8, page_size=4, device="meta", kv_dtype="fp8")
    meta = cache_precision(state, cfg)
    assert meta["kv_dtype"] == "fp8" and meta["row_bytes"] == 52
    assert "fp8 e4m3" in meta["layout"]
    batch = decode_batch(2, 4, 4, "meta", P.KernelOptions())
    sig = analyze(forward, (params, state, batch), VOCABULARY)
    leaf = next(leaf for leaf in sig.leaves if leaf.path == "state.cache")
    assert leaf.dims[-1] == "cache_row" and sig.dims["cache_row"].size == 52


def test_generate_with_the_fp8_cache_on_the_reference_ops():
    """The tiny preset end to end (torch attention: the absorbed form, and the MHA form for a
    70-token prompt) with the FP8 cache against the float32 cache: the first step's logits
    within a few percent, the first tokens equal (random weights give flat logits, so later
    tokens may part: greedy agreement 20 of 32 at 8 new tokens)."""
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
               for n in (5, 9, 70, 3)]
    outs = [mf.generate(cfg, params, prompts, max_new_tokens=3, return_logits=True,
                        kv_dtype=k) for k in ("auto", "fp8")]
    for want, got in zip(outs[0].logits, outs[1].logits, strict=True):
        assert (got[0] - want[0]).norm() / want[0].norm() < 0.06
    assert [t[0] for t in outs[1].tokens] == [t[0] for t in outs[0].tokens]
    agree = sum(a == b for x, y in zip(outs[0].tokens, outs[1].tokens, strict=True)
                for a, b in zip(x, y, strict=True))
    assert agree >= 8  # of 12
    with pytest.raises(ValueError, match="kv_dtype"):
        mf.generate(cfg, params, prompts, max_new_tokens=1, kv_dtype="e5m2")
