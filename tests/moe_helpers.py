"""Shared inputs of the MoE tests (test_moe.py on CPU, test_moe_cuda.py on a GPU): random
experts and routing, a random MoE layer as the model holds it, the references, a tolerance
check (the NaN-poisoning fixture `nan_empty` is in conftest.py)."""

import dataclasses

import torch
from test_router import TIE, _boundary_margin

from mla_func.kernels.moe import config as moe_config
from mla_func.kernels.moe.align import align_torch
from mla_func.kernels.moe.config import MoEConfig
from mla_func.kernels.router.route import route_fused
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference, route
from mla_func.ops.norm import rmsnorm
from mla_func.params import DenseMLP, MoE

# Tiles for the interpreter: one N-tile per GEMM at these sizes keeps the program count low.
SMALL = MoEConfig(16, (32, 64, 4, 1), (64, 32, 4, 1))
DIRECT = dataclasses.replace(SMALL, direct=True)
DIRECT_LAST = dataclasses.replace(SMALL, direct=True, last_sum=True)


def place_shared(monkeypatch, fold: bool | None) -> None:
    """Shared experts folded in (True) or run apart (False) at the tests' token counts, as
    `tokens <= FUSE_SHARED_MAX_TOKENS` places them at small and large ones; None: that rule."""
    if fold is not None:
        monkeypatch.setattr(moe_config, "FUSE_SHARED_MAX_TOKENS", 1 << 62 if fold else 0)


def make(tokens, topk, n_exp, hidden, inter, shared, dtype=torch.float32, device="cpu",
         skew=False, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)  # real-size weights made on device

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gd, device=device) * scale).to(dtype)

    x = r(tokens, hidden)
    gate_up = r(n_exp, 2, inter, hidden, scale=hidden**-0.5)
    down = r(n_exp, hidden, inter, scale=inter**-0.5)
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:topk] for _ in range(tokens)])
    if skew:  # every token's first choice is expert 0
        ids = torch.stack([torch.cat((torch.zeros(1, dtype=torch.long),
                                      torch.randperm(n_exp - 1, generator=g)[: topk - 1] + 1))
                           for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=g).to(device) + 0.1
    mlp = None
    if shared:
        mlp = DenseMLP(r(2, shared * inter, hidden, scale=hidden**-0.5),
                       r(hidden, shared * inter, scale=(shared * inter) ** -0.5))
    return x, weights, ids.to(device), gate_up, down, mlp


def reference(x, weights, ids, gate_up, down, mlp):
    out = experts_reference(x, weights, ids, gate_up, down)
    return out if mlp is None else out + swiglu(x, mlp.gate_up, mlp.down)


def close(a, b, tol):
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol * b.float().abs().max().item(), err


def tails(ids, n_exp, block_m):
    """(tails the tile before them takes under `MoEConfig.merge_tail`, short last tiles left
    alone) of the aligned layout without shared experts."""
    _, expert, rows = align_torch(ids, n_exp, 0, block_m)
    same = expert[1:] == expert[:-1]
    short = (rows[1:] <= block_m // 2) & (rows[1:] > 0)
    return int((same & short).sum()), int((same & (rows[1:] > block_m // 2)
                                               & (rows[1:] < block_m)).sum())


def moe_layer(cfg, tokens, hidden, inter, dtype=torch.float32, device="cpu", seed=0):
    """(an MoE of `cfg`'s routing, its input x, the residual stream h, the next norm's weight):
    all random. The router's logits have std ~2 (decisive scores); the bias (noaux_tc's
    e_score_correction_bias) is float32, as loaded; h is small beside the MoE's output, so
    that a wrong expert shows in h too."""
    n_exp = cfg.n_routed_experts
    x, _, _, gate_up, down, shared = make(tokens, cfg.num_experts_per_tok, n_exp, hidden, inter,
                                          cfg.n_shared_experts, dtype, device, seed=seed)
    g = torch.Generator(device=device).manual_seed(seed + 1)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    router = r(n_exp, hidden, scale=2 * hidden**-0.5).to(dtype)
    bias = r(n_exp, scale=0.3) if cfg.topk_method == "noaux_tc" else None
    h = r(tokens, hidden, scale=0.25).to(dtype)
    return MoE(router, bias, gate_up, down, shared), x, h, (1 + r(hidden, scale=0.1)).to(dtype)


def fused_layer(moe, x, h, weight, cfg):
    """(h + moe(x), its norm) as the model's fused path runs it (`kernel_ops`: the Triton
    router feeding the Triton experts, shared experts, add and norm in their final sum)."""
    from mla_func import kernel_ops
    from mla_func.kernels.launch.runtime import Runtime
    from mla_func.kernels.plan import KernelOptions

    opts = KernelOptions(fused=True, experts="triton")
    counters = Runtime(x.device).counters
    w, ids = kernel_ops.route(x, moe, cfg, opts, counters)
    return kernel_ops.experts_add_norm(x, w, ids, moe, h, weight, cfg.rms_norm_eps, opts,
                                       counters, defer_norm=False)


def reference_layer(moe, x, h, weight, cfg):
    """(h + moe(x), rmsnorm of it): `route`, every expert over every token, the shared MLP."""
    w, ids = route(x, moe.router, moe.score_bias, cfg)
    h = h + reference(x, w, ids, moe.gate_up, moe.down, moe.shared)
    return h, rmsnorm(h, weight, cfg.rms_norm_eps)


def same_routing(x, moe, cfg):
    """Per token, whether `route_fused` chose `route`'s experts. A token may choose otherwise
    only at a tie (its float64 selection margin under test_router's TIE): the two sum the
    logits in other orders."""
    ids = route_fused(x, moe.router, moe.score_bias, cfg)[1].sort(dim=1).values
    rids = route(x, moe.router, moe.score_bias, cfg)[1].sort(dim=1).values
    same = (ids == rids).all(dim=1)
    margin = _boundary_margin(x, moe.router, moe.score_bias, cfg)
    assert bool((same | (margin < TIE)).all()), f"margins {margin[~same].tolist()}"
    return same
