"""The few-row router (kernels/router/rows.py, one program an expert) vs `ops.moe.route` and
vs the split router on fresh random inputs, at 1 to MAX_ROWS rows.

CPU: interpreted, float32 x and router, and fp16 both (a half-precision model's form; as
test_router.py); the sm90 AOT compile checks registers and
spills at V2-Lite and V3 sizes and that the router rows load before the PDL wait; the `cuda`
tests run bf16 x at real sizes, up to float64 ties (test_router.py's margin).
"""

import pytest
import torch
from sm90_ptxas import run_compile_script
from test_router import (
    DEVICE,
    _assert_same_routing,
    _assert_same_routing_up_to_ties,
    _cfg,
    _inputs,
)

from mla_func.config import MLAConfig
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.plan import KernelOptions
from mla_func.kernels.router import rows as router_rows
from mla_func.kernels.router.route import route_fused
from mla_func.ops.moe import route

CASES = [  # method, experts, n_group, topk_group, top_k, norm, scale, tokens, hidden
    ("greedy", 64, 1, 1, 6, False, 1.0, 1, 256),
    ("greedy", 48, 1, 1, 4, True, 2.0, 3, 64),  # not a power of two
    ("group_limited_greedy", 64, 8, 3, 6, False, 1.0, 2, 128),
    ("group_limited_greedy", 160, 8, 3, 6, False, 16.0, 4, 96),  # groups of 20
    ("noaux_tc", 256, 8, 4, 8, True, 2.5, 1, 160),
    ("noaux_tc", 64, 8, 4, 6, True, 2.5, 4, 64),
]


@pytest.mark.parametrize("method, experts, n_group, topk_group, k, norm, scale, tokens, hidden",
                         CASES)
# x and the router in one dtype; the half one fp16 on the CPU (the 3.9 interpreter's bf16
# tl.dot, in the split router compared with, is wrong).
@pytest.mark.parametrize("dtype", [torch.float32,
                                   torch.bfloat16 if DEVICE == "cuda" else torch.float16])
def test_matches_route_and_the_split_router(monkeypatch, method, experts, n_group, topk_group,
                                            k, norm, scale, tokens, hidden, dtype):
    calls = []
    real = router_rows.route_rows
    monkeypatch.setattr(router_rows, "route_rows", lambda *a: calls.append(a) or real(*a))
    cfg = _cfg(method, experts, k, n_group, topk_group, norm, scale)
    x, router, bias = _inputs(cfg, tokens, hidden, dtype, router_dtype=dtype)
    bias = bias if method == "noaux_tc" else None
    rows = route_fused(x, router, bias, cfg)
    assert len(calls) == 1  # the few-row kernel ran
    _assert_same_routing(rows, route(x, router, bias, cfg))
    split = KernelOptions(fused=True, router_few_rows=False)
    _assert_same_routing(rows, route_fused(x, router, bias, cfg, options=split))
    assert len(calls) == 1


def test_rows_wider_than_a_step_and_the_counter(monkeypatch):
    # Hidden over BLOCK_HID: the loop after the first step (V3's 7168 at real sizes).
    monkeypatch.setattr(router_rows, "BLOCK_HID", 32)
    cfg = _cfg("noaux_tc", 64, 6, 8, 4, True, 2.5)
    x, router, bias = _inputs(cfg, 2, 100)
    counters = Runtime(x.device).counters
    first = route_fused(x, router, bias, cfg, counters)
    _assert_same_routing(first, route(x, router, bias, cfg))
    second = route_fused(x, router, bias, cfg, counters)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not counters.any()


def test_more_rows_take_the_split_router(monkeypatch):
    calls = []
    monkeypatch.setattr(router_rows, "route_rows", lambda *a: calls.append(a))
    cfg = _cfg("greedy", 8, 2)
    x, router, _ = _inputs(cfg, router_rows.MAX_ROWS + 1, 32)
    _assert_same_routing(route_fused(x, router, None, cfg), route(x, router, None, cfg))
    assert not calls
    with pytest.raises(ValueError, match="rows"):
        router_rows.launch(x, router, router, x, x, x, x, 1.0, {}, False)


_AOT = """
import torch, triton
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.router import rows as router_rows
from mla_func.kernels.router.route import kernel_constants
from mla_func.kernels.router.plan import launch_config
for tokens, e, h, k, method, g, tg, rdt in [(1, 64, 2048, 6, "greedy", 1, 1, "fp32"),
                                             (4, 64, 2048, 6, "greedy", 1, 1, "fp32"),
                                             (4, 256, 7168, 8, "noaux_tc", 8, 4, "fp32"),
                                             (1, 64, 2048, 6, "greedy", 1, 1, "bf16"),
                                             (4, 256, 7168, 8, "noaux_tc", 8, 4, "bf16")]:
    noaux = method == "noaux_tc"
    c = launch_config(tokens, e, h, g)
    const = kernel_constants(c, torch.bfloat16, e, k, g, tg, method, noaux, noaux, pdl=True)
    x = torch.empty(tokens, h, dtype=torch.bfloat16, device="meta")
    r = torch.empty(e, h, device="meta")
    grid, args, kwargs = router_rows.launch(x, r, r, r, r, r, r, 1.0, const, True)
    consts = {n: v for n, v in kwargs.items() if n.isupper()}
    sig = dict(x_ptr="*bf16", r_ptr="*" + rdt, bias_ptr="*fp32", part_ptr="*fp32", cnt_ptr="*i32",
               w_out="*fp32", id_out="*i64", T="i32", hidden="i32", x_stride="i32",
               scale="fp32")
    sig.update({n: "constexpr" for n in consts})
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=router_rows._router_rows_kernel, signature=sig,
                                  constexprs=consts),
        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=kwargs["num_warps"]))
    regs, spills, report = ptxas_usage(kernel)
    print(tokens, e, h, "registers", regs, "spills", spills)
    assert spills == 0, report
    ptx = kernel.asm["ptx"]
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait"), "rows after the wait"
"""


def test_compiles_for_sm90_at_real_sizes():
    out = run_compile_script(_AOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("router_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("preset", ["v2-lite", "v3"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_real_sizes_on_gpu(preset, tokens, router_dtype):
    cfg = MLAConfig.preset(preset)
    x, router, bias = _inputs(cfg, tokens, cfg.hidden_size, torch.bfloat16, "cuda",
                              router_dtype)
    bias = bias if cfg.topk_method == "noaux_tc" else None
    _assert_same_routing_up_to_ties(route_fused(x, router, bias, cfg),
                                    route(x, router, bias, cfg), (x, router, bias, cfg),
                                    max_swaps=cfg.num_experts_per_tok)
