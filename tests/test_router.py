"""The fused router (kernels/router.py) vs `ops.moe.route` on fresh random inputs.

CPU: the kernel runs interpreted (conftest sets TRITON_INTERPRET), float32 x (the
interpreter's bfloat16 rounding is unreliable). The chosen experts must be the same set per
token, and the weights, matched by expert id, within 1e-5.
"""

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from mla_func.config import MLAConfig
from mla_func.kernels import router as fused
from mla_func.kernels.router import KERNEL_MAX_TOKENS, route_fused
from mla_func.ops.moe import route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cfg(method, experts, k, n_group=1, topk_group=1, norm=False, scale=1.0,
         model_type="deepseek_v3"):
    return replace(MLAConfig.preset("tiny"), model_type=model_type, n_routed_experts=experts,
                   num_experts_per_tok=k, topk_method=method, n_group=n_group,
                   topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scale)


def _inputs(cfg, tokens, hidden, dtype=torch.float32, device=DEVICE):
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    router = torch.randn(cfg.n_routed_experts, hidden, device=device) / hidden**0.5
    bias = 0.1 * torch.randn(cfg.n_routed_experts, device=device)
    return x, router, bias


def _assert_same_routing(got, want):
    (w, ids), (rw, rids) = got, want
    assert ids.dtype == rids.dtype == torch.int64 and w.dtype == rw.dtype == torch.float32
    assert w.shape == rw.shape and ids.shape == rids.shape
    s, rs = ids.sort(dim=1), rids.sort(dim=1)
    assert torch.equal(s.values, rs.values), "different experts chosen"
    torch.testing.assert_close(w.gather(1, s.indices), rw.gather(1, rs.indices),
                               rtol=1e-5, atol=1e-5)


CASES = [  # method, experts, n_group, topk_group, top_k, norm, scale, tokens, hidden
    ("greedy", 8, 1, 1, 1, False, 1.0, 1, 32),
    ("greedy", 8, 1, 1, 2, True, 2.5, 5, 48),
    ("greedy", 64, 1, 1, 6, False, 1.0, 5, 300),  # 3 splits, the last one partial
    ("greedy", 64, 1, 1, 8, True, 1.0, KERNEL_MAX_TOKENS, 32),
    ("group_limited_greedy", 64, 8, 3, 6, False, 1.0, 5, 64),
    ("group_limited_greedy", 64, 4, 2, 4, True, 16.0, 1, 40),
    ("group_limited_greedy", 160, 8, 3, 6, False, 1.0, 5, 64),  # not a power of two
    ("group_limited_greedy", 256, 8, 4, 8, False, 1.0, 1, 64),
    ("noaux_tc", 8, 4, 2, 2, True, 1.0, 5, 32),
    ("noaux_tc", 48, 4, 1, 3, False, 1.0, 1, 64),
    ("noaux_tc", 64, 8, 4, 6, True, 2.5, KERNEL_MAX_TOKENS, 256),
    ("noaux_tc", 256, 8, 4, 8, True, 2.5, 5, 96),
    ("noaux_tc", 256, 8, 4, 8, False, 1.0, 1, 64),
    ("noaux_tc", 64, 8, 4, 6, True, 2.5, 100, 64),  # above KERNEL_MAX_TOKENS: reference
    ("greedy", 64, 1, 1, 6, False, 1.0, 100, 64),
]


@pytest.mark.parametrize("method, experts, n_group, topk_group, k, norm, scale, tokens, hidden",
                         CASES)
def test_matches_route(method, experts, n_group, topk_group, k, norm, scale, tokens, hidden):
    # Both kernel paths are covered: one program per token block, and split + last arriver.
    cfg = _cfg(method, experts, k, n_group, topk_group, norm, scale)
    x, router, bias = _inputs(cfg, tokens, hidden)
    bias = bias if method == "noaux_tc" else None
    _assert_same_routing(route_fused(x, router, bias, cfg), route(x, router, bias, cfg))


def test_cases_cover_both_kernel_paths():
    splits = {fused.launch_config(c[7], c[1], c[8])["n_split"] > 1 for c in CASES
              if c[7] <= KERNEL_MAX_TOKENS}
    assert splits == {False, True}


@pytest.mark.parametrize("model_type, method", [("deepseek_v2", "greedy"),
                                                ("deepseek_v2", "noaux_tc")])
def test_normalises_exactly_when_route_does(model_type, method):
    # norm_topk_prob is ignored by V2 greedy/group routing and honoured by noaux_tc.
    cfg = _cfg(method, 16, 4, 4, 2, norm=True, scale=1.5, model_type=model_type)
    x, router, bias = _inputs(cfg, 3, 32)
    bias = bias if method == "noaux_tc" else None
    _assert_same_routing(route_fused(x, router, bias, cfg), route(x, router, bias, cfg))


def test_repeat_calls_reset_the_counters_and_agree():
    cfg = _cfg("noaux_tc", 64, 6, 8, 4, True, 2.5)
    x, router, bias = _inputs(cfg, 9, 512)
    assert fused.launch_config(9, 64, 512)["n_split"] > 1  # the split + last-arriver path
    first = route_fused(x, router, bias, cfg)
    second = route_fused(x, router, bias, cfg)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not fused._COUNTERS[torch.device(DEVICE)].any()


def test_traces_as_one_op_with_symbolic_tokens():
    from torch.fx.experimental.proxy_tensor import make_fx

    cfg = _cfg("noaux_tc", 64, 6, 8, 4, True, 2.5)
    x, router, bias = _inputs(cfg, 5, 32)
    gm = make_fx(lambda x, r, b: route_fused(x, r, b, cfg), tracing_mode="symbolic")(
        x, router, bias)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls if "mla_func" in str(n.target)] == [
        torch.ops.mla_func.moe_route.default]
    assert not isinstance(calls[0].meta["val"][0].shape[0], int)  # tokens stays symbolic


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
import re, subprocess, sys, tempfile
from mla_func.kernels.router import _router_kernel, launch_config
for tokens, e, h, k, method, g, tg, xdt in [(1, 64, 2048, 6, 0, 1, 1, "*bf16"),
                                          (64, 256, 7168, 8, 2, 8, 4, "*bf16")]:
    c = launch_config(tokens, e, h)
    sig = dict(x_ptr=xdt, r_ptr="*fp32", bias_ptr="*fp32", part_ptr="*fp32", cnt_ptr="*i32",
               w_out="*fp32", id_out="*i64", T="i32", hidden="i32", x_stride="i32",
               chunk="i32", n_split="i32", scale="fp32")
    const = dict(E=e, BLOCK_E=c["BLOCK_E"], BLOCK_H=c["BLOCK_H"], BLOCK_T=c["BLOCK_T"],
                 BLOCK_S=c["BLOCK_S"], K=k, BLOCK_K=triton.next_power_of_2(k), METHOD=method,
                 N_GROUP=g, BLOCK_G=triton.next_power_of_2(g), TOPK_GROUP=tg,
                 GROUP_SIZE=e // g, NORMALIZE=method == 2, HAS_BIAS=method == 2,
                 REDUCE=c["n_split"] > 1)
    sig.update({n: "constexpr" for n in const})
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=_router_kernel, signature=sig, constexprs=const),
        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=c["num_warps"]))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f.name,
                              "-o", f.name + ".cubin"], capture_output=True, text=True)
    regs = int(re.search(r"Used (\\d+) registers", out.stderr).group(1))
    spills = int(re.search(r"(\\d+) bytes spill stores", out.stderr).group(1))
    print(tokens, e, h, "registers", regs, "spills", spills)
    assert regs <= 128 and spills == 0, out.stderr
"""


def test_compiles_for_sm90_at_real_sizes():
    """Ahead-of-time sm90 compile (no GPU needed) at V2-Lite and V3 sizes."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
def test_v2_lite_size_on_gpu(tokens):
    cfg = MLAConfig.preset("v2-lite")
    x, router, _ = _inputs(cfg, tokens, cfg.hidden_size, torch.bfloat16, "cuda")
    _assert_same_routing(route_fused(x, router, None, cfg), route(x, router, None, cfg))


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 8, 64, 300])
def test_v3_size_on_gpu(tokens):
    cfg = MLAConfig.preset("v3")
    x, router, bias = _inputs(cfg, tokens, cfg.hidden_size, torch.bfloat16, "cuda")
    _assert_same_routing(route_fused(x, router, bias, cfg), route(x, router, bias, cfg))


@pytest.mark.cuda
def test_cuda_graph_replay_matches_route():
    cfg = MLAConfig.preset("v3")
    x, router, bias = _inputs(cfg, 4, cfg.hidden_size, torch.bfloat16, "cuda")
    route_fused(x, router, bias, cfg)  # warm-up: compiles, allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = route_fused(x, router, bias, cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        _assert_same_routing(out, route(x, router, bias, cfg))
