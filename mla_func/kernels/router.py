"""Fused MoE router: logits, scoring, group mask, top-k, normalisation in one launch.

Implements `ops.moe.route` (DeepSeek-V2 greedy / group_limited_greedy, DeepSeek-V3 noaux_tc;
arXiv:2405.04434, arXiv:2412.19437) for any number of tokens, where the reference's six small
kernels (fp32 cast, GEMM, softmax, topk, ...) cost far more than their arithmetic. The
selection lives in `router_select.py`; this module owns the logits and the launch. At one to
four rows (`FEW_ROWS`) it launches `router_rows.py`'s kernel instead: one program an expert.

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
time. With one split there is no counter: the program reads its own partials back.

`launch_config` picks the block and the split from the static shapes only, with a small cost
model: many splits spread the router read over the SMs (decode), but the last program reads
every split's partials, so large steps use fewer splits and bigger token blocks (prefill).

On sm90+ the router is launched as a programmatic dependent of the kernel before it (PDL,
`kernels/pdl.py`): its programs wait for that kernel's end, then let their own dependants
launch: the expert alignment and the experts' gate_up kernel launch while the router runs and
the shared experts' tiles start (`fused_moe`; they read x, so the router triggers only after
its wait); a kernel launched without PDL still waits for the router's end.

Graph capture: the counters are allocated once per device, at a fixed size, on the first
call: run the op once eagerly before a CUDA-graph capture (warm-up does), and do not
run two router launches at once on different streams of one device. More than `MAX_EXPERTS`
experts run the torch reference (`route`); every token count runs the kernel.
"""

import functools
from dataclasses import dataclass, replace
from typing import no_type_check

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int
from torch import Tensor

from mla_func.config import MLAConfig
from mla_func.custom_op import custom_op
from mla_func.kernels import router_rows
from mla_func.kernels.counters import device_counters, last_to_arrive
from mla_func.kernels.pdl import supported as pdl_supported
from mla_func.kernels.router_select import sum_and_select
from mla_func.ops.moe import route

METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}
MAX_EXPERTS = 256
# Hidden per dot step. mma.sync keeps whole dot operands in registers, up to three copies
# each (value, TF32 head, TF32 tail): a deeper step spills (AOT sm90: 231+ registers at 128).
_BLOCK_H = 32
# ... with the router in x's half dtype: one copy of each operand, half as wide. The router
# alone on an H100, 2026-11-24 (docs/perf/2026-11-24-h100-run137, exp_router.py, 6 alternating
# rounds, us a launch; the cost model's pick at each step; fp32: the float32 router of before):
# 64 against 32 / 128 / fp32: 5.99 / 6.00 / 5.78 / 6.68 at 8 tokens, 5.27 / 5.61 / 5.19 / 6.09
# at 128, 6.32 / 6.44 / 7.47 / 7.85 at 512, 12.91 / 15.33 / 17.06 / 24.08 at 4096, 29.57 / 31.24
# / 24.79 / 36.69 at 8192 (the same experts in every form).
_BLOCK_H_HALF = 64
_ACC_TILE = 8192  # BLOCK_T x BLOCK_E logits per program (AOT sm90: 64 x 256 spills)
_SELECT_TILE = 4096  # tokens x experts selected at once (its temporaries live in registers)
_TAIL_TILE = 2048  # partials per step of the last program's sum (pipelined through smem)
_NUM_WARPS = 8  # 16 at more than 128 experts: 8 hold 168 registers a thread (AOT sm90)
_NUM_STAGES = 4  # 3 router tiles in flight per program (8 KiB each at 64 experts)
# Token blocks (tl.dot wants at least 16 rows). Not 64: on an H100 the fastest 64-token launch
# was 1.7x (4096 tokens) and 2.1x (8192) slower than the fastest 32- or 128-token one, over
# splits 1-8 and two selection steps (docs/perf/2026-11-22-h100-run23); the cost model does
# not see why, so it cannot weigh it.
_BLOCK_TS = (16, 32, 128)
_MAX_SPLIT = 128
_COUNTER_SLOTS = 256  # token blocks a split launch may have (larger steps run unsplit)
# Cost model of one launch on an H100/H200 (132 SMs), per SM, in ns; only ratios matter.
_SMS = 132
_BYTES_PER_NS = 100.0  # an SM's share of L2 bandwidth
_MACS_PER_NS = 400.0  # fp32 multiply-adds, two or three TF32 MMAs each
_SPLIT_NS = 1000.0  # store partials, acq_rel atomic, re-read by the last program
_TRIP_NS = 150.0  # one step of the last program's sum: an L2 latency over 2 in flight
_STEP_NS = 250.0  # one dot step: a DRAM latency over the (num_stages - 1) loads in flight
_RESIDENT = 2  # programs per SM hiding each other's latency
_SELECT_NS = 1500.0  # one selection step (about fifteen reductions)
# sm90: launched as a programmatic dependent of the kernel before (the attention's output
# projection + add + norm, `proj_norm`, which triggers at once), so that it starts while that
# kernel ends. V2-Lite decode step on an H100, 2026-11-24, whole-step graphs, ctx 1024, ms
# synced / back to back, early against plain (docs/perf/2026-11-24-h100-run7, run8,
# exp_proj_step.py): B=1 2.430 / 2.422 against 2.446 / 2.440 and 2.417 / 2.408 against 2.455 /
# 2.449; from B=2 on within +-0.6% either way.
EARLY = True
# Launched early with one dot step a split (decode: 64 splits at one token), a program loads
# its router rows before it waits for x. V2-Lite whole-step graphs on an H100, 2026-11-24,
# ms synced / back to back, with against without (docs/perf/2026-11-24-h100-run52): B=1
# 2.428 / 2.409 against 2.432 / 2.418 (ctx 1024), 2.504 / 2.489 against 2.510 / 2.499 (4096);
# B=2-8 even (the same bits).
PRELOAD = True
# Up to router_rows.MAX_ROWS rows, one program an expert (`router_rows.py`) instead of the split
# kernel. V2-Lite on an H100, 2026-11-24 (docs/perf/2026-11-24-h100-run92, run93,
# exp_rows.py, one process, 6 alternating rounds, against the split kernel): the router alone
# 3.70 against 5.12 us a launch at 1 token, 3.58 against 7.35 at 4; whole-step graphs, ms
# synced / back to back, ctx 1024: B=1 2.395 / 2.381 against 2.401 / 2.394, B=2 3.476 / 3.457
# against 3.522 / 3.506, B=4 4.957 / 4.943 against 5.066 / 5.047 (ctx 4096: B=1 2.465 / 2.451
# against 2.477 / 2.466, B=4 5.197 / 5.170 against 5.297 / 5.269). At 8 and 16 rows the router
# alone was faster too (3.96 against 6.75, 4.80 against 5.86 us) but the step was even (B=8
# 7.113 / 7.072 against 7.111 / 7.076, B=16 9.534 / 9.506 against 9.524 / 9.493): 4 rows stay.
FEW_ROWS = True


@dataclass(frozen=True)
class LaunchConfig:
    """Static launch parameters of `_router_kernel` (a pure function of the shapes)."""

    block_t: int  # tokens per program: the rows of the dot
    block_e: int
    block_h: int  # hidden per dot step
    chunk: int  # hidden per split, a multiple of block_h
    n_split: int
    blocks: int  # token blocks
    sel_t: int  # tokens per selection step of the last program
    block_s: int  # splits summed per step of the last program
    num_warps: int = _NUM_WARPS
    num_stages: int = _NUM_STAGES  # 3 at more than 128 experts (32 KiB router tiles)


def _group_block(experts: int, n_group: int) -> tuple[int, int]:
    """(BLOCK_G, BLOCK_GS): the padded [groups, slots] layout of the experts in selection."""
    if n_group <= 1:
        return 1, max(triton.next_power_of_2(experts), 16)
    return triton.next_power_of_2(n_group), triton.next_power_of_2(experts // n_group)


@functools.lru_cache(maxsize=256)
def launch_config(tokens: int, experts: int, hidden: int, n_group: int = 1,
                  half: bool = False) -> LaunchConfig:
    """The cheapest (token block, split) by the cost model above (pure; the sm90 AOT test
    uses it too). Per SM: the router chunk and x tile it reads (or its multiply-adds, if
    more), scaled by the programs sharing an SM in whole waves (a partial wave costs a whole
    one: H100, 4096 V2-Lite tokens, 160 programs at 5 splits 38.9 us against 128 at 4 splits
    26.7; the whole-wave picks were as fast or faster at every V2-Lite and V3 size where the
    pick moved, docs/perf/2026-11-23-h100-run14), plus the latency of its dot steps; then one
    block's last program: the sync, the partials it reads, its L2 round trips and its
    selection steps. `half`: the router in x's half dtype (its hidden step)."""
    tokens = max(tokens, 1)
    block_e = max(triton.next_power_of_2(experts), 16)
    block_h = _BLOCK_H_HALF if half else _BLOCK_H
    w_bytes = 2 if half else 4  # a router element
    block_g, block_gs = _group_block(experts, n_group)
    block_p = block_g * block_gs
    tiles = triton.cdiv(hidden, block_h)
    best = None
    for block_t in _BLOCK_TS:
        if block_t > max(triton.next_power_of_2(tokens), 16) or block_t * block_e > _ACC_TILE:
            continue
        blocks = -(-tokens // block_t)
        rows = min(tokens, block_t)
        sel_t = min(block_t, triton.next_power_of_2(rows), max(_SELECT_TILE // block_p, 1))
        steps = -(-rows // sel_t)
        for n_split in range(1, min(tiles, _MAX_SPLIT) + 1):
            per = -(-tiles // n_split)  # dot steps per split
            if -(-tiles // per) != n_split or (n_split > 1 and blocks > _COUNTER_SLOTS):
                continue  # a split count no chunk size gives, or no counter for it
            chunk = per * block_h
            block_s = min(max(_TAIL_TILE // (sel_t * block_p), 1),
                          triton.next_power_of_2(n_split))
            share = float(-(-blocks * n_split // _SMS))  # whole waves
            main = (share * max(chunk * (block_e * w_bytes + block_t * 2) / _BYTES_PER_NS,
                                block_t * block_e * chunk / _MACS_PER_NS)
                    + max(1.0, share / _RESIDENT) * per * _STEP_NS)
            tail = (steps * (_SELECT_NS + -(-n_split // block_s) * _TRIP_NS)
                    + rows * n_split * block_p * 4 / _BYTES_PER_NS
                    + (_SPLIT_NS if n_split > 1 else 0.0))
            if best is None or main + tail < best[0]:
                best = (main + tail, (block_t, chunk, n_split, blocks, sel_t, block_s))
    block_t, chunk, n_split, blocks, sel_t, block_s = best[1]
    return LaunchConfig(block_t, block_e, block_h, chunk, n_split, blocks, sel_t, block_s,
                        num_warps=_NUM_WARPS if block_e <= 128 else 16,
                        num_stages=_NUM_STAGES if block_e <= 128 else 3)


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
                     has_bias: bool, pdl: bool = False, half: bool = False
                     ) -> dict[str, object]:
    """The constexpr arguments of `_router_kernel` (shared with the sm90 AOT test); `half`:
    the router in x's half dtype (`router_is_half`)."""
    grouped = method != "greedy"
    block_g, block_gs = _group_block(experts, n_group if grouped else 1)
    return dict(E=experts, BLOCK_E=cfg.block_e, BLOCK_H=cfg.block_h, BLOCK_T=cfg.block_t,
                SEL_T=cfg.sel_t, BLOCK_S=cfg.block_s, K=top_k,
                BLOCK_K=triton.next_power_of_2(top_k), METHOD=METHODS[method],
                N_GROUP=n_group if grouped else 1, BLOCK_G=block_g,
                TOPK_GROUP=topk_group if grouped else 1,
                GROUP_SIZE=experts // n_group if grouped else experts, BLOCK_GS=block_gs,
                NORMALIZE=normalize, HAS_BIAS=has_bias, REDUCE=cfg.n_split > 1,
                X_EXACT=x_dtype in (torch.bfloat16, torch.float16), PDL=pdl,
                WAIT=pdl and EARLY, PRELOAD=pdl and EARLY and PRELOAD and cfg.chunk == cfg.block_h,
                W_HALF=half)


def router_is_half(x_dtype: torch.dtype, router_dtype: torch.dtype) -> bool:
    """Whether the kernels multiply in the router's own dtype: x and the router both bf16, or
    both fp16 (exact products); otherwise the router is read as float32."""
    return x_dtype == router_dtype and x_dtype in (torch.bfloat16, torch.float16)


def _counters(device: torch.device) -> Tensor:
    """The router's per-block counters (fixed size: a split launch has at most
    _COUNTER_SLOTS token blocks)."""
    return device_counters("moe_route", device, _COUNTER_SLOTS)


def _launch(x: Tensor, router: Tensor, score_bias: Tensor | None, top_k: int, n_group: int,
            topk_group: int, method: str, normalize: bool, scale: float
            ) -> tuple[Tensor, Tensor]:
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
    counters = _counters(x.device)
    const = kernel_constants(cfg, x.dtype, experts, top_k, n_group, topk_group, method, normalize,
                             score_bias is not None, pdl_supported(x.device), half)
    if FEW_ROWS and tokens <= router_rows.MAX_ROWS:  # one program an expert
        part = torch.empty(router_rows.MAX_ROWS * cfg.block_e, dtype=torch.float32,
                           device=x.device)
        router_rows.route_rows(x, router, bias, part, counters, weights, ids, scale, const,
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


@custom_op("mla_func::moe_route", mutates_args=())
def moe_route(x: Tensor, router: Tensor, score_bias: Tensor | None, top_k: int, n_group: int,
              topk_group: int, method: str, normalize: bool, scale: float
              ) -> tuple[Tensor, Tensor]:
    """x [tokens, hidden], router [experts, hidden] (x's half dtype, or float32) ->
    (weights fp32, ids int64) [tokens, top_k]: `route` with the settings passed as plain
    values."""
    if router.shape[0] <= MAX_EXPERTS:
        return _launch(x, router, score_bias, top_k, n_group, topk_group, method, normalize,
                       scale)
    cfg = _reference_cfg(router.shape[0], top_k, n_group, topk_group, method, normalize, scale)
    weights, ids = route(x, router, score_bias, cfg)
    return weights.contiguous(), ids.contiguous()


@moe_route.register_fake
def _(x, router, score_bias, top_k, n_group, topk_group, method, normalize, scale):
    shape = (x.shape[0], top_k)
    return (torch.empty(shape, dtype=torch.float32, device=x.device),
            torch.empty(shape, dtype=torch.int64, device=x.device))


def route_fused(
    x: Float[Tensor, "tokens hidden"],
    router: Float[Tensor, "experts hidden"],
    score_bias: Float[Tensor, " experts"] | None,
    cfg: MLAConfig,
) -> tuple[Float[Tensor, "tokens topk"], Int[Tensor, "tokens topk"]]:
    """`ops.moe.route` as one custom op (one Triton launch at up to MAX_EXPERTS experts)."""
    method = cfg.topk_method
    normalize = cfg.norm_topk_prob and (method == "noaux_tc" or cfg.model_type == "deepseek_v3")
    return moe_route(
        x, router, score_bias, cfg.num_experts_per_tok, cfg.n_group or 1, cfg.topk_group or 1,
        method, normalize, float(cfg.routed_scaling_factor))
