"""Block-FP8 expert fixtures shared by the CPU (test_moe_fp8.py) and GPU (test_moe_fp8_cuda.py)
tests: random experts quantised in DeepSeek's blocks, `fused_experts` on their e4m3 data and
scales, and the float experts of the dequantised weights."""

import torch

from mla_func.fp8 import dequantize, quantize
from mla_func.kernels.moe.fp8_gemm import Fp8Scales
from mla_func.kernels.moe.fused import fused_experts
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import experts_reference
from mla_func.params import DenseMLP

LOOSE = 0.08  # against unquantised activations: the norm of the difference over the result's


def make_fp8(tokens, topk, n_exp, hidden, inter, shared, seed=0, skew=False, device="cpu",
             dtype=torch.float32):
    """Random routing, and experts (+ a shared MLP `shared` experts wide) quantised in
    DeepSeek's blocks of 128 (x is `dtype`, fresh random)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    x = r(tokens, hidden, scale=1.0).to(dtype)
    gate_up = quantize(r(n_exp, 2, inter, hidden, scale=hidden**-0.5), 128, 2, 1)
    down = quantize(r(n_exp, hidden, inter, scale=inter**-0.5), 128, 1, 1)
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:topk] for _ in range(tokens)])
    if skew:  # every token's first choice is expert 0
        ids = torch.stack([torch.cat((torch.zeros(1, dtype=torch.long),
                                      torch.randperm(n_exp - 1, generator=g)[:topk - 1] + 1))
                           for _ in range(tokens)])
    weights = (torch.rand(tokens, topk, generator=g) + 0.1).to(device)
    mlp = None
    if shared:
        width = shared * inter
        mlp = DenseMLP(quantize(r(2, width, hidden, scale=hidden**-0.5), 128, 1, 1),
                       quantize(r(hidden, width, scale=width**-0.5), 128, 0, 1))
    return x, weights, ids.to(device), gate_up, down, mlp


def fused_fp8(x, weights, ids, gate_up, down, mlp, cfg, **kw):
    """`fused_experts` on the e4m3 data and scales of the weights (as `mla_func.moe` passes
    them)."""
    n = gate_up.shape[0]
    extra = {}
    if mlp is not None:
        extra = dict(shared_gate_up=mlp.gate_up.scales, shared_down=mlp.down.scales[0],
                     shared_rows=(mlp.gate_up.block[0], mlp.down.block[0]))
    scales = Fp8Scales(gate_up.scales.view(n, 2, *gate_up.scales.shape[1:]), down.scales,
                       (gate_up.block[0], down.block[0]), **extra)
    data = [w.data.view(w.shape) for w in (gate_up, down)]
    shared = [None, None] if mlp is None else [w.data.view(w.shape) for w in (mlp.gate_up,
                                                                               mlp.down)]
    return fused_experts(x, weights, ids, *data, *shared, cfg, scales=scales, **kw)


def float_experts(x, weights, ids, gate_up, down, mlp):
    """The float experts of the dequantised weights (unquantised activations)."""
    out = experts_reference(x, weights, ids, dequantize(gate_up, x.dtype),
                            dequantize(down, x.dtype))
    if mlp is not None:
        out = out + swiglu(x, mlp.gate_up, mlp.down)
    return out


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()
