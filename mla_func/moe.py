"""The routed (and optionally shared) experts the model calls: `experts(...)`.

Implementations, all static-shape and free of host syncs (nothing waits on the device's values):
- `"triton"` (`KernelOptions.experts`; the default on CUDA): the fused grouped GEMM of
  `mla_func.kernels.moe.fused`, behind the custom op `mla_func::moe_experts` so that a trace
  of the model sees one node.
- `"sorted_torch"` (the default elsewhere): the same algorithm in plain torch: pairs sorted by
  expert (`moe_align.align_torch`), one bmm per GEMM over M-tiles with each tile's expert weights
  gathered. Its tile is sized so that tiles ~ 2 x experts: cheap for the tiny preset on CPU.
- `"reference"`: `ops.moe.experts_reference` (every expert over every token, masked).

Block-FP8 weights (`fp8.Fp8Weight`): where the routed experts and the shared MLP (given) all
are, the Triton op runs block-FP8 GEMMs (their e4m3 data and scales passed as they are; the
activations quantised per token group of 128 in the kernels: `kernels.moe.fp8_gemm`) on a
device whose tl.dot takes e4m3 (`kernels.plan.experts_precision`); their blocks must span 128
columns (DeepSeek's grid). Otherwise, and for every other implementation, they are dequantised
to x's dtype on the fly. `ops.moe_fp8` is the torch reference of the FP8 GEMMs' numerics.

Passing `shared` (the shared-experts MLP) adds it to the result: the Triton op computes it
inside the same launches at small token counts (as extra experts every token routes to), else
with `swiglu` whose sum rides in the final reduction; the other paths add `swiglu`.
Padded tokens only cost work (see `mla_func.kernels.moe.fused`): each token's result depends on
its own row alone.

`experts_add_norm` also adds the result to the residual stream and normalises it for the next
layer: on the Triton path inside the experts' final reduction (`mla_func::moe_experts_add_norm`,
one launch fewer per layer; rows wider than `fused.ADD_NORM_MAX_WIDTH`, V3's, take the
`norm.add_rmsnorm` launch after it), elsewhere as `h + out` and `ops.norm.rmsnorm`.
The Triton ops receive the state's counters (`KVState.counters`; declared mutated): the
`last_sum` path counts there, and the shared experts' side stream is that runtime's.

Expert parallelism (`first_expert`, every implementation): `gate_up` and `down` are a rank's
slice of the routed experts, the global ones first_expert .. first_expert + El - 1 (El their
count, `ops.moe.local_experts`), `ids` the global ids of the replicated router, and `shared`
the rank's tensor-parallel slice of the shared MLP (any width). The result is the rank's
partial sum: its experts' pairs (the others add exactly zero and cost no GEMM work) plus its
shared slice; the ranks' results add up to the whole MoE. None (the default) is today's
single-GPU call: every id is a local expert's, and no range check is compiled in; pass 0 on
rank 0 of a group of several, whose ids reach past its experts.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.custom_op import custom_op
from mla_func.fp8 import Fp8Weight, Weight, dense
from mla_func.kernels.launch.runtime import call_counters
from mla_func.kernels.moe.align import align_torch, max_blocks
from mla_func.kernels.moe.config import FP8_BLOCK_K
from mla_func.kernels.plan import EXPERTS_IMPLS, device_spec, experts_precision
from mla_func.ops.mlp import swiglu
from mla_func.ops.moe import check_local_experts, experts_reference
from mla_func.ops.norm import rmsnorm
from mla_func.params import DenseMLP

IMPLS = EXPERTS_IMPLS  # the implementations `KernelOptions.experts` names


def _dense_weights(x: Tensor, gate_up: Weight, down: Weight, shared: DenseMLP | None
                   ) -> tuple[Tensor, Tensor, DenseMLP | None]:
    """The experts' weights in x's dtype: block-FP8 ones dequantised on the fly."""
    if shared is not None:
        shared = DenseMLP(dense(shared.gate_up, x.dtype), dense(shared.down, x.dtype))
    return dense(gate_up, x.dtype), dense(down, x.dtype), shared


def fp8_operands(x: Tensor, impl: str, gate_up: Weight, down: Weight,
                  shared: DenseMLP | None) -> tuple[tuple, dict] | None:
    """The Triton op's weights and FP8 keyword arguments where it runs block-FP8 GEMMs (the
    module docstring): the e4m3 data in the weights' layouts ((gate_up, down, shared_gate_up,
    shared_down)) and the scales beside them; None where it does not."""
    ws = (gate_up, down) + (() if shared is None else (shared.gate_up, shared.down))
    if impl != "triton" or not all(isinstance(w, Fp8Weight) for w in ws):
        return None
    if experts_precision("fp8", impl, device_spec(x.device)) != "fp8":  # pre-sm89 GPUs
        return None
    for w, name in zip(ws, ("gate_up", "down", "shared gate_up", "shared down"), strict=False):
        cols, block = w.data.shape[-1], w.block[1]
        if block != FP8_BLOCK_K and cols > min(block, FP8_BLOCK_K):
            raise ValueError(
                f"the block-FP8 expert GEMMs take blocks of {FP8_BLOCK_K} columns (one "
                f"activation scale a group of {FP8_BLOCK_K}, DeepSeek's grid); the {name} "
                f"weights have blocks of {block} of {cols}: dequantise them "
                f"(quantize.dequantize), or quantise with block={FP8_BLOCK_K}")
    data = [w.data.view(w.shape) for w in ws] + [None] * (4 - len(ws))
    scales = [gate_up.scales.view(*gate_up.shape[:2], *gate_up.scales.shape[1:]),
              down.scales]
    rows = [gate_up.block[0], down.block[0]]
    if shared is not None:
        scales += [shared.gate_up.scales, shared.down.scales[0]]
        rows += [shared.gate_up.block[0], shared.down.block[0]]
    names = ("gate_up_scales", "down_scales", "shared_gate_up_scales", "shared_down_scales")
    return tuple(data), {**dict(zip(names, scales, strict=False)), "block_rows": rows}


def fp8_scales(gate_up: Tensor | None, down: Tensor | None, shared_gate_up: Tensor | None,
            shared_down: Tensor | None, block_rows: list[int] | None):
    """The ops' FP8 arguments as `fused_experts` takes them (`Fp8Scales`; None: bf16)."""
    if gate_up is None:
        return None
    from mla_func.kernels.moe.fp8_gemm import Fp8Scales

    rows = list(block_rows or ())
    shared_rows = (rows[2], rows[3]) if len(rows) == 4 else (FP8_BLOCK_K, FP8_BLOCK_K)
    return Fp8Scales(gate_up, down, (rows[0], rows[1]), shared_gate_up, shared_down,
                     shared_rows)


def experts(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"] | Fp8Weight,
    down: Float[Tensor, "experts hidden moe_inter"] | Fp8Weight,
    shared: DenseMLP | None = None,
    impl: str = "sorted_torch",
    counters: Int[Tensor, " counters"] | None = None,
    first_expert: int | None = None,
) -> Float[Tensor, "tokens hidden"]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]), plus `shared(x)` when given.
    `counters`: the state's, for the Triton ops (default: a runtime of the call's own).
    `first_expert`: the global id of `gate_up`'s expert 0 under expert parallelism (the
    module docstring); the sum is then over the pairs of the local experts only."""
    if impl not in IMPLS:
        raise ValueError(f"unknown experts impl {impl!r}; expected one of {IMPLS}")
    fp8 = fp8_operands(x, impl, gate_up, down, shared)
    if fp8 is not None:
        return moe_experts_op(x, weights, ids, *fp8[0], call_counters(counters, x.device), True,
                              *_given(first_expert), **fp8[1])
    gate_up, down, shared = _dense_weights(x, gate_up, down, shared)
    if impl == "triton":
        s_gate_up, s_down = (None, None) if shared is None else (shared.gate_up, shared.down)
        return moe_experts_op(x, weights, ids, gate_up, down, s_gate_up, s_down,
                              call_counters(counters, x.device), True, *_given(first_expert))
    if impl == "sorted_torch":
        out = sorted_torch(x, weights, ids, gate_up, down, first_expert)
    else:
        out = experts_reference(x, weights, ids, gate_up, down, first_expert)
    if shared is not None:
        out = out + swiglu(x, shared.gate_up, shared.down)
    return out


def experts_add_norm(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"] | Fp8Weight,
    down: Float[Tensor, "experts hidden moe_inter"] | Fp8Weight,
    shared: DenseMLP | None,
    residual: Float[Tensor, "tokens hidden"],
    norm_weight: Float[Tensor, " hidden"],
    eps: float,
    impl: str = "sorted_torch",
    defer_norm: bool = False,
    counters: Int[Tensor, " counters"] | None = None,
    trigger: bool = True,
    direct: bool = True,
    first_expert: int | None = None,
) -> tuple[Float[Tensor, "tokens hidden"], Float[Tensor, "tokens hidden"]]:
    """(h, rmsnorm(h)) with h = residual + experts(...): the residual stream after the MoE and
    the next layer's input (`norm.add_rmsnorm`'s rounding: the MoE output, then h, in x's
    dtype). `defer_norm`: the norm's only reader is `kernels.linear.norm_linear`, so the
    Triton path may leave it unwritten where that op normalises h itself
    (`kernels.moe.fused.fused_experts`; the contract: `mla_func.kernel_ops`). `trigger`:
    `KernelOptions.moe_trigger`; `direct`: an eager call of the Triton op runs its function
    (else through the dispatcher, `KernelOptions.eager_direct`). `first_expert`: as in
    `experts`; h is then residual + the rank's partial sum (a norm of the whole MoE's output
    needs the ranks' sum first: `experts`, the all-reduce, then the add and the norm)."""
    op = moe_experts_add_norm_op if direct else moe_experts_add_norm_op.dispatch
    fp8 = fp8_operands(x, impl, gate_up, down, shared)
    if fp8 is not None:
        return op(x, weights, ids, *fp8[0], residual, norm_weight, eps, defer_norm,
                  call_counters(counters, x.device), trigger, *_given(first_expert), **fp8[1])
    gate_up, down, shared = _dense_weights(x, gate_up, down, shared)
    if impl == "triton":
        s_gate_up, s_down = (None, None) if shared is None else (shared.gate_up, shared.down)
        return op(
            x, weights, ids, gate_up, down, s_gate_up, s_down, residual, norm_weight, eps,
            defer_norm, call_counters(counters, x.device), trigger, *_given(first_expert))
    h = residual + experts(x, weights, ids, gate_up, down, shared, impl,
                           first_expert=first_expert)
    return h, rmsnorm(h, norm_weight, eps)


def _given(first_expert: int | None) -> tuple[int, ...]:
    """The ops' `first_expert`, left out at its default: a traced step's node reads as it
    did before the argument (graphs/); so do the FP8 arguments after it (keywords)."""
    return () if first_expert is None else (first_expert,)


# typing.Optional: the schema inference of older torch looks the annotation up in a table.
@custom_op("mla_func::moe_experts", mutates_args=("counters",))
def moe_experts_op(
    x: Tensor, weights: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor,
    shared_gate_up: Optional[Tensor], shared_down: Optional[Tensor],  # noqa: UP045
    counters: Tensor, trigger: bool, first_expert: Optional[int] = None,  # noqa: UP045
    gate_up_scales: Optional[Tensor] = None, down_scales: Optional[Tensor] = None,  # noqa: UP045
    shared_gate_up_scales: Optional[Tensor] = None,  # noqa: UP045
    shared_down_scales: Optional[Tensor] = None,  # noqa: UP045
    block_rows: Optional[list[int]] = None,  # noqa: UP045
) -> Tensor:
    """`fused_experts`; given the scales, the weights are block-FP8 e4m3 data (`block_rows`:
    gate_up's, down's, then the shared MLP's block rows)."""
    # Imported here: the kernels module reads TRITON_INTERPRET when it is first imported.
    from mla_func.kernels.moe.fused import fused_experts

    scales = fp8_scales(gate_up_scales, down_scales, shared_gate_up_scales, shared_down_scales,
                     block_rows)
    return fused_experts(x, weights, ids, gate_up, down, shared_gate_up, shared_down,
                         counters=counters, trigger=trigger, first_expert=first_expert,
                         scales=scales)


@moe_experts_op.register_fake
def _(x, weights, ids, gate_up, down, shared_gate_up, shared_down, counters, trigger,
      first_expert=None, gate_up_scales=None, down_scales=None, shared_gate_up_scales=None,
      shared_down_scales=None, block_rows=None):
    check_local_experts(gate_up, down, first_expert)
    return torch.empty_like(x)


@custom_op("mla_func::moe_experts_add_norm", mutates_args=("counters",))
def moe_experts_add_norm_op(
    x: Tensor, weights: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor,
    shared_gate_up: Optional[Tensor], shared_down: Optional[Tensor],  # noqa: UP045
    residual: Tensor, norm_weight: Tensor, eps: float, defer_norm: bool, counters: Tensor,
    trigger: bool, first_expert: Optional[int] = None,  # noqa: UP045
    gate_up_scales: Optional[Tensor] = None, down_scales: Optional[Tensor] = None,  # noqa: UP045
    shared_gate_up_scales: Optional[Tensor] = None,  # noqa: UP045
    shared_down_scales: Optional[Tensor] = None,  # noqa: UP045
    block_rows: Optional[list[int]] = None,  # noqa: UP045
) -> tuple[Tensor, Tensor]:
    from mla_func.kernels.moe.fused import fused_experts

    scales = fp8_scales(gate_up_scales, down_scales, shared_gate_up_scales, shared_down_scales,
                     block_rows)
    return fused_experts(x, weights, ids, gate_up, down, shared_gate_up, shared_down,
                         add_norm=(residual, norm_weight, eps), defer_norm=defer_norm,
                         counters=counters, trigger=trigger, first_expert=first_expert,
                         scales=scales)


@moe_experts_add_norm_op.register_fake
def _(x, weights, ids, gate_up, down, shared_gate_up, shared_down, residual, norm_weight, eps,
      defer_norm, counters, trigger, first_expert=None, gate_up_scales=None, down_scales=None,
      shared_gate_up_scales=None, shared_down_scales=None, block_rows=None):
    check_local_experts(gate_up, down, first_expert)
    return torch.empty_like(x), torch.empty(
        x.shape, dtype=torch.promote_types(x.dtype, norm_weight.dtype), device=x.device)


def sorted_torch(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"],
    down: Float[Tensor, "experts hidden moe_inter"],
    first_expert: int | None = None,
) -> Float[Tensor, "tokens hidden"]:
    """Sorted-by-expert MoE in torch: static shapes, weights gathered per M-tile.
    `first_expert`: as in `experts` (the pairs of other experts are in no tile)."""
    check_local_experts(gate_up, down, first_expert)
    tokens, topk = ids.shape
    n_exp, pairs = gate_up.shape[0], ids.numel()
    # Tiles of ~pairs/experts rows keep the tile count (and weight gathers) near 2 x experts;
    # a fixed tile when tracing with a symbolic token count.
    # (dynamo sees an int where the token count is dynamic: a fixed tile there too).
    eager = isinstance(pairs, int) and not torch.compiler.is_compiling()
    block_m = 1 << ((pairs - 1) // n_exp).bit_length() if eager else 16
    sorted_pairs, block_expert, block_rows = align_torch(ids, n_exp, 0, block_m, first_expert)
    n_blocks = max_blocks(pairs, n_exp, block_m)
    valid = torch.arange(block_m, device=x.device) < block_rows[:, None]
    # Indexing, not views: a symbolic tracer cannot prove the views' divisibility.
    row = torch.arange(n_blocks, device=x.device)[:, None] * block_m
    row = row + torch.arange(block_m, device=x.device)
    pair = torch.where(valid, sorted_pairs[row], pairs).long()
    xa = x[pair.clamp(max=pairs - 1) // topk]
    e = block_expert.clamp(min=0).long()
    gu = torch.bmm(xa, gate_up[e].flatten(1, 2).transpose(1, 2))
    gate, up = gu.chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, down[e].transpose(1, 2))
    w = F.pad(weights.flatten(), (0, 1))[pair]
    buf = torch.zeros(pairs + 1, x.shape[1], dtype=torch.float32, device=x.device)
    buf.index_put_((pair,), w[..., None] * y.float())  # pads all land on the dump row
    return buf[:pairs].view(tokens, topk, -1).sum(1).to(x.dtype)


__all__ = ["IMPLS", "experts", "experts_add_norm", "fp8_operands", "fp8_scales",
           "moe_experts_add_norm_op", "moe_experts_op",
           "sorted_torch"]
