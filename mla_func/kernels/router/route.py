"""Fused MoE router: logits, scoring, group mask, top-k, normalisation in one launch.

Implements `ops.moe.route` (DeepSeek-V2 greedy / group_limited_greedy, DeepSeek-V3 noaux_tc;
arXiv:2405.04434, arXiv:2412.19437) for any number of tokens, where the reference's six small
kernels (fp32 cast, GEMM, softmax, topk, ...) cost far more than their arithmetic. The
selection lives in `select.py`; this module owns the logits and the launch. At one to
four rows (`KernelOptions.router_few_rows`, `kernels.plan.router_rows`) it launches
`router/rows.py`'s kernel instead: one program an expert.

Grid (token blocks, hidden splits). Program (b, s) computes the partial logits of the BLOCK_T
tokens of block b over hidden chunk s with `tl.dot` on [BLOCK_T, BLOCK_H] x [BLOCK_H, BLOCK_E]
tiles, so a router chunk is read once per block, not once per token. The products are those
of the float32 reference (plain TF32 would flip near-tied experts against it): a router in
x's half dtype (bf16/fp16, as the params keep it for a half-precision model) takes one
half-precision product, exact in its float32 accumulator; a float32 router with a bf16/fp16 x
(exact in TF32) is split into a TF32 head and tail, two products (~2^-21 relative); a float32
x takes tf32x3. Only the summation order differs from cuBLAS's float32 GEMM, so a tie closer
than that order's rounding can still fall the other way (one token in 4096 at V3 size, H200,
2026-11-22), as it can between any two float32 summation orders.

Every program stores its partials; the last program of the block to arrive (an acq_rel
counter, reset by that program so the buffer is zero again for the next launch) sums them in
split order -- deterministic whatever the arrival order -- and selects, SEL_T tokens at a
time. With one split there is no counter: the program reads its own partials back. The
block and the split come from `router/plan.py`'s `launch_config`, a cost model over the static
shapes.

On sm90+ the router is launched as a programmatic dependent of the kernel before it (PDL,
`kernels/launch/pdl.py`): its programs wait for that kernel's end, then let their own dependants
launch: the expert alignment and the experts' gate_up kernel launch while the router runs and
the shared experts' tiles start (`fused_moe`; they read x, so the router triggers only after
its wait); a kernel launched without PDL still waits for the router's end.

Graph capture: the counters are the state's (`KVState.counters`, the op's slice of them,
declared mutated), at a fixed address; two router launches must not run at once on one
state's counters. More than `kernels.plan.ROUTER_MAX_EXPERTS` experts run the torch
reference (`route`); every token count runs the kernel.
"""

import functools
from dataclasses import replace
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.custom_op import custom_op
from mla_func.kernels.launch.counters import last_to_arrive
from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.kernels.launch.runtime import call_counters, op_counters
from mla_func.kernels.plan import ROUTER_MAX_EXPERTS, KernelOptions, router_rows
from mla_func.kernels.router import rows
from mla_func.kernels.router.plan import LaunchConfig, group_block, launch_config
from mla_func.kernels.router.select import sum_and_select
from mla_func.ops.moe import route

METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _router_rows(r_ptr, hidden, h, h_hi, e, E: tl.constexpr):
    """The router's hidden rows `h` (those below h_hi) for the experts `e` (those below E):
    [BLOCK_H, BLOCK_E], zeros elsewhere."""
    return tl.load(r_ptr + e[None, :] * hidden + h[:, None],
                   mask=(h < h_hi)[:, None] & (e < E)[None, :], other=0.0)


@triton.jit
@no_type_check  # keeps the jaxtyping import hook off Triton kernels
def _router_kernel(x_ptr, r_ptr, bias_ptr, part_ptr, cnt_ptr, w_out, id_out, T, hidden,
                   x_stride, chunk, n_split, scale, E: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, SEL_T: tl.constexpr,
                   BLOCK_S: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                   METHOD: tl.constexpr, N_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   TOPK_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_GS: tl.constexpr,
                   NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr,
                   X_EXACT: tl.constexpr, PDL: tl.constexpr, WAIT: tl.constexpr,
                   PRELOAD: tl.constexpr = False, W_HALF: tl.constexpr = False):
    b = tl.program_id(0)
    s = tl.program_id(1)
    e = tl.arange(0, BLOCK_E)
    h_lo = s * chunk
    h_hi = tl.minimum(h_lo + chunk, hidden)
    if PRELOAD:  # one dot step a split: its router rows load before the wait
        w_pre = _router_rows(r_ptr, hidden, h_lo + tl.arange(0, BLOCK_H), h_hi, e, E)
    if WAIT:  # launched early itself: x is read once the kernel before (its writer) ended;
        tl.extra.cuda.gdc_wait()  # only then may the alignment and the experts' GEMM launch
    if PDL:  # (their shared tiles read x without waiting)
        tl.extra.cuda.gdc_launch_dependents()
    rows = b.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = rows < T
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for h0 in range(h_lo, h_hi, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        hmask = h < h_hi
        xt = tl.load(x_ptr + rows[:, None] * x_stride + h[None, :],
                     mask=live[:, None] & hmask[None, :], other=0.0)
        if PRELOAD:
            wt = w_pre
        else:
            wt = _router_rows(r_ptr, hidden, h, h_hi, e, E)
        if W_HALF:  # x and the router in one half dtype: exact products, float32 sums
            acc = tl.dot(xt, wt, acc)
        elif X_EXACT:
            # x (bf16/fp16) is exact in TF32; so is the router's head (its top 11 significant
            # bits), and its tail is kept to 2^-21 relative: two TF32 products.
            w_hi = (wt.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            acc = tl.dot(xt.to(tl.float32), wt - w_hi, acc, input_precision="tf32")
            acc = tl.dot(xt.to(tl.float32), w_hi, acc, input_precision="tf32")
        else:
            acc = tl.dot(xt.to(tl.float32), wt, acc, input_precision="tf32x3")
    t = tl.arange(0, BLOCK_T)
    tl.store(part_ptr + (b.to(tl.int64) * n_split + s) * BLOCK_T * BLOCK_E
             + t[:, None] * BLOCK_E + e[None, :], acc, mask=live[:, None])
    if REDUCE:  # the block's last split to arrive sums and selects
        if last_to_arrive(cnt_ptr + b, n_split):
            sum_and_select(part_ptr, b, T, n_split, bias_ptr, w_out, id_out, scale, E,
                           BLOCK_E, BLOCK_T, SEL_T, BLOCK_S, K, BLOCK_K, METHOD, N_GROUP,
                           BLOCK_G, TOPK_GROUP, GROUP_SIZE, BLOCK_GS, NORMALIZE, HAS_BIAS)
            tl.store(cnt_ptr + b, 0)
    else:
        tl.debug_barrier()  # every thread's partials stored before the program reads them
        sum_and_select(part_ptr, b, T, n_split, bias_ptr, w_out, id_out, scale, E, BLOCK_E,
                       BLOCK_T, SEL_T, BLOCK_S, K, BLOCK_K, METHOD, N_GROUP, BLOCK_G,
                       TOPK_GROUP, GROUP_SIZE, BLOCK_GS, NORMALIZE, HAS_BIAS)


def kernel_constants(cfg: LaunchConfig, x_dtype: torch.dtype, experts: int, top_k: int,
                     n_group: int, topk_group: int, method: str, normalize: bool,
                     has_bias: bool, pdl: bool = False, half: bool = False,
                     early: bool = True, preload: bool = True) -> dict[str, object]:
    """The constexpr arguments of `_router_kernel` (shared with the sm90 AOT test); `half`:
    the router in x's half dtype (`router_is_half`); `early`, `preload`: the options of the
    same names (`KernelOptions.router_early`, `router_preload`), where PDL runs."""
    grouped = method != "greedy"
    block_g, block_gs = group_block(experts, n_group if grouped else 1)
    return dict(E=experts, BLOCK_E=cfg.block_e, BLOCK_H=cfg.block_h, BLOCK_T=cfg.block_t,
                SEL_T=cfg.sel_t, BLOCK_S=cfg.block_s, K=top_k,
                BLOCK_K=triton.next_power_of_2(top_k), METHOD=METHODS[method],
                N_GROUP=n_group if grouped else 1, BLOCK_G=block_g,
                TOPK_GROUP=topk_group if grouped else 1,
                GROUP_SIZE=experts // n_group if grouped else experts, BLOCK_GS=block_gs,
                NORMALIZE=normalize, HAS_BIAS=has_bias, REDUCE=cfg.n_split > 1,
                X_EXACT=x_dtype in (torch.bfloat16, torch.float16), PDL=pdl,
                WAIT=pdl and early,
                PRELOAD=pdl and early and preload and cfg.chunk == cfg.block_h,
                W_HALF=half)


def router_is_half(x_dtype: torch.dtype, router_dtype: torch.dtype) -> bool:
    """Whether the kernels multiply in the router's own dtype: x and the router both bf16, or
    both fp16 (exact products); otherwise the router is read as float32."""
    return x_dtype == router_dtype and x_dtype in (torch.bfloat16, torch.float16)


def _launch(x: Tensor, router: Tensor, score_bias: Tensor | None, counters: Tensor, top_k: int,
            n_group: int, topk_group: int, method: str, normalize: bool, scale: float,
            early: bool, preload: bool, few_rows: bool) -> tuple[Tensor, Tensor]:
    tokens, hidden = x.shape
    experts = router.shape[0]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=x.device)
    if not tokens:
        return weights, ids
    x = x.contiguous()
    half = router_is_half(x.dtype, router.dtype)
    router = router.contiguous() if half else router.float().contiguous()
    bias = score_bias.float().contiguous() if score_bias is not None else router
    grouped = method != "greedy"
    cfg = launch_config(tokens, experts, hidden, n_group if grouped else 1, half)
    counters = op_counters(counters, "moe_route")
    const = kernel_constants(cfg, x.dtype, experts, top_k, n_group, topk_group, method, normalize,
                             score_bias is not None, pdl_supported(x.device), half, early,
                             preload)
    if router_rows(tokens, few_rows):  # one program an expert
        part = torch.empty(rows.MAX_ROWS * cfg.block_e, dtype=torch.float32, device=x.device)
        rows.route_rows(x, router, bias, part, counters, weights, ids, scale, const,
                        bool(const["WAIT"]))
        return weights, ids
    part = torch.empty(cfg.blocks * cfg.n_split * cfg.block_t * cfg.block_e,
                       dtype=torch.float32, device=x.device)
    _router_kernel[(cfg.blocks, cfg.n_split)](
        x, router, bias, part, counters, weights, ids, tokens, hidden, x.stride(0), cfg.chunk,
        cfg.n_split, scale, **const, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if const["WAIT"] else {}))
    return weights, ids


@functools.lru_cache(maxsize=64)
def _reference_cfg(experts: int, top_k: int, n_group: int, topk_group: int, method: str,
                   normalize: bool, scale: float) -> MLAConfig:
    # deepseek_v3 makes `route` normalise exactly when norm_topk_prob (= normalize) is set.
    return replace(MLAConfig(), model_type="deepseek_v3", n_routed_experts=experts,
                   num_experts_per_tok=top_k, topk_method=method, n_group=n_group,
                   topk_group=topk_group, norm_topk_prob=normalize,
                   routed_scaling_factor=scale)


@custom_op("mla_func::moe_route", mutates_args=("counters",))
def moe_route(x: Tensor, router: Tensor, score_bias: Tensor | None, counters: Tensor,
              top_k: int, n_group: int, topk_group: int, method: str, normalize: bool,
              scale: float, early: bool, preload: bool, few_rows: bool
              ) -> tuple[Tensor, Tensor]:
    """x [tokens, hidden], router [experts, hidden] (x's half dtype, or float32) ->
    (weights fp32, ids int64) [tokens, top_k]: `route` with the settings passed as plain
    values; `counters`: the state's (`KVState.counters`), left zero."""
    if router.shape[0] <= ROUTER_MAX_EXPERTS:
        return _launch(x, router, score_bias, counters, top_k, n_group, topk_group, method,
                       normalize, scale, early, preload, few_rows)
    cfg = _reference_cfg(router.shape[0], top_k, n_group, topk_group, method, normalize, scale)
    weights, ids = route(x, router, score_bias, cfg)
    return weights.contiguous(), ids.contiguous()


@moe_route.register_fake
def _(x, router, score_bias, counters, top_k, n_group, topk_group, method, normalize, scale,
      early, preload, few_rows):
    shape = (x.shape[0], top_k)
    return (torch.empty(shape, dtype=torch.float32, device=x.device),
            torch.empty(shape, dtype=torch.int64, device=x.device))


def route_fused(
    x: Float[Tensor, "tokens hidden"],
    router: Float[Tensor, "experts hidden"],
    score_bias: Float[Tensor, " experts"] | None,
    cfg: MLAConfig,
    counters: Int[Tensor, " counters"] | None = None,
    options: KernelOptions | None = None,
) -> tuple[Float[Tensor, "tokens topk"], Int[Tensor, "tokens topk"]]:
    """`ops.moe.route` as one custom op (one Triton launch at up to ROUTER_MAX_EXPERTS
    experts). `counters`: the state's (default: a runtime of the call's own); `options`: the
    router's launch options and whether an eager call skips the dispatcher (default:
    `KernelOptions(fused=True)`'s)."""
    counters = call_counters(counters, x.device)
    options = options or KernelOptions(fused=True)
    method = cfg.topk_method
    normalize = cfg.norm_topk_prob and (method == "noaux_tc" or cfg.model_type == "deepseek_v3")
    op = moe_route if options.eager_direct else moe_route.dispatch
    return op(
        x, router, score_bias, counters, cfg.num_experts_per_tok, cfg.n_group or 1,
        cfg.topk_group or 1, method, normalize, float(cfg.routed_scaling_factor),
        options.router_early, options.router_preload, options.router_few_rows)
