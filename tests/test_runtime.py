"""The kernels' plan and runtime: one plan decides, each state owns its resources.

- `kernels.plan.plan_step` against what the kernels' own entry points decide for the same
  shapes (they call the same predicates: a kernel that decided otherwise would show here);
- a runtime per state: two states never share counters, workspaces or streams;
- no module of the package keeps a mutable switch or a resource cache at module level;
- on a GPU, two engines stepping at once on two streams each give their eager results.
"""

import ast
from pathlib import Path

import pytest
import torch

import mla_func as mf
from mla_func.kernels import plan as P
from mla_func.kernels.launch.runtime import COUNTER_SLICES, COUNTER_SLOTS, Runtime, op_counters
from mla_func.kernels.moe.config import pick_config
from mla_func.kernels.router.plan import COUNTER_SLOTS as ROUTER_BLOCKS

V2_LITE = mf.MLAConfig.preset("v2-lite")
H100 = P.DeviceSpec("cuda", 132, (9, 0))


def _plan(tokens, seqs=None, options=None, cfg=V2_LITE, **kw):
    options = options or P.KernelOptions(attention="triton", fused=True, experts="triton")
    return P.plan_step(cfg, H100, tokens, seqs or tokens, options=options, max_pages=33,
                       page_size=16, **kw)


def test_one_decode_row_runs_the_few_row_kernels():
    p = _plan(1)
    assert (p.qkv_a, p.o_proj, p.router, p.experts) == (
        "norm_linear", "proj_norm", "rows", "triton")
    assert p.moe == pick_config(1) and p.moe.direct and p.moe_norm_deferred
    assert p.decode is not None and p.decode.uv and p.attention_form == "absorbed"
    assert p.shared_experts == "folded"


@pytest.mark.parametrize("tokens", [2, 4, 5, 128, 2048])
def test_larger_steps_leave_them(tokens):
    p = _plan(tokens)
    assert p.qkv_a == "gemm" and not p.moe_norm_deferred
    assert p.o_proj == ("proj_norm" if tokens <= P.PROJ_NORM_MAX_ROWS else "gemm")
    assert p.router == ("rows" if tokens <= P.ROUTER_ROWS_MAX else "split")
    assert p.router_launch is not None and p.moe == pick_config(tokens)
    assert p.shared_experts == ("folded" if tokens <= 512 else "apart")


def test_options_are_plan_fields():
    """What a switch used to flip is an option the plan carries and acts on."""
    assert _plan(1, options=P.KernelOptions(fused=True, router_few_rows=False)).router == "split"
    ref = _plan(1, options=P.KernelOptions())
    assert (ref.qkv_a, ref.o_proj, ref.router, ref.experts, ref.moe) == (
        "gemm", "gemm", "torch", "sorted_torch", None)
    assert ref.decode is None  # the torch attention backend has no decode plan
    mha = _plan(70, seqs=2, max_query_len=70)
    assert mha.attention_form == "absorbed+mha" and mha.decode is None
    low = P.KernelOptions(attention="triton", fused=True, experts="triton", mha_min_query=8)
    assert _plan(8, seqs=1, options=low, max_query_len=8).attention_form == "mha"
    assert _plan(64, max_query_len=None).attention_form == "per step"
    with pytest.raises(ValueError, match="fused=True"):
        P.KernelOptions(experts="triton")
    assert _plan(1).summary()["device"] == "cuda (132 SMs, sm90)"
    # "auto": the fastest backend the device runs.
    assert P.default_options("cuda", "auto").attention == "triton"
    assert P.default_options("cpu", "auto").attention == "torch"


def test_fp8_weights_plan_the_fp8_gemms():
    """Block-FP8 weights on the fused path: the projections are the FP8 GEMM's (the first
    one's norm apart at one row, o_proj's add+norm after), each with its launch; on the
    reference path they are dequantised, in the dtype."""
    one, many = _plan(1, weights="fp8"), _plan(128, weights="fp8")
    assert (one.qkv_a, one.o_proj, one.projections) == ("norm+fp8", "fp8+add_norm", "fp8")
    assert one.moe_norm_deferred and many.qkv_a == "fp8"
    gemms = dict(one.summary()["fp8_gemms"])
    assert set(gemms) == {"qkv_a", "o_proj", "mlp.gate_up", "mlp.down"}  # no q_lora
    # One row on the CUDA cores, K split (V2-Lite's 2048-wide inputs: 16 slices of 128).
    assert all("block_m=1 " in g and "quant=inline" in g for g in gemms.values())
    assert "split=16" in gemms["o_proj"]
    assert all("quant=apart" in g for _, g in many.fp8_gemms)
    ref = _plan(1, options=P.KernelOptions(), weights="fp8")
    assert (ref.qkv_a, ref.projections, ref.fp8_gemms) == ("gemm", "bfloat16", ())
    assert "fp8_gemms" not in _plan(1).summary() and _plan(1).projections == "bfloat16"
    with pytest.raises(ValueError, match="unknown weights 'int4'"):
        _plan(1, weights="int4")
    a100 = P.plan_step(V2_LITE, P.DeviceSpec("cuda", 108, (8, 0)), 1, 1, weights="fp8",
                       options=P.KernelOptions(fused=True), max_pages=33, page_size=16)
    assert (a100.qkv_a, a100.projections) == ("norm_linear", "bfloat16")  # no e4m3 MMA
    assert P.fp8_gemm_runs(torch.device("meta")) and P.fp8_gemm_runs(torch.device("cpu"))


def test_options_and_a_backend_that_disagrees_are_refused():
    """Options given with a backend other than theirs (and other than the call's default) are
    refused, at every place that takes both: make_batch, Engine, compile_step."""
    from mla_func.compile_step import plan_step as plan_capture_of

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg)
    state = mf.init_state(cfg, num_pages=8, page_size=4)
    triton = P.KernelOptions(attention="triton")
    assert P.options_for("cpu", triton, "torch") is triton  # "torch": make_batch's default
    with pytest.raises(mf.BatchError, match="backend='bogus' disagrees"):
        mf.make_batch([mf.SeqWork([1], 0, [1])], 4, 2, backend="bogus", kernels=triton)
    with pytest.raises(ValueError, match="backend='torch' disagrees"):
        mf.Engine(cfg, params, num_pages=8, attention_backend="torch", kernels=triton)
    with pytest.raises(ValueError, match="backend='bogus' disagrees"):
        plan_capture_of(params, state, backend="bogus", kernels=triton)


def test_the_kernels_decide_as_the_plan_says():
    """Each kernel's own guard calls the plan's predicate: for every row count the launch it
    picks is the plan's."""
    from mla_func.kernels.linear import norm_linear, proj_norm, small_linear

    for rows in range(1, 7):
        o, w = torch.randn(rows, 32), torch.randn(48, 32)
        h, nw = torch.randn(rows, 48), torch.randn(48)
        assert proj_norm.fits(o, w, h) == P.proj_norm_rows(rows, 48)
        assert small_linear.fits(o, w) == P.small_linear_rows(rows)
        assert norm_linear.fits(h, nw, torch.randn(8, 48)) == P.norm_linear_normalises(rows, 48)
    assert not proj_norm.fits(*(torch.randn(1, 8), torch.randn(P.PROJ_NORM_MAX_WIDTH + 1, 8),
                                torch.randn(1, P.PROJ_NORM_MAX_WIDTH + 1)))


def test_each_state_owns_its_runtime():
    cfg = mf.MLAConfig.preset("tiny")
    a, b = (mf.init_state(cfg, num_pages=8, page_size=4) for _ in range(2))
    assert a.runtime is not b.runtime and a.counters is a.runtime.counters
    assert a.counters.data_ptr() != b.counters.data_ptr()
    assert Runtime.of(a.cache) is a.runtime and Runtime.of(b.counters[3:]) is b.runtime
    assert a.runtime.resource("w", list) is a.runtime.resource("w", list)
    assert a.runtime.resource("w", list) is not b.runtime.resource("w", list)
    with pytest.raises(RuntimeError, match="no live runtime"):
        Runtime.of(torch.zeros(3))
    with pytest.raises(ValueError, match="its runtime's counters"):
        mf.KVState(a.cache, a.allocator, counters=b.counters, runtime=a.runtime)


def test_counter_slices_do_not_overlap_and_hold_the_router():
    spans = sorted(COUNTER_SLICES.values())
    for (first, n), (nxt, _) in zip(spans, spans[1:], strict=False):
        assert first + n <= nxt
    assert COUNTER_SLICES["moe_route"][1] >= ROUTER_BLOCKS
    counters = Runtime("cpu").counters
    assert counters.numel() == COUNTER_SLOTS and not counters.any()
    assert op_counters(counters, "proj_add_rmsnorm").numel() == 1
    with pytest.raises(ValueError, match="slots"):
        op_counters(counters[:10], "moe_route")


# Module-level state the package keeps on purpose: an index of which runtime owns a tensor
# (weak references: it owns nothing), the registry of attention backends by name, and the
# gloo twin of each NCCL process group the schedule check made (process groups are
# process-wide in torch.distributed: one twin a group, not one an engine).
ALLOWED = {"mla_func/kernels/launch/runtime.py": {"_OWNERS"},
           "mla_func/attention.py": {"BACKENDS"},
           "mla_func/parallel/schedule.py": {"_CPU_GROUPS"}}


def test_no_module_level_switches_or_caches():
    """No module assigns a bool at module level (a switch the step would consult) or keeps
    a mutable dict, list or set that it fills at run time (a process-wide resource)."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted((root / "mla_func").rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            elif isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            else:
                continue
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            switch = isinstance(value, ast.Constant) and isinstance(value.value, bool)
            empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None))) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", "") in (
                    "set", "dict", "list") and not value.args)
            if (switch or empty) and not names <= ALLOWED.get(rel, set()):
                found.append(f"{rel}:{node.lineno} {sorted(names)}")
    assert not found, found


@pytest.mark.cuda
def test_two_engines_on_two_streams_match_eager():
    """Two engines, each with full and piecewise graphs, stepping alternately on two streams
    without a sync between them: each request's tokens and logits are its eager run's."""
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    prompts = [[torch.randint(1, cfg.vocab_size, (n,), generator=g).tolist() for n in ns]
               for ns in ((5, 17, 9), (30, 3, 12, 7))]
    want = [mf.generate(cfg, params, p, max_new_tokens=6, mode="eager",
                        attention_backend="triton", return_logits=True, eos_token_id=None)
            for p in prompts]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    engines, rids = [], []
    for s, p in zip(streams, prompts, strict=True):
        with torch.cuda.stream(s):
            e = mf.Engine(cfg, params, num_pages=64, mode="full_and_piecewise",
                          attention_backend="triton", return_logits=True, eos_token_id=None,
                          progress=False, max_seqs=8)
        engines.append(e)
        rids.append([e.submit(x, 6) for x in p])
    assert engines[0].state.runtime is not engines[1].state.runtime
    assert mf.generate(cfg, params, prompts[0][:1], 1).attention_backend == "triton"  # auto
    while any(e.has_work for e in engines):
        for e, s in zip(engines, streams, strict=True):
            if e.has_work:
                with torch.cuda.stream(s):
                    e.step()
    torch.cuda.synchronize()
    for e, ids, w in zip(engines, rids, want, strict=True):
        for rid, tokens, logits in zip(ids, w.tokens, w.logits, strict=True):
            r = e.result(rid)
            assert r.tokens == tokens
            assert torch.equal(torch.stack(r.logits), logits)


def test_the_plan_records_each_buckets_kernels():
    """plan.json's "kernels": the options once, then what each bucket runs, by the same
    `plan_step` the kernels decide by."""
    from mla_func.compile_step import plan_step as plan_capture_of

    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, device="meta")
    state = mf.init_state(cfg, num_pages=64, page_size=16, device="meta")
    plan = plan_capture_of(params, state, max_tokens=64, max_seqs=8, max_pages=8,
                           backend="triton")
    kernels = plan.meta["kernels"]
    assert kernels["options"]["attention"] == "triton" and kernels["options"]["fused"]
    assert set(kernels) == {"options", "piecewise", "full"}
    assert [int(n) for n in kernels["full"]] == list(plan.buckets["full"])
    one, many = kernels["full"]["1"], kernels["piecewise"]["64"]
    want = P.plan_step(cfg, P.device_spec("meta"), 1, 1, max_pages=8, page_size=16,
                       options=P.default_options("meta", "triton"), dtype=params.dtype)
    assert one == want.summary(options=False)
    assert (one["qkv_a"], one["router"], many["qkv_a"], many["router"]) == (
        "norm_linear", "rows", "gemm", "split")
    assert one["decode"] is not None and many["attention_form"] == "per step"
