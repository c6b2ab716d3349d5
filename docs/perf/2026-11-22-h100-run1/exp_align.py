"""Experiment (run on a GPU): the 2026-11-22 one-program alignment kernel (atomics) against the
multi-program one (no atomics) at ALIGN_SLICE 32/64/128 and 4/8 warps, V2-Lite routing (64
experts, top-6, 2 shared), graph replay. Checks every variant against align_torch."""

import torch
import triton
import triton.language as tl

from mla_func.kernels import moe_align as ma
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms, print_table

_pair_expert = ma._pair_expert


@triton.jit(do_not_specialize=["n_pairs", "n_blocks"])
def _old_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, cursor_ptr,
    n_pairs, n_blocks, topk, n_routed,
    PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr, E_P2: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
):
    ex = tl.arange(0, E_P2)
    lanes = tl.arange(0, CHUNK)
    counts = tl.zeros([E_P2], dtype=tl.int32)
    for start in range(0, n_pairs, CHUNK):
        e = _pair_expert(ids_ptr, start + lanes, n_pairs, topk, n_routed, PAIRS_PER_TOKEN)
        counts += tl.histogram(tl.where(e < 0, E_P2 - 1, e), E_P2)
    counts = tl.where(ex == E_P2 - 1, 0, counts)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    blanes = tl.arange(0, BLOCK_CHUNK)
    for b0 in range(0, n_blocks, BLOCK_CHUNK):
        blk = b0 + blanes
        row0 = blk * BLOCK_M
        inside = ((row0[:, None] >= starts[None, :]) & (row0[:, None] < ends[None, :]))
        inside = inside.to(tl.int32)
        used = tl.sum(inside, axis=1)
        expert = tl.where(used > 0, tl.sum(inside * ex[None, :], axis=1), -1)
        rows = tl.sum(inside * (counts[None, :] - (row0[:, None] - starts[None, :])), axis=1)
        rows = tl.minimum(rows, BLOCK_M)
        tl.store(block_expert_ptr + blk, expert, mask=blk < n_blocks)
        tl.store(block_rows_ptr + blk, rows, mask=blk < n_blocks)
    tl.store(cursor_ptr + ex, starts)
    tl.debug_barrier()
    for start in range(0, n_pairs, CHUNK):
        p = start + lanes
        e = _pair_expert(ids_ptr, p, n_pairs, topk, n_routed, PAIRS_PER_TOKEN)
        dest = tl.atomic_add(cursor_ptr + e, 1, mask=p < n_pairs, sem="relaxed")
        tl.store(sorted_ptr + dest, p, mask=p < n_pairs)


def buffers(ids, experts, shared, bm):
    tokens, topk = ids.shape
    n, n_exp = tokens * (topk + shared), experts + shared
    nb = ma.max_blocks(n, n_exp, bm)
    return n, nb, (torch.full((nb * bm,), -7, dtype=torch.int32, device=ids.device),
                   torch.empty(nb, dtype=torch.int32, device=ids.device),
                   torch.empty(nb, dtype=torch.int32, device=ids.device))


def old(ids, experts, shared, bm):
    n, nb, out = buffers(ids, experts, shared, bm)
    e_p2 = triton.next_power_of_2(experts + shared + 1)
    cursor = torch.empty(e_p2, dtype=torch.int32, device=ids.device)
    _old_kernel[(1,)](ids, *out, cursor, n, nb, ids.shape[1], experts,
                      PAIRS_PER_TOKEN=ids.shape[1] + shared, BLOCK_M=bm, E_P2=e_p2, CHUNK=1024,
                      BLOCK_CHUNK=max(16, 8192 // e_p2), num_warps=8)
    return out


def new(slice_, warps):
    def run(ids, experts, shared, bm):
        n, nb, out = buffers(ids, experts, shared, bm)
        e_p2 = triton.next_power_of_2(experts + shared + 1)
        ma._align_sliced_kernel[(triton.cdiv(n, slice_),)](
            ids, *out, n, nb, ids.shape[1], experts, PAIRS_PER_TOKEN=ids.shape[1] + shared,
            BLOCK_M=bm, E_P2=e_p2, CHUNK=1024, SLICE=slice_,
            BLOCK_CHUNK=max(16, 2048 // e_p2), num_warps=warps)
        return out
    return run


def main() -> None:
    e, k, s = 64, 6, 2
    variants = {"old_1prog_atomics": old, "torch": ma.align_torch}
    for sl in (32, 64, 128):
        for w in (4, 8):
            variants[f"new_s{sl}_w{w}"] = new(sl, w)
    rows = []
    for t in (1, 8, 32, 128, 512, 1024, 4096):
        ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
        bm = pick_config(t).block_m
        want = ma.align_torch(ids, e, s, bm)
        real = (torch.arange(bm, device="cuda")[None] < want[2][:, None]).flatten()
        row = {"tokens": t, "block_m": bm}
        for name, fn in variants.items():
            got = fn(ids, e, s, bm)
            ok = torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
            sp = lambda v, r=real, b=bm: torch.where(r, v, -1).view(-1, b).sort(-1).values  # noqa: E731
            ok = ok and torch.equal(sp(got[0]), sp(want[0]))
            if name.startswith("new"):
                ok = ok and torch.equal(got[0][real], want[0][real])
            us = graph_time_ms(lambda fn=fn, i=ids, b=bm: fn(i, e, s, b)) * 1e3
            row[name] = f"{us:.1f}" + ("" if ok else " WRONG")
        rows.append(row)
    print_table(rows, list(rows[0]), f"expert alignment alone, us per graph replay "
                f"({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
