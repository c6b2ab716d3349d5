"""The step's ops, each the torch reference or a fused kernel as the options say.

`mla_func.model` calls these and nothing below them: which implementation runs is
`KernelOptions`' (`kernels.plan`), never the device's or a module's switch. The reference
paths are `mla_func.ops`; the fused ones are Triton kernels behind custom ops (one node each
for tracers), called directly when eager or through torch's dispatcher
(`KernelOptions.eager_direct`). The kernels' shape-dependent choices (how many rows a
few-row kernel takes, the MoE's tiles, the router's launch) come from `kernels.plan` too.

Across ranks (`params.tp` sharded: `mla_func.parallel`), the ops that end a sub-layer take
the group and sum the ranks' partial results before the residual add: `project_add_norm` (the
attention's heads), `experts_add_norm` (this rank's experts and its share of the shared
experts), `all_reduce` itself for the dense MLP; `embed` and `logits` work on vocabulary
shards. On one device they are the single-device ops, unchanged.

Weights: a projection's weight may be block FP8 (`fp8.Fp8Weight`). On the fused path, on a
device with e4m3 tensor cores (`kernels.plan.fp8_gemm_runs`), the projections taking one
(`linear`: q_b; `norm_linear`: q + kv_a; `project_add_norm`: o_proj; `mlp`: a dense
SwiGLU's gate/up and down) compute in block FP8 (`kernels/linear/fp8_linear.py`: the
activations quantised per token and 128 columns, DeepSeek-V3's numerics), the norm before
or the add+norm after in their own kernels; `kernels.plan` records it
(`StepPlan.projections`). Elsewhere FP8 weights are read through `fp8.dense`, dequantised
to the activations' dtype on the fly (CPU matmuls take no float8). W_UK and W_UV, the
absorbed attention's per-head products, are multiplied in the activations' dtype: on the
fused path the attention op takes them in FP8 as stored and its decode kernels read e4m3
(`absorbed`: the query's absorption dequantises each tile as it loads it, the bits of
dequantising the weight first; the merge with W_UV scales its e4m3 product once, each weight
exact), elsewhere they are dequantised before the op. The router, the norms, the embedding
and lm_head stay float.

The deferred norm (one decode row, fused path): a layer's first projection takes both the
normalised residual x and the residual h (`norm_linear`). Where
`kernels.plan.norm_linear_normalises(rows, hidden)` it normalises h itself and never reads x,
so the MoE before it may leave x unwritten: `experts_add_norm(..., defer_norm=True)` passes
that to the fused experts, whose last programs then skip the norm on the same predicate. Only
`norm_linear` may read the x of a deferred norm; the last layer's norm (read by the logits) is
never deferred.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.custom_op import EagerOp, custom_op
from mla_func.fp8 import Fp8Weight, Weight, dense
from mla_func.kernels.linear import fp8_linear as fused_fp8
from mla_func.kernels.linear import norm as fused_norm
from mla_func.kernels.linear import norm_linear as fused_norm_linear
from mla_func.kernels.linear import proj_norm
from mla_func.kernels.plan import KernelOptions, fp8_gemm_runs
from mla_func.kernels.router import route as fused_route
from mla_func.moe import experts as moe_experts
from mla_func.moe import experts_add_norm as moe_experts_add_norm
from mla_func.ops import moe as ref_moe
from mla_func.ops.mlp import swiglu
from mla_func.ops.norm import rmsnorm
from mla_func.parallel.comm import all_reduce, all_reduce_add_norm, gather_cols
from mla_func.parallel.group import SINGLE, TensorParallel
from mla_func.params import MoE

Rows = Float[Tensor, "tokens hidden"]
Counters = Int[Tensor, " counters"]


def _call(op: EagerOp, opts: KernelOptions) -> Callable[..., Any]:
    """The op itself (an eager call runs its function) or its dispatcher path."""
    return op if opts.eager_direct else op.dispatch


def norm(x: Float[Tensor, "tokens width"], weight: Float[Tensor, " width"], eps: float,
         opts: KernelOptions) -> Float[Tensor, "tokens width"]:
    """rmsnorm(x) * weight."""
    if opts.fused:
        return _call(fused_norm.rmsnorm, opts)(x, weight, eps)
    return rmsnorm(x, weight, eps)


def add_norm(h: Rows, r: Rows, weight: Float[Tensor, " hidden"], eps: float,
             opts: KernelOptions) -> tuple[Rows, Rows]:
    """(h + r, rmsnorm(h + r) * weight): the residual stream and the next sub-layer's input."""
    if opts.fused:
        return _call(fused_norm.add_rmsnorm, opts)(h, r, weight, eps)
    h = h + r
    return h, rmsnorm(h, weight, eps)


def embed(ids: Int[Tensor, " tokens"], table: Float[Tensor, "local_vocab hidden"],
          tp: TensorParallel, opts: KernelOptions, counters: Counters) -> Rows:
    """The embedding rows of `ids`; each rank looks up the ids its vocabulary shard holds
    (zeros elsewhere) and the sum over ranks makes every row whole."""
    if not tp.sharded:
        return table[ids]
    local = ids - tp.rank * table.shape[0]
    outside = (local < 0) | (local >= table.shape[0])
    rows = table[local.masked_fill(outside, 0)].masked_fill(outside[:, None], 0)
    return all_reduce(rows, tp, opts, counters)


def _fp8(w: Weight, opts: KernelOptions) -> bool:
    """Whether a product with w runs the block-FP8 GEMM: an FP8 weight, the fused path, a
    device with e4m3 tensor cores (`kernels.plan.fp8_gemm_runs`; before sm89 the weight is
    dequantised as on the reference path)."""
    return opts.fused and isinstance(w, Fp8Weight) and fp8_gemm_runs(w.data.device)


def absorbed(w_uk: Weight, w_uv: Weight, dtype: torch.dtype, opts: KernelOptions
             ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, int, int]:
    """The absorbed attention weights as the attention op takes them (`AttnWeights`' W_UK,
    W_UV, their scales and block): on the fused path block-FP8 ones stored a matrix a head
    on one grid as they are (the Triton backend's decode kernels read them as e4m3, its
    other paths and the torch backend dequantise them first); else in the activations'
    `dtype`."""
    if (opts.fused and isinstance(w_uk, Fp8Weight) and isinstance(w_uv, Fp8Weight)
            and w_uk.block == w_uv.block
            and all(w.data.shape == w.shape for w in (w_uk, w_uv))):  # a matrix a head
        return w_uk.data, w_uv.data, w_uk.scales, w_uv.scales, *w_uk.block
    return dense(w_uk, dtype), dense(w_uv, dtype), None, None, 0, 0


def linear(x: Float[Tensor, "tokens width_in"], w: Float[Tensor, "*rows width_in"] | Fp8Weight,
           opts: KernelOptions, counters: Counters) -> Float[Tensor, "tokens width_out"]:
    """x w^T, the weight's leading axes flattened into its output rows."""
    if _fp8(w, opts):
        return fused_fp8.fp8_linear(x, w, counters, opts.eager_direct)
    return x @ dense(w, x.dtype).flatten(0, -2).T


def mlp(x: Rows, gate_up: Float[Tensor, "2 inter hidden"] | Fp8Weight,
        down: Float[Tensor, "hidden inter"] | Fp8Weight, opts: KernelOptions,
        counters: Counters) -> Rows:
    """SwiGLU, down(silu(gate x) * up x) (`ops.mlp.swiglu`), its products in block FP8 where
    the weights are and the path is fused."""
    if not (_fp8(gate_up, opts) or _fp8(down, opts)):
        return swiglu(x, gate_up, down)
    gate, up = linear(x, gate_up, opts, counters).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, down, opts, counters)


def project_add_norm(
    o: Float[Tensor, "tokens width_in"], w: Float[Tensor, "hidden heads v_head"] | Fp8Weight,
    h: Rows, weight: Float[Tensor, " hidden"], eps: float, opts: KernelOptions, counters: Counters,
    tp: TensorParallel = SINGLE,
) -> tuple[Rows, Rows]:
    """(h + o w^T, rmsnorm(h + o w^T) * weight): the attention's output projection, the
    residual add and the FFN's input norm (one launch at a few rows: `kernels.plan`); o w^T
    summed over the ranks' heads where sharded (o: the heads' outputs side by side). An FP8
    weight on the fused path: the FP8 GEMM, then the add+norm kernel."""
    if _fp8(w, opts):
        y = fused_fp8.fp8_linear(o, w, counters, opts.eager_direct)
        if tp.sharded:
            return all_reduce_add_norm(y, h, weight, eps, tp, opts, counters)
        return add_norm(h, y, weight, eps, opts)
    w = dense(w, o.dtype).flatten(1)
    if tp.sharded:
        return all_reduce_add_norm(o @ w.T, h, weight, eps, tp, opts, counters)
    if opts.fused:
        return _call(proj_norm.proj_add_rmsnorm, opts)(o, w, h, weight, eps, counters)
    return add_norm(h, o @ w.T, weight, eps, opts)


def norm_linear(
    x: Float[Tensor, "tokens width_in"], h: Float[Tensor, "tokens width_in"],
    weight: Float[Tensor, " width_in"], eps: float,
    w: Float[Tensor, "width_out width_in"] | Fp8Weight, opts: KernelOptions, counters: Counters,
) -> Float[Tensor, "tokens width_out"]:
    """x w^T, x being rmsnorm(h) * weight (which a deferred norm left unwritten: the module
    docstring)."""
    if _fp8(w, opts):
        return fused_fp8.fp8_norm_linear(x, h, weight, eps, w, counters, opts.eager_direct)
    w = dense(w, x.dtype)
    if opts.fused:
        return _call(fused_norm_linear.norm_linear, opts)(x, h, weight, eps, w)
    return x @ w.T


def route(x: Rows, moe: MoE, cfg: MLAConfig, opts: KernelOptions, counters: Counters
          ) -> tuple[Float[Tensor, "tokens topk"], Int[Tensor, "tokens topk"]]:
    """(routing weights, expert ids) of each token (`ops.moe.route`'s numerics)."""
    if opts.fused:
        return fused_route.route_fused(x, moe.router, moe.score_bias, cfg, counters, opts)
    return ref_moe.route(x, moe.router, moe.score_bias, cfg)


def experts_add_norm(
    x: Rows, weights: Float[Tensor, "tokens topk"], ids: Int[Tensor, "tokens topk"], moe: MoE,
    h: Rows, weight: Float[Tensor, " hidden"], eps: float, opts: KernelOptions,
    counters: Counters, defer_norm: bool, tp: TensorParallel = SINGLE,
) -> tuple[Rows, Rows]:
    """(h + experts(x), its norm): the routed and shared experts, the residual add and the
    next norm (in the experts' final reduction on the fused path). `defer_norm`: the norm's
    only reader is `norm_linear` (the module docstring). Sharded: each rank sums its own
    experts' pairs (`ids` are global) and its share of the shared experts, then the ranks'."""
    if tp.sharded:
        part = moe_experts(x, weights, ids, moe.gate_up, moe.down, moe.shared, opts.experts,
                           counters, first_expert=tp.rank * moe.gate_up.shape[0])
        return all_reduce_add_norm(part, h, weight, eps, tp, opts, counters)
    return moe_experts_add_norm(x, weights, ids, moe.gate_up, moe.down, moe.shared, h, weight,
                                eps, impl=opts.experts, defer_norm=defer_norm, counters=counters,
                                trigger=opts.moe_trigger, direct=opts.eager_direct)


@custom_op("mla_func::logits", mutates_args=())
def _logits_op(x: Tensor, index: Tensor, lm_head: Tensor, group: str, ranks: int) -> Tensor:
    rows = x[index]
    if rows.is_cuda and rows.dtype in (torch.bfloat16, torch.float16):
        # cuBLAS stores its fp32 accumulator as is: no half-precision logits written, then
        # read and widened (at B=128 and a 102400-word vocabulary, 52 MB less traffic).
        out = torch.mm(rows, lm_head.T, out_dtype=torch.float32)
    else:
        out = (rows @ lm_head.T).float()
    return gather_cols(out, group, ranks) if ranks > 1 else out


@_logits_op.register_fake
def _(x, index, lm_head, group, ranks):
    return x.new_empty(index.shape[0], lm_head.shape[0] * ranks, dtype=torch.float32)


def logits(x: Rows, index: Int[Tensor, " seqs"], lm_head: Float[Tensor, "local_vocab hidden"],
           opts: KernelOptions, tp: TensorParallel = SINGLE) -> Float[Tensor, "seqs vocab"]:
    """float32 logits of the rows `index` of x (each sequence's last new token; on CUDA from
    half-precision weights, the product's fp32 accumulator unrounded), the ranks' vocabulary
    shards gathered side by side. One op (one node for tracers) whose rows are the sequences,
    not the tokens: a caller that runs the step in pieces padded to a token count can run it
    on the real sequences."""
    if tp.sharded:
        tp.require_group()  # a clear error where the shards have no group
    return _call(_logits_op, opts)(x, index, lm_head, tp.group, tp.size)


__all__ = ["absorbed", "add_norm", "all_reduce", "dense", "embed", "experts_add_norm", "linear",
           "logits", "mlp", "norm", "norm_linear", "project_add_norm", "route"]
