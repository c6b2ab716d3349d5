"""Fused MoE grouped GEMM in Triton (after vLLM's `fused_moe` Triton kernel and the DeepSeekMoE
layer of arXiv:2401.06066 / arXiv:2405.04434), static-shape and free of host syncs.

This module lays out the tiles and launches the kernels of `gate_up.py`, `down.py`
and `pair_sum.py`.
Pipeline (four launches, all sizes fixed by `tokens`, `topk`, the config table and the
weights):
1. `moe_align.align`: pairs sorted by expert, each expert's run padded to `block_m` rows
   (with `MoEConfig.inline_align` no launch: the gate_up programs find their own tiles and
   write the table, `moe_inline_align`).
2. `gate_up_kernel`: per M-tile (rows of one expert) and N-tile of `moe_inter`:
   act = silu(x W_gate^T) * (x W_up^T), the token rows gathered on the fly, fp32 accumulate.
3. `down_kernel`: per M-tile and N-tile of `hidden`: (act W_down^T) * routing weight, written to
   the row of its pair in a `[tokens * (topk + shared), hidden]` buffer (no atomic reduction:
   results are deterministic and replay bit-identically).
4. `sum_kernel`: the pairs of each token summed in fp32, one write in the model dtype; given
   `add_norm`, also the residual add and the next layer's RMSNorm (`norm.add_rmsnorm`'s
   numerics), so the model's add+norm launch after the MoE is gone too (rows up to
   `ADD_NORM_MAX_WIDTH` wide; wider ones, V3's, run `norm.add_rmsnorm` after the sum). With
   `MoEConfig.last_sum` (direct layout) the down kernel's last programs do this instead
   (`moe_sum.last_sum`: per N-tile arrival counters), the same bits, one launch fewer; with
   `defer_norm` they leave the norm to the next projection (`norm_linear`) at one row.

Shared experts ride along at small token counts (`FUSE_SHARED_MAX_TOKENS`): a shared MLP of
width `shared * moe_inter` is `shared` more experts (strided views of the same weights, no copy)
that every token routes to with weight 1, so the whole MoE FFN is these four launches. Past it
they run apart (`kernels.swiglu`) and the sum adds them.

Every expert's weights are read once per M-tile of its rows; at small token counts an expert's
rows fit one tile (`block_m` from the config table), so weights are read once and the grid over
(M-tiles x N-tiles) gives enough programs to fill the GPU. Tiles and path are picked per static
token count (`moe_config.pick_config`), never autotuned at run time (graph capture).

Direct path (`MoEConfig.direct`, decode at a few tokens): the M-tiles are read off `ids` in the
kernels (`moe_tile.direct_tile`: one routed pair per tile, one tile per shared expert), so step
1 is gone; at 2+ tokens an expert that two tokens pick is read twice.

The shared experts' M-tiles need no routing: they sit at fixed places in both layouts (the last
tiles of the direct layout, the first of the aligned one, `moe_tile.shared_tile`). With `pdl`
(sm90+) the alignment and the gate_up kernel are programmatic dependents of the kernel before
them: the gate_up kernel launches while the router (and the alignment) run; its shared tiles
load and multiply at once and wait for their predecessor's end only to store, the routed tiles
wait first. Only the router and the alignment trigger early, and neither writes `x` nor the
weights those tiles read (the router, itself launched early, triggers once `x`'s writer ended).

With `MoEConfig.shared_stream` the shared experts, when apart, run on a side stream (the state's
runtime's `side_stream`, one per device, made once): it waits for the work queued so far on the
current stream (the router), runs the shared MLP beside the alignment and the routed GEMMs, and the
current stream waits for it before the kernel that adds the shared result. Under capture the fork
and the join become graph edges. Their output is allocated on the current stream before the fork, so
the caching allocator never hands out a block the side stream still uses: every tensor it reads or
writes outlives the join (only its own temporaries live on it).

Expert parallelism (`first_expert`): `ids` hold global expert ids and `gate_up`/`down` a
rank's slice of the experts, the global ones first_expert .. first_expert + El - 1. A pair of
another rank's expert is in no M-tile (the alignment leaves it out; a direct tile of it exits at
once), so it costs no GEMM work and its row of the pair buffer is never written; the sum skips it
by its id. Without `first_expert` (None) every id is a local expert's, and none of these checks
is compiled into the kernels. The shared experts are the rank's slice of the shared MLP, whose
width need not be a multiple of moe_inter (V3 at tp = 2: 1024 of 2048): such a slice runs apart
(`moe_config.fold_shared`).

Block FP8 (`scales`: `fp8_gemm.Fp8Scales`; DeepSeek-V3's weights, `fp8.Fp8Weight`): the weights
are e4m3 and both GEMMs run their FP8 form (`fp8_gemm.py`: activations quantised per token
group of 128 in the K loop, one scaled e4m3 product a K step of BLOCK_K = 128), from the FP8
rows of the tile table (`config.pick_config(tokens, fp8=True)`); layouts, paths, epilogues and
sums are the same. The shared experts fold in where their width and blocks cut into whole
experts of moe_inter (`config.fold_shared(..., fp8=True)`); apart, they run the same FP8 GEMMs
as one expert (`shared_fp8.swiglu_fp8`) in cuBLAS's place.

Padding rows (tokens added to reach a capture bucket) are ordinary tokens here: their pairs are
computed and discarded by the caller, never mixed into real tokens' rows, so they cannot change
real results; they cost expert work: each padded token adds `topk` routed rows (and may pull in
an expert no real token uses, i.e. one more expert's weights read at small token counts).
"""

from contextlib import nullcontext

import torch
import triton
from jaxtyping import Float, Int
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from mla_func.kernels.launch.pdl import supported as pdl_supported
from mla_func.kernels.launch.runtime import Runtime, call_counters, op_counters
from mla_func.kernels.linear.norm import add_rmsnorm
from mla_func.kernels.moe import fp8_gemm
from mla_func.kernels.moe.align import align, empty_layout
from mla_func.kernels.moe.config import (
    DIRECT_BLOCK_M,
    MoEConfig,
    check_config,
    fold_shared,
    pick_config,
)
from mla_func.kernels.moe.down import down_kernel
from mla_func.kernels.moe.fp8_gemm import GROUP, Fp8Scales, check_weights, gemm_args
from mla_func.kernels.moe.fp8_gemm import shared_as_experts as shared_scales
from mla_func.kernels.moe.gate_up import gate_up_kernel
from mla_func.kernels.moe.inline_align import MAX_PAIRS as INLINE_MAX_PAIRS
from mla_func.kernels.moe.pair_sum import sum_kernel
from mla_func.kernels.moe.shared_fp8 import swiglu_fp8
from mla_func.kernels.moe.split_k import split_args
from mla_func.kernels.moe.swiglu import swiglu
from mla_func.kernels.plan import norm_linear_normalises as normalises
from mla_func.ops.moe import check_local_experts

Rows = Float[Tensor, "tokens hidden"]

# The widest row the final sum adds and normalises in one program (`sum_kernel` ADD_NORM),
# which holds the row in registers: V2-Lite's 2048 columns compile spill-free for sm90, V3's
# 7168 (an 8192 block) spill. Wider rows run the sum, then `norm.add_rmsnorm`: faster at V3's
# width than a one-program form that read its row back in a second pass (docs/DECISIONS.md,
# `moe.fused.ADD_NORM_MAX_WIDTH`).
ADD_NORM_MAX_WIDTH = 2048


def _last_sum_counters(counters: Tensor, n_tiles: int) -> Tensor:
    """`MoEConfig.last_sum`'s arrival counters (one an N-tile of the down GEMM, one for the
    norm): the op's slice of the state's counters."""
    mine = op_counters(counters, "moe_last_sum")
    if n_tiles + 1 > mine.numel():
        raise ValueError(f"MoEConfig.last_sum: {n_tiles} N-tiles of the down GEMM; at most "
                         f"{mine.numel() - 1}")
    return mine


def _fit(tile: tuple[int, int, int, int], n: int, k: int, fp8: bool = False
         ) -> tuple[int, int, int, int]:
    """Shrink N/K tiles to small test sizes (tl.dot needs at least 16); FP8's K tile is one
    scale group whatever the size (`fp8_gemm.GROUP`, the config's)."""
    bn, bk, warps, stages = tile
    fit = lambda b, d: max(16, min(b, triton.next_power_of_2(d)))  # noqa: E731
    if fp8 and bk != GROUP:
        raise ValueError(f"block-FP8 experts run BLOCK_K = {GROUP} (one scale a K step); the "
                         f"config's tile has {bk}")
    return fit(bn, n), bk if fp8 else fit(bk, k), warps, stages


def _desc(w: Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of `w` loading `block` tiles (zero past the edges); a 2-D block sees
    `w` as the matrix [everything but the last axis, last axis]."""
    if not w.is_contiguous():
        raise ValueError("MoEConfig.tma needs contiguous expert weights")
    return TensorDescriptor.from_tensor(w.view(-1, w.shape[-1]) if len(block) == 2 else w,
                                        block)


def shared_as_experts(
    shared_gate_up: Float[Tensor, "2 inter hidden"],
    shared_down: Float[Tensor, "hidden inter"],
    moe_inter: int,
) -> tuple[Float[Tensor, "shared 2 moe_inter hidden"], Float[Tensor, "shared hidden moe_inter"]]:
    """A shared MLP of width shared * moe_inter as `shared` experts: strided views, no copy."""
    hidden, inter = shared_down.shape
    if inter % moe_inter:
        raise ValueError(f"shared width {inter} is not a multiple of moe_inter {moe_inter}")
    n = inter // moe_inter
    gate_up = shared_gate_up.view(2, n, moe_inter, hidden).transpose(0, 1)
    down = shared_down.view(hidden, n, moe_inter).transpose(0, 1)
    return gate_up, down


def fused_experts(
    x: Float[Tensor, "tokens hidden"],
    weights: Float[Tensor, "tokens topk"],
    ids: Int[Tensor, "tokens topk"],
    gate_up: Float[Tensor, "experts 2 moe_inter hidden"],
    down: Float[Tensor, "experts hidden moe_inter"],
    shared_gate_up: Float[Tensor, "2 inter hidden"] | None = None,
    shared_down: Float[Tensor, "hidden inter"] | None = None,
    config: MoEConfig | None = None,
    add_norm: tuple[Rows, Float[Tensor, " hidden"], float] | None = None,
    defer_norm: bool = False,
    counters: Tensor | None = None,
    trigger: bool = True,
    first_expert: int | None = None,
    scales: Fp8Scales | None = None,
) -> Rows | tuple[Rows, Rows]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) (+ the shared MLP when given: folded
    into the launches where `moe_config.fold_shared`, else `kernels.swiglu.swiglu` added in
    the sum).
    `config` (default `pick_config(tokens)`) picks the tiles and the path. `add_norm`
    (residual, weight, eps): return (residual + that, its RMSNorm) instead, as
    `norm.add_rmsnorm` would from the sum. `defer_norm`: the RMSNorm's only reader is
    `norm_linear`, which normalises the rows itself where `kernels.plan.norm_linear_normalises`;
    there, on the `last_sum` path, the norm is left out and the returned norm is unwritten.
    `counters`: the state's (`KVState.counters`; the `last_sum` path counts arrivals there,
    and `shared_stream` runs on its runtime's side stream; default: a runtime of the call's
    own, for calls outside a step). `trigger`: the `last_sum`
    programs let the launch after them start at once (`KernelOptions.moe_trigger`).
    `first_expert`: the experts are the global ones first_expert.. and `ids` global (the
    module docstring); None: every id is a local expert's. `scales`: the weights (and the
    shared MLP's, given) are block-FP8 e4m3 data with these scales (the module docstring)."""
    tokens, topk = ids.shape
    n_routed, _, n_inter, n_hidden = gate_up.shape
    check_local_experts(gate_up, down, first_expert)
    counters = call_counters(counters, x.device)
    fp8 = scales is not None
    cfg = config or pick_config(tokens, fp8)
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    if fp8:
        check_weights(gate_up, down, shared_gate_up, shared_down, scales)
    apart = shared_gate_up is not None and not fold_shared(tokens, shared_down.shape[1],
                                                           n_inter, fp8)
    shared = (shared_gate_up, shared_down) if apart else None
    if apart or shared_gate_up is None:
        s_gate_up, s_down, n_shared = gate_up, down, 0
        s_scales = None if scales is None else (scales.gate_up, scales.down)
    else:
        s_gate_up, s_down = shared_as_experts(shared_gate_up, shared_down, n_inter)
        n_shared = s_gate_up.shape[0]
        s_scales = None if scales is None else shared_scales(
            scales.shared_gate_up, scales.shared_down, scales.shared_rows,
            shared_down.shape[1], n_inter)
    for w in (gate_up, down, s_gate_up, s_down):
        if w.stride(-1) != 1:
            raise ValueError("expert weights must be contiguous along their last axis")
    pairs_per_token = topk + n_shared
    # Expert parallelism: the range check compiled in (LOCAL) and its first global id.
    local, first = first_expert is not None, first_expert or 0
    local_args = dict(ids_ptr=ids, topk=topk, n_routed=n_routed, first_expert=first, LOCAL=local)
    pdl = cfg.pdl and pdl_supported(x.device)
    check_config(cfg, tokens, topk, n_shared, INLINE_MAX_PAIRS)
    if add_norm is not None and (add_norm[0].shape != x.shape or add_norm[0].dtype != x.dtype):
        raise ValueError(f"add_norm: the residual is {tuple(add_norm[0].shape)} "
                         f"{add_norm[0].dtype}; the experts' output {tuple(x.shape)} {x.dtype}")

    # The add+norm in the sum (a row in one program's registers).
    y = residual = weight = eps = None
    if add_norm is not None:
        residual, weight, eps = add_norm
        if n_hidden <= ADD_NORM_MAX_WIDTH:
            y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                            device=x.device)

    # Every check is above: from the fork on, the join below must run (the finally), or the
    # side stream could still write `extra` once its block is freed and handed out again.
    extra = side = None
    try:
        if shared is not None:
            extra = torch.empty(tokens, n_hidden, dtype=x.dtype, device=x.device)
            if cfg.shared_stream and x.is_cuda:
                main = torch.cuda.current_stream(x.device)
                side = Runtime.of(counters).side_stream(x.device)
                side.wait_stream(main)
            with nullcontext() if side is None else torch.cuda.stream(side):
                if scales is None:
                    swiglu(x, *shared, out=extra)
                else:
                    width = shared_down.shape[1]
                    swiglu_fp8(x, ids, *shared, scales.shared_gate_up, scales.shared_down,
                               scales.shared_rows, DIRECT_BLOCK_M if cfg.direct else cfg.block_m,
                               (_fit(cfg.gate_up, width, n_hidden, True),
                                _fit(cfg.down, n_hidden, width, True)), extra)
        if cfg.direct:
            bm, n_tiles = DIRECT_BLOCK_M, tokens * topk + n_shared
            layout = (ids, ids, ids)  # no alignment: the kernels read the tiles off `ids`
        else:
            bm = cfg.block_m
            if cfg.inline_align:  # the gate_up kernel writes the table (moe_inline_align)
                layout = empty_layout(ids, n_routed, n_shared, bm)
            else:
                layout = align(ids, n_routed, n_shared, bm, pdl, first_expert)
            n_tiles = layout[1].shape[0]
        tiles = (ids, *layout, tokens, n_tiles, topk)
        common = dict(PAIRS_PER_TOKEN=pairs_per_token, BLOCK_M=bm, LOCAL=local,
                      PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
        fp8_args = ({}, {}) if scales is None else gemm_args(scales, s_scales, x.device.type)

        act = torch.empty(n_tiles * bm, n_inter, dtype=x.dtype, device=x.device)
        bn, bk, warps, stages = _fit(cfg.gate_up, n_inter, n_hidden, fp8)
        n_n = triton.cdiv(n_inter, bn)
        x_in, x_args = fp8_gemm.gate_up_x(x, cfg.quant_x, fp8)
        split = split_args(cfg.gate_up_split, "gate_up", 2, n_tiles, bm, n_n, n_inter, x,
                           counters)
        gate_up_kernel[(n_tiles, n_n, cfg.gate_up_split) if cfg.direct
                       else (n_n, n_tiles, cfg.gate_up_split)](
            x_in, gate_up, s_gate_up, _desc(gate_up, [1, 2, bn, bk]) if cfg.tma else None, act,
            *tiles, n_inter, n_hidden, n_routed, first, x_in.stride(0),
            gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
            s_gate_up.stride(0), s_gate_up.stride(1), s_gate_up.stride(2),
            BLOCK_N=bn, BLOCK_K=bk, EVEN_K=n_hidden % bk == 0, DIRECT=cfg.direct, **common,
            PDL=pdl, TMA=cfg.tma, INLINE=cfg.inline_align, MERGE_TAIL=cfg.merge_tail,
            E_P2=triton.next_power_of_2(n_routed + 1),
            P_BLOCK=triton.next_power_of_2(tokens * topk) if cfg.inline_align else 1,
            num_warps=warps, num_stages=stages, **fp8_args[0], **x_args, **split,
            **({"launch_pdl": True} if pdl else {}))

        out = torch.empty_like(x)
        act, act_args = fp8_gemm.down_act(act, cfg.quant_act, fp8)
        bn, bk, warps, stages = _fit(cfg.down, n_hidden, n_inter, fp8)
        strides = (down.stride(0), down.stride(1), s_down.stride(0), s_down.stride(1))
        buf = torch.empty(tokens * pairs_per_token, n_hidden, dtype=x.dtype, device=x.device)
        descs = (None, None, None)
        if cfg.tma:  # act (whole tiles, and the tails' half tiles), down
            half = _desc(act, [bm // 2, bk]) if cfg.merge_tail else None
            descs = (_desc(act, [bm, bk]), half, _desc(down, [bn, bk]))
        n_n = triton.cdiv(n_hidden, bn)
        tail = {}
        if cfg.last_sum:  # the pair sum (+ add and norm) as the programs' tail
            norm = dict(res_ptr=residual.contiguous(), y_ptr=y, nw_ptr=weight, eps=eps
                        ) if y is not None else {}
            tail = dict(
                sum_ptr=out, extra_ptr=extra, counter_ptr=_last_sum_counters(counters, n_n),
                **norm, LAST_SUM=True, HAS_EXTRA=extra is not None, ADD_NORM=y is not None,
                SUM_BLOCK=triton.next_power_of_2(n_hidden),
                TRIGGER=pdl and trigger,
                NORM=not (defer_norm and normalises(tokens, n_hidden)))
        split = split_args(cfg.down_split, "down", 1, n_tiles, bm, n_n, n_hidden, x, counters)
        down_kernel[(n_tiles, n_n, cfg.down_split) if cfg.direct
                    else (n_n, n_tiles, cfg.down_split)](
            act, down, s_down, *descs, buf, weights, *tiles, n_hidden, n_inter, n_routed, first,
            *strides, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=n_inter % bk == 0,
            DIRECT=cfg.direct, **common, TMA=cfg.tma, MERGE_TAIL=cfg.merge_tail,
            num_warps=warps, num_stages=stages, **tail, **fp8_args[1], **act_args, **split)
    finally:
        if side is not None:
            main.wait_stream(side)  # the join: `extra` is read below, on this stream

    if cfg.last_sum:
        pass  # the down kernel's last programs summed (and, given y, added and normalised
        # unless the norm was deferred)
    elif y is not None:
        # One program a row (the norm needs all of it), in registers, in the layout of
        # `norm.add_rmsnorm`'s (the same block, 4 warps): the same bits.
        sum_kernel[(tokens, 1)](
            buf, buf if extra is None else extra, out, residual.contiguous(), y, weight,
            n_hidden=n_hidden, eps=eps, PAIRS_PER_TOKEN=pairs_per_token,
            HAS_EXTRA=extra is not None, ADD_NORM=True, BLOCK=triton.next_power_of_2(n_hidden),
            PDL=pdl_supported(x.device), num_warps=4, **local_args)
    else:
        block = min(1024, triton.next_power_of_2(n_hidden))
        sum_kernel[(tokens, triton.cdiv(n_hidden, block))](
            buf, buf if extra is None else extra, out, out, out, out, n_hidden=n_hidden,
            eps=0.0, PAIRS_PER_TOKEN=pairs_per_token, HAS_EXTRA=extra is not None,
            ADD_NORM=False, BLOCK=block, num_warps=4, **local_args)
    if y is not None:
        return out, y
    if add_norm is None:
        return out
    # A row wider than one program holds does not fit the sum's add+norm: the add and the norm
    # run after the sum.
    return add_rmsnorm(residual, out, weight, eps)
