"""The fused router (kernels/router/route.py) vs `ops.moe.route` on fresh random inputs.

CPU: the kernel runs interpreted (conftest sets TRITON_INTERPRET), mostly with float32 x (the
interpreter's bfloat16 rounding is unreliable; loading bf16 x is exact, and the forced-config
tests use it for the kernel's TF32 split of a float32 router). A router in x's half dtype takes
one half-precision product: fp16 on the CPU, bf16 too on a GPU (the 3.9 interpreter's bf16
tl.dot is wrong). The chosen experts must be the same set per token, and the weights, matched
by expert id, within 1e-5. The sm90 AOT compile checks registers and spills at real sizes; the
`cuda` tests check the products against float32 on a GPU.
"""

from dataclasses import replace

import pytest
import torch
from sm90_ptxas import run_compile_script

from mla_func.config import MLAConfig
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.router import plan
from mla_func.kernels.router import route as fused
from mla_func.kernels.router.route import route_fused
from mla_func.ops.moe import route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cfg(method, experts, k, n_group=1, topk_group=1, norm=False, scale=1.0,
         model_type="deepseek_v3"):
    return replace(MLAConfig.preset("tiny"), model_type=model_type, n_routed_experts=experts,
                   num_experts_per_tok=k, topk_method=method, n_group=n_group,
                   topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scale)


def _inputs(cfg, tokens, hidden, dtype=torch.float32, device=DEVICE, router_dtype=None):
    """x in `dtype`; the router in `router_dtype` (default float32), its values fresh in each."""
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    router = torch.randn(cfg.n_routed_experts, hidden, device=device) / hidden**0.5
    router = router.to(router_dtype or torch.float32)
    bias = 0.1 * torch.randn(cfg.n_routed_experts, device=device)
    return x, router, bias


def _cpu_ties(tokens: int, method: str, k: int) -> dict[str, int]:
    """`_assert_same_routing`'s allowance in the small-size tests: one near tie from 32 tokens
    (the interpreter's dot sums in another order than torch's CPU GEMM; seen once, 2026-11-23:
    one token of 100, noaux_tc, 64 experts), a group's experts where groups are ranked."""
    return dict(near_ties=1 if tokens >= 32 else 0,
                max_swaps=1 if method == "greedy" else k)


# Selection margins under this (scores in (0, 1)) are ties for the GPU tests: the kernel's and
# cuBLAS's float32 logits differ by ~1e-6, so such a token may pick either side.
TIE = 1e-5


def _boundary_margin(x, router, bias, cfg) -> torch.Tensor:
    """Per token, in float64: how far the routing is from choosing otherwise, the smaller of
    the gap between the last kept and the first dropped group (group-limited methods) and the
    gap between the k-th and the next expert among the kept groups."""
    logits = x.double() @ router.double().T
    k, n_exp, method = cfg.num_experts_per_tok, router.shape[0], cfg.topk_method
    if method == "noaux_tc":
        choice = logits.sigmoid() + bias.double()
        group_scores = choice.view(-1, cfg.n_group, n_exp // cfg.n_group).topk(2, -1).values
        group_scores, fill = group_scores.sum(-1), float("-inf")
    else:
        choice = logits.softmax(dim=-1)
        group_scores = choice.view(-1, cfg.n_group, n_exp // cfg.n_group).amax(-1)
        fill = 0.0
    margin = torch.full((x.shape[0],), float("inf"), dtype=torch.float64, device=x.device)
    if method != "greedy" and cfg.topk_group < cfg.n_group:
        gs = group_scores.sort(dim=-1, descending=True).values
        margin = gs[:, cfg.topk_group - 1] - gs[:, cfg.topk_group]
        keep = group_scores.topk(cfg.topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(n_exp // cfg.n_group, 1), fill)
    cs = choice.sort(dim=-1, descending=True).values
    return torch.minimum(margin, cs[:, k - 1] - cs[:, k])


def _assert_same_routing_up_to_ties(got, want, inputs, max_swaps=1):
    """`_assert_same_routing`, where a token may choose otherwise only at a tie: its float64
    selection margin under TIE (`_boundary_margin` of `inputs` = (x, router, bias, cfg))."""
    (w, ids), (rw, rids) = got, want
    same = (ids.sort(dim=1).values == rids.sort(dim=1).values).all(dim=1)
    tied = _boundary_margin(*inputs) < TIE
    assert bool((same | tied).all()), (
        f"{int((~same & ~tied).sum())} tokens chose other experts without a tie; margins "
        f"{_boundary_margin(*inputs)[~same].tolist()}")
    _assert_same_routing((w[same], ids[same]), (rw[same], rids[same]))
    swapped = _swaps(ids, rids, ~same)
    assert bool((swapped <= max_swaps).all()), f"swaps {swapped.tolist()}"


def _swaps(ids, rids, differ):
    """Per token of `differ`: how many of its experts the reference did not choose."""
    return (ids[differ][:, :, None] != rids[differ][:, None, :]).all(dim=2).sum(dim=1)


def _assert_same_routing(got, want, near_ties=0, max_swaps=1):
    """The same expert set per token and the same weights per expert. `near_ties`: tokens
    that may swap one expert at the selection boundary. The kernel's logits (TF32 products
    split to ~fp32 accuracy) and cuBLAS's fp32 GEMM round differently at ~1e-6, so over
    thousands of random tokens an exact tie at that level can fall either way; the GPU tests
    at 4096 tokens allow one such token per thousand. Such a token swaps one expert, or under
    group-limited routing (`max_swaps`) the experts of a group that tied with another."""
    (w, ids), (rw, rids) = got, want
    assert ids.dtype == rids.dtype == torch.int64 and w.dtype == rw.dtype == torch.float32
    assert w.shape == rw.shape and ids.shape == rids.shape
    s, rs = ids.sort(dim=1), rids.sort(dim=1)
    same = (s.values == rs.values).all(dim=1)
    if near_ties:
        differ = ~same
        swapped = _swaps(ids, rids, differ)
        assert int(differ.sum()) <= near_ties and bool((swapped <= max_swaps).all()), \
            f"different experts for {int(differ.sum())} tokens, swaps {swapped.tolist()}"
    else:
        assert bool(same.all()), f"different experts chosen for {int((~same).sum())} tokens"
    torch.testing.assert_close(w.gather(1, s.indices)[same], rw.gather(1, rs.indices)[same],
                               rtol=1e-5, atol=1e-5)


# Token counts 1, 7, 33, 100, 300 for every method at 8, 64 and 256 experts; hidden sizes
# where the cost model both splits (small steps) and does not (large steps, small hidden).
CASES = [  # method, experts, n_group, topk_group, top_k, norm, scale, tokens, hidden
    ("greedy", 8, 1, 1, 1, False, 1.0, 1, 32),
    ("greedy", 8, 1, 1, 2, True, 2.5, 33, 48),
    ("greedy", 64, 1, 1, 6, False, 1.0, 7, 300),  # the last split partial
    ("greedy", 64, 1, 1, 6, False, 1.0, 100, 512),
    ("greedy", 64, 1, 1, 8, True, 1.0, 300, 64),
    ("greedy", 256, 1, 1, 8, False, 1.0, 33, 96),
    ("greedy", 256, 1, 1, 8, True, 1.0, 300, 64),
    ("greedy", 48, 1, 1, 4, False, 1.0, 5, 64),  # not a power of two
    ("group_limited_greedy", 8, 4, 2, 2, False, 1.0, 1, 64),
    ("group_limited_greedy", 8, 4, 2, 2, False, 1.0, 100, 32),
    ("group_limited_greedy", 64, 8, 3, 6, False, 1.0, 7, 64),
    ("group_limited_greedy", 64, 4, 2, 4, True, 16.0, 1, 40),
    ("group_limited_greedy", 64, 8, 3, 6, False, 1.0, 300, 128),
    ("group_limited_greedy", 160, 8, 3, 6, False, 1.0, 33, 640),  # groups of 20
    ("group_limited_greedy", 256, 8, 4, 8, False, 1.0, 1, 64),
    ("group_limited_greedy", 256, 8, 4, 8, True, 2.5, 100, 128),
    ("noaux_tc", 8, 4, 2, 2, True, 1.0, 7, 32),
    ("noaux_tc", 8, 4, 2, 2, True, 1.0, 300, 32),
    ("noaux_tc", 48, 4, 1, 3, False, 1.0, 1, 64),  # groups of 12
    ("noaux_tc", 64, 8, 4, 6, True, 2.5, 33, 256),
    ("noaux_tc", 64, 8, 4, 6, True, 2.5, 300, 64),
    ("noaux_tc", 256, 8, 4, 8, True, 2.5, 7, 96),
    ("noaux_tc", 256, 8, 4, 8, False, 1.0, 1, 256),
    ("noaux_tc", 256, 8, 4, 8, True, 2.5, 100, 64),
    ("noaux_tc", 256, 8, 4, 8, True, 2.5, 300, 160),
]


def _config(c):
    return plan.launch_config(c[7], c[1], c[8], c[2] if c[0] != "greedy" else 1)


@pytest.mark.parametrize("method, experts, n_group, topk_group, k, norm, scale, tokens, hidden",
                         CASES)
def test_matches_route(method, experts, n_group, topk_group, k, norm, scale, tokens, hidden):
    cfg = _cfg(method, experts, k, n_group, topk_group, norm, scale)
    x, router, bias = _inputs(cfg, tokens, hidden)
    bias = bias if method == "noaux_tc" else None
    _assert_same_routing(route_fused(x, router, bias, cfg), route(x, router, bias, cfg),
                         **_cpu_ties(tokens, method, k))


def test_cases_cover_the_kernel_paths():
    configs = [_config(c) for c in CASES]
    assert {c.n_split > 1 for c in configs} == {False, True}  # counter, and none
    assert any(c.n_split > 1 and c.blocks > 1 for c in configs)
    assert any(c.n_split > c.block_s for c in configs)  # the sum of partials loops
    assert any(c.sel_t == 1 for c in configs) and any(c.sel_t == 16 for c in configs)


FORCED = [  # experts, n_group, tokens, hidden, LaunchConfig fields the model would not pick
    (64, 8, 100, 200, dict(block_t=64, block_e=64, block_h=32, chunk=64, n_split=4, blocks=2,
                           sel_t=16, block_s=2)),  # several selection steps, padded tail
    (256, 8, 33, 96, dict(block_t=32, block_e=256, block_h=32, chunk=32, n_split=3, blocks=2,
                          sel_t=8, block_s=1)),
    (64, 1, 300, 64, dict(block_t=128, block_e=64, block_h=32, chunk=64, n_split=1, blocks=3,
                          sel_t=32, block_s=1)),
]


DTYPES = [  # x, router: every product form of the kernel
    (torch.float32, torch.float32),  # tf32x3
    (torch.bfloat16, torch.float32),  # the router split in two TF32 products
    (torch.float16, torch.float16),  # one half-precision product
    # ... in bf16, the model's for a bf16 model: on a GPU only (the 3.9 interpreter's bf16
    # tl.dot is wrong; fp16 runs the same code on the CPU)
    *([(torch.bfloat16, torch.bfloat16)] if DEVICE == "cuda" else []),
]


@pytest.mark.parametrize("experts, n_group, tokens, hidden, fields", FORCED)
@pytest.mark.parametrize("dtype, router_dtype", DTYPES)
def test_forced_configs_match_route(monkeypatch, experts, n_group, tokens, hidden, fields,
                                    dtype, router_dtype):
    # Bigger token blocks than the model picks at test sizes, in each product form.
    method = "noaux_tc" if n_group > 1 else "greedy"
    cfg = _cfg(method, experts, 8 if experts > 64 else 6, n_group, 4 if n_group > 1 else 1,
               norm=True, scale=2.5)
    forced = plan.LaunchConfig(**fields)
    monkeypatch.setattr(fused, "launch_config", lambda *args: forced)
    x, router, bias = _inputs(cfg, tokens, hidden, dtype, router_dtype=router_dtype)
    bias = bias if method == "noaux_tc" else None
    _assert_same_routing(route_fused(x, router, bias, cfg), route(x, router, bias, cfg),
                         **_cpu_ties(tokens, method, cfg.num_experts_per_tok))


@pytest.mark.parametrize("experts, hidden, n_group", [(64, 2048, 1), (256, 7168, 8),
                                                      (160, 5120, 8), (8, 32, 1)])
def test_launch_config_is_consistent(experts, hidden, n_group):
    decode = plan.launch_config(1, experts, hidden, n_group)
    assert hidden <= 32 or decode.n_split > 1  # decode spreads the router read
    for tokens in [*range(1, 70), 100, 128, 300, 512, 1000, 4096, 8192, 65536]:
        c = plan.launch_config(tokens, experts, hidden, n_group)
        assert c.blocks == -(-tokens // c.block_t) and c.chunk % c.block_h == 0
        assert (c.n_split - 1) * c.chunk < hidden <= c.n_split * c.chunk
        assert c.block_t % c.sel_t == 0 and c.block_t * c.block_e <= plan._ACC_TILE
        assert c.n_split == 1 or c.blocks <= plan.COUNTER_SLOTS


def test_half_router_is_read_as_it_is():
    """A router in x's half dtype is multiplied in it (one exact product); any other pairing
    reads it as float32."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert fused.router_is_half(bf16, bf16) and fused.router_is_half(fp16, fp16)
    assert not any(fused.router_is_half(x, r) for x, r in
                   [(bf16, fp32), (fp32, fp32), (fp32, bf16), (bf16, fp16), (fp16, bf16)])
    cfg = _cfg("greedy", 16, 4)
    c = plan.launch_config(40, 16, 64, 1, True)
    const = fused.kernel_constants(c, bf16, 16, 4, 1, 1, "greedy", False, False, half=True)
    assert const["W_HALF"] and not fused.kernel_constants(
        c, bf16, 16, 4, 1, 1, "greedy", False, False)["W_HALF"]
    half = bf16 if DEVICE == "cuda" else fp16  # the interpreter's bf16 tl.dot is wrong
    x, router, _ = _inputs(cfg, 40, 64, half, router_dtype=half)
    _assert_same_routing(route_fused(x, router, None, cfg), route(x, router, None, cfg))


def test_launch_config_counts_whole_waves():
    """A partial wave costs a whole one (docs/DECISIONS.md, `router.plan.launch_config`): at
    4096 V2-Lite tokens the pick is 4 splits of 32 blocks (one wave), not 5 (160 programs),
    which a per-SM share in fractions of a wave chose."""
    c = plan.launch_config(4096, 64, 2048, 1)
    assert (c.block_t, c.n_split) == (128, 4) and c.blocks * c.n_split <= plan._SMS


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
    assert plan.launch_config(9, 64, 512, 8).n_split > 1  # the split + last-arriver path
    counters = Runtime(x.device).counters
    first = route_fused(x, router, bias, cfg, counters)
    second = route_fused(x, router, bias, cfg, counters)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not counters.any()


def test_traces_as_one_op_with_symbolic_tokens():
    from torch.fx.experimental.proxy_tensor import make_fx

    cfg = _cfg("noaux_tc", 64, 6, 8, 4, True, 2.5)
    x, router, bias = _inputs(cfg, 5, 32)
    counters = Runtime(x.device).counters  # the state's, an input as in the model
    gm = make_fx(lambda x, r, b, c: route_fused(x, r, b, cfg, c), tracing_mode="symbolic")(
        x, router, bias, counters)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "mla_func" in str(n.target)]
    assert [n.target for n in calls] == [torch.ops.mla_func.moe_route.default]
    assert not isinstance(calls[0].meta["val"][0].shape[0], int)  # tokens stays symbolic


_AOT = """
import torch, triton
from triton.backends.compiler import GPUTarget
from sm90_ptxas import ptxas_usage
from mla_func.kernels.router.route import _router_kernel, kernel_constants
from mla_func.kernels.router.plan import launch_config
bf16, fp32 = torch.bfloat16, torch.float32
# x dtype, router dtype: a bf16 router with a bf16 x is the one-product (W_HALF) form.
for tokens, e, h, k, method, g, tg, xdt, rdt, pdl in [
        (1, 64, 2048, 6, "greedy", 1, 1, bf16, fp32, False),
        (128, 64, 2048, 6, "greedy", 1, 1, bf16, fp32, False),
        (4096, 64, 2048, 6, "greedy", 1, 1, bf16, fp32, False),  # 64-token blocks: wgmma
        (1, 256, 7168, 8, "noaux_tc", 8, 4, bf16, fp32, False),
        (8192, 256, 7168, 8, "noaux_tc", 8, 4, bf16, fp32, False),
        (128, 256, 7168, 8, "noaux_tc", 8, 4, fp32, fp32, False),  # float32 x: tf32x3
        (128, 64, 2048, 6, "greedy", 1, 1, bf16, bf16, False),
        (4096, 64, 2048, 6, "greedy", 1, 1, bf16, bf16, False),
        (8192, 256, 7168, 8, "noaux_tc", 8, 4, bf16, bf16, False),
        # Decode on sm90: launched early, one dot step a split (its router rows before the wait).
        (1, 64, 2048, 6, "greedy", 1, 1, bf16, fp32, True),
        (1, 64, 2048, 6, "greedy", 1, 1, bf16, bf16, True),
        (1, 256, 7168, 8, "noaux_tc", 8, 4, bf16, bf16, True)]:
    half = xdt == rdt == bf16
    c = launch_config(tokens, e, h, g, half)
    noaux = method == "noaux_tc"
    const = kernel_constants(c, xdt, e, k, g, tg, method, noaux, noaux, pdl=pdl, half=half,
                             early=True, preload=True)
    sig = dict(x_ptr="*bf16" if xdt == bf16 else "*fp32",
               r_ptr="*bf16" if rdt == bf16 else "*fp32", bias_ptr="*fp32",
               part_ptr="*fp32", cnt_ptr="*i32", w_out="*fp32", id_out="*i64", T="i32",
               hidden="i32", x_stride="i32", chunk="i32", n_split="i32", scale="fp32")
    sig.update({n: "constexpr" for n in const})
    kernel = triton.compile(
        triton.compiler.ASTSource(fn=_router_kernel, signature=sig, constexprs=const),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=c.num_warps, num_stages=c.num_stages))
    regs, spills, report = ptxas_usage(kernel)
    print(tokens, e, h, c, "registers", regs, "spills", spills, "smem", kernel.metadata.shared)
    assert spills == 0 and kernel.metadata.shared <= 160 * 1024, report
    assert const["PRELOAD"] == (pdl and c.chunk == c.block_h), const
    if const["PRELOAD"]:
        ptx = kernel.asm["ptx"]
        assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait"), "rows after the wait"
"""


def test_compiles_for_sm90_at_real_sizes():
    """Ahead-of-time sm90 compile (no GPU needed) at V2-Lite and V3 sizes, decode to prefill,
    and the early decode launch that loads its router rows before it waits."""
    out = run_compile_script(_AOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


GPU_TOKENS = [1, 7, 64, 128, 300, 512, 4096]


@pytest.mark.cuda
@pytest.mark.parametrize("router_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", GPU_TOKENS)
def test_v2_lite_size_on_gpu(tokens, router_dtype):
    cfg = MLAConfig.preset("v2-lite")
    x, router, _ = _inputs(cfg, tokens, cfg.hidden_size, torch.bfloat16, "cuda", router_dtype)
    _assert_same_routing_up_to_ties(route_fused(x, router, None, cfg),
                                    route(x, router, None, cfg), (x, router, None, cfg))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, router_dtype", [(torch.bfloat16, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16),
                                                 (torch.float32, torch.float32)])
@pytest.mark.parametrize("tokens", GPU_TOKENS)
def test_v3_size_on_gpu(tokens, dtype, router_dtype):
    cfg = MLAConfig.preset("v3")
    x, router, bias = _inputs(cfg, tokens, cfg.hidden_size, dtype, "cuda", router_dtype)
    # H100: one of 4096 tokens swapped 3 experts (2026-11-22), one of 512 (2026-11-23, run
    # 94): near ties between two groups. A token may differ only at a float64 tie.
    _assert_same_routing_up_to_ties(route_fused(x, router, bias, cfg),
                                    route(x, router, bias, cfg), (x, router, bias, cfg),
                                    max_swaps=cfg.num_experts_per_tok)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [4, 300])
def test_cuda_graph_replay_matches_route(tokens):
    cfg = MLAConfig.preset("v3")
    x, router, bias = _inputs(cfg, tokens, cfg.hidden_size, torch.bfloat16, "cuda")
    route_fused(x, router, bias, cfg)  # warm-up: compiles, allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = route_fused(x, router, bias, cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        # Unseeded inputs: one near tie (one expert of one token) is allowed per replay, as
        # at 4096 tokens below (H100, 2026-11-22: a replay of 300 V3 tokens chose another
        # expert set for some token; the run did not record how many tokens).
        _assert_same_routing(out, route(x, router, bias, cfg), near_ties=1,
                             max_swaps=cfg.num_experts_per_tok)
