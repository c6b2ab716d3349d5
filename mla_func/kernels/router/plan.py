"""Launch plan of the fused MoE router (`router.py`): token block and hidden split per step.

Part of `ops.moe.route`'s fused form (DeepSeek-V2 greedy / group_limited_greedy, DeepSeek-V3
noaux_tc; arXiv:2405.04434, arXiv:2412.19437). This module owns `LaunchConfig` and the cost
model that picks it; `router.py` owns the kernel, its launch and the custom op.

`launch_config` picks the block and the split from the static shapes only, with a small cost
model: many splits spread the router read over the SMs (decode), but the last program reads
every split's partials, so large steps use fewer splits and bigger token blocks (prefill).
"""

import functools
from dataclasses import dataclass

import triton

# Hidden per dot step. mma.sync keeps whole dot operands in registers, up to three copies
# each (value, TF32 head, TF32 tail): a deeper step spills (AOT sm90: 231+ registers at 128).
_BLOCK_H = 32
# ... with the router in x's half dtype: one copy of each operand, half as wide; 64 is the
# fastest width, or within 0.1 us of it, from 8 to 4096 tokens (docs/DECISIONS.md,
# `router.plan._BLOCK_H_HALF`).
_BLOCK_H_HALF = 64
_ACC_TILE = 8192  # BLOCK_T x BLOCK_E logits per program (AOT sm90: 64 x 256 spills)
_SELECT_TILE = 4096  # tokens x experts selected at once (its temporaries live in registers)
_TAIL_TILE = 2048  # partials per step of the last program's sum (pipelined through smem)
_NUM_WARPS = 8  # 16 at more than 128 experts: 8 hold 168 registers a thread (AOT sm90)
_NUM_STAGES = 4  # 3 router tiles in flight per program (8 KiB each at 64 experts)
# Token blocks (tl.dot wants at least 16 rows). Not 64: on an H100 the fastest 64-token launch
# was 1.7-2.1x slower than the fastest 32- or 128-token one (docs/DECISIONS.md,
# `router.plan._BLOCK_TS`); the cost model does not see why, so it cannot weigh it.
_BLOCK_TS = (16, 32, 128)
_MAX_SPLIT = 128
COUNTER_SLOTS = 256  # token blocks a split launch may have (larger steps run unsplit)
# Cost model of one launch on an H100/H200 (132 SMs), per SM, in ns; only ratios matter.
_SMS = 132
_BYTES_PER_NS = 100.0  # an SM's share of L2 bandwidth
_MACS_PER_NS = 400.0  # fp32 multiply-adds, two or three TF32 MMAs each
_SPLIT_NS = 1000.0  # store partials, acq_rel atomic, re-read by the last program
_TRIP_NS = 150.0  # one step of the last program's sum: an L2 latency over 2 in flight
_STEP_NS = 250.0  # one dot step: a DRAM latency over the (num_stages - 1) loads in flight
_RESIDENT = 2  # programs per SM hiding each other's latency
_SELECT_NS = 1500.0  # one selection step (about fifteen reductions)


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


def group_block(experts: int, n_group: int) -> tuple[int, int]:
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
    one: docs/DECISIONS.md, `router.plan.launch_config`), plus the latency of its dot steps;
    then one block's last program: the sync, the partials it reads, its L2 round trips and its
    selection steps. `half`: the router in x's half dtype (its hidden step)."""
    tokens = max(tokens, 1)
    block_e = max(triton.next_power_of_2(experts), 16)
    block_h = _BLOCK_H_HALF if half else _BLOCK_H
    w_bytes = 2 if half else 4  # a router element
    block_g, block_gs = group_block(experts, n_group)
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
            if -(-tiles // per) != n_split or (n_split > 1 and blocks > COUNTER_SLOTS):
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
