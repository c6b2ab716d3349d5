"""Shared inputs of the MoE tests (test_moe.py on CPU, test_moe_cuda.py on a GPU): random
experts and routing, the reference, a tolerance check (the NaN-poisoning fixture
`nan_empty` is in conftest.py)."""

import dataclasses

import torch

from mla_func.kernels.moe_align import align_torch
from mla_func.kernels.moe_config import MoEConfig
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference
from mla_func.params import DenseMLP

# Tiles for the interpreter: one N-tile per GEMM at these sizes keeps the program count low.
SMALL = MoEConfig(16, (32, 64, 4, 1), (64, 32, 4, 1))
DIRECT = dataclasses.replace(SMALL, direct=True)
DIRECT_SUM = dataclasses.replace(SMALL, direct=True, fused_sum=True)
DIRECT_LAST = dataclasses.replace(SMALL, direct=True, last_sum=True)


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
