"""The 4096-token MoE GEMMs: the production kernels against variants, side by side.

Variants of gate_up: one tl.dot per K step over [gate; up] rows loaded by one TMA load of a
4-D descriptor ([experts, 2, moe_inter, hidden], block [1, 2, BN, BK]) instead of two dots,
and persistent grids (one program per SM looping over the tiles, optionally flattened so the
next tile's loads overlap this tile's epilogue). Of down: the persistent grid. Each variant's
output is compared with the production kernel's (same layout, same real rows).

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/.../exp_gemm.py [tokens]
(run 26, the tree before the one-dot gate_up; `--second`: the tree after it, run 27)
TRITON_INTERPRET=1 with `--tiny` checks the variants on CPU.
"""
import sys
from typing import no_type_check

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from mla_func.kernels.moe_align import align, tile
from mla_func.kernels.moe_gemm import down_kernel, gate_up_kernel

TINY = "--tiny" in sys.argv
# Run 26 timed the tree before the one-dot gate_up (a 2-D descriptor); `--second` the tree after.
OLD_TREE = "--second" not in sys.argv


@triton.jit
@no_type_check
def _gu_tile(x_ptr, wd, act_ptr, pid_m, pid_n, ids_ptr, sorted_ptr, block_expert_ptr,
             block_rows_ptr, n_tokens, topk, n_inter, n_hidden, n_routed, stride_x,
             PPT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                           n_tokens, topk, n_routed, PPT, BM, False)
    if e >= 0:
        tok = (pair // PPT).to(tl.int64)
        offs_k = tl.arange(0, BK)
        a_ptrs = x_ptr + tok[:, None] * stride_x + offs_k[None, :]
        acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
        for k in range(0, n_hidden, BK):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = wd.load([e, 0, pid_n * BN, k]).reshape(2 * BN, BK)
            acc = tl.dot(a, tl.trans(b), acc)
            a_ptrs += BK
        g, u = tl.split(tl.permute(acc.reshape(BM, 2, BN), (0, 2, 1)))
        act = g * tl.sigmoid(g) * u
        offs_n = pid_n * BN + tl.arange(0, BN)
        rows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
        tl.store(act_ptr + rows[:, None] * n_inter + offs_n[None, :],
                 act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n < n_inter)[None, :])


@triton.jit
@no_type_check
def gu_one_dot(x_ptr, wd, act_ptr, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
               n_tokens, topk, n_inter, n_hidden, n_routed, stride_x, n_m, n_n,
               PPT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               PERSISTENT: tl.constexpr):
    if PERSISTENT:
        for t in range(tl.program_id(0), n_m * n_n, tl.num_programs(0)):
            _gu_tile(x_ptr, wd, act_ptr, t // n_n, t % n_n, ids_ptr, sorted_ptr,
                     block_expert_ptr, block_rows_ptr, n_tokens, topk, n_inter, n_hidden,
                     n_routed, stride_x, PPT, BM, BN, BK)
    else:
        _gu_tile(x_ptr, wd, act_ptr, tl.program_id(1), tl.program_id(0), ids_ptr, sorted_ptr,
                 block_expert_ptr, block_rows_ptr, n_tokens, topk, n_inter, n_hidden,
                 n_routed, stride_x, PPT, BM, BN, BK)


@triton.jit
@no_type_check
def gu_flat(x_ptr, wd, act_ptr, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
            n_tokens, topk, n_inter, n_hidden, n_routed, stride_x, n_m, n_n,
            PPT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Persistent, one flattened loop over (tile, K step) (unused tiles run masked)."""
    k_steps = tl.cdiv(n_hidden, BK)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    my_tiles = tl.cdiv(n_m * n_n - pid, nprog)
    offs_k = tl.arange(0, BK)
    acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
    t = pid - nprog
    ki = -1
    e = 0
    pid_m = 0
    pid_n = 0
    tok = tl.zeros((BM,), dtype=tl.int64)
    row_ok = tl.arange(0, BM) < 0
    for _ in tl.range(0, my_tiles * k_steps, flatten=True):
        ki = tl.where(ki == k_steps - 1, 0, ki + 1)
        if ki == 0:
            t += nprog
            pid_m = t // n_n
            pid_n = t % n_n
            e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr,
                                   block_rows_ptr, n_tokens, topk, n_routed, PPT, BM, False)
            tok = (pair // PPT).to(tl.int64)
        ee = tl.maximum(e, 0)
        a = tl.load(x_ptr + tok[:, None] * stride_x + (ki * BK + offs_k)[None, :],
                    mask=row_ok[:, None], other=0.0)
        b = wd.load([ee, 0, pid_n * BN, ki * BK]).reshape(2 * BN, BK)
        acc = tl.dot(a, tl.trans(b), acc)
        if ki == k_steps - 1:
            g, u = tl.split(tl.permute(acc.reshape(BM, 2, BN), (0, 2, 1)))
            act = g * tl.sigmoid(g) * u
            offs_n = pid_n * BN + tl.arange(0, BN)
            rows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
            tl.store(act_ptr + rows[:, None] * n_inter + offs_n[None, :],
                     act.to(act_ptr.dtype.element_ty),
                     mask=((row_ok & (pid_m * 0 + e >= 0))[:, None]
                     & (offs_n < n_inter)[None, :]))
            acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)


@triton.jit
@no_type_check
def down_persistent(act_desc, w_desc, out_ptr, weights_ptr, ids_ptr, sorted_ptr,
                    block_expert_ptr, block_rows_ptr, n_tokens, topk, n_hidden, n_inter,
                    n_routed, n_m, n_n, PPT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr):
    for t in range(tl.program_id(0), n_m * n_n, tl.num_programs(0)):
        pid_m = t // n_n
        pid_n = t % n_n
        e, pair, row_ok = tile(pid_m, ids_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                               n_tokens, topk, n_routed, PPT, BM, False)
        if e >= 0:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k in range(0, n_inter, BK):
                a = act_desc.load([pid_m * BM, k])
                b = w_desc.load([e * n_hidden + pid_n * BN, k])
                acc = tl.dot(a, tl.trans(b), acc)
            j = pair % PPT
            routed = row_ok & (j < topk)
            w = tl.load(weights_ptr + (pair // PPT) * topk + j, mask=routed, other=1.0)
            y = acc.to(out_ptr.dtype.element_ty).to(tl.float32) * w[:, None]
            offs_n = pid_n * BN + tl.arange(0, BN)
            tl.store(out_ptr + pair.to(tl.int64)[:, None] * n_hidden + offs_n[None, :],
                     y.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n < n_hidden)[None, :])


def time_us(fn, reps=20) -> float:
    if TINY:
        fn()
        return float("nan")
    from scripts.bench_common import graph_time_ms
    return graph_time_ms(fn, reps=reps) * 1e3


def main() -> None:
    torch.manual_seed(0)
    dev = "cpu" if TINY else "cuda"
    args = [int(a) for a in sys.argv[1:] if not a.startswith("--")]
    tokens = args[0] if args else (40 if TINY else 4096)
    E, H, I, K = (8, 64, 96, 2) if TINY else (64, 2048, 1408, 6)
    BM, BN, BK = (16, 32, 32) if TINY else (128, 128, 64)
    dt = torch.float32 if TINY else torch.bfloat16
    x = torch.randn(tokens, H, device=dev, dtype=dt)
    gu = torch.randn(E, 2, I, H, device=dev, dtype=dt) * H**-0.5
    dn = torch.randn(E, H, I, device=dev, dtype=dt) * I**-0.5
    ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(tokens)])
    w = torch.rand(tokens, K, device=dev, dtype=torch.float32)
    if TINY:
        from mla_func.kernels.moe_align import align_triton
        layout = align_triton(ids, E, 0, BM)
    else:
        layout = align(ids, E, 0, BM)
    n_m = layout[1].shape[0]
    sms = 1 if TINY else torch.cuda.get_device_properties(0).multi_processor_count
    tiles = (ids, *layout, tokens, K)
    prec = "ieee" if TINY else "tf32"
    print(f"# {'cpu' if TINY else torch.cuda.get_device_name()}: tokens {tokens}, {n_m} M-tiles",
          flush=True)
    flops_gu = 2 * tokens * K * H * 2 * I
    flops_dn = 2 * tokens * K * I * H

    def prod_gu(act, bn=BN, bk=BK, warps=8, stages=4):
        desc = (TensorDescriptor.from_tensor(gu.view(-1, H), [bn, bk]) if OLD_TREE
                else TensorDescriptor.from_tensor(gu, [1, 2, bn, bk]))
        gate_up_kernel[(triton.cdiv(I, bn), n_m)](
            x, gu, gu, desc, act, *tiles, I, H, E, x.stride(0), *gu.stride()[:3], *gu.stride()[:3],
            PAIRS_PER_TOKEN=K, BLOCK_M=BM, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=True, DIRECT=False,
            PRECISION=prec, PDL=False, TMA=True, num_warps=warps, num_stages=stages)

    def one_dot(act, bn=BN, bk=BK, warps=8, stages=4, persistent=False, flat=False, occ=1):
        wd = TensorDescriptor.from_tensor(gu, [1, 2, bn, bk])
        n_n = triton.cdiv(I, bn)
        common = (x, wd, act, *tiles[:4], tokens, K, I, H, E, x.stride(0), n_m, n_n)
        if flat:
            gu_flat[(min(sms * occ, n_m * n_n),)](*common, PPT=K, BM=BM, BN=bn, BK=bk,
                                                  num_warps=warps, num_stages=stages)
        else:
            grid = (min(sms * occ, n_m * n_n),) if persistent else (n_n, n_m)
            gu_one_dot[grid](*common, PPT=K, BM=BM, BN=bn, BK=bk, PERSISTENT=persistent,
                             num_warps=warps, num_stages=stages)

    act0 = torch.zeros(n_m * BM, I, device=dev, dtype=dt)
    prod_gu(act0)
    real = (torch.arange(BM, device=dev)[None] < layout[2][:, None]).flatten()
    variants = [("production gate_up", prod_gu, {}),
                ("production gate_up, 3 stages", prod_gu, dict(stages=3))]
    if TINY:
        variants = [("one dot", one_dot, {}), ("one dot persistent", one_dot,
                    dict(persistent=True)), ("flat", one_dot, dict(flat=True))]
    else:
        for kw in (dict(), dict(persistent=True)) if "--second" in sys.argv else (
                dict(), dict(stages=3), dict(bn=64, warps=4, stages=4),
                dict(bn=64, warps=8, stages=4), dict(persistent=True),
                dict(persistent=True, stages=3), dict(flat=True), dict(flat=True, stages=3)):
            variants.append((f"one dot {kw}", one_dot, kw))
    for name, fn, kw in variants:
        act = torch.full_like(act0, float("nan"))
        try:
            fn(act, **kw)
            diff = (act[real].float() - act0[real].float()).abs().max().item()
            us = time_us(lambda fn=fn, kw=kw, act=act: fn(act, **kw))
        except Exception as err:  # noqa: BLE001  (an experiment: report and go on)
            print(f"  {name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        print(f"  gate_up {name:48s} {us:8.1f} us {flops_gu / us / 1e6:6.0f} TFLOP/s "
              f"max|diff| {diff:.3g}", flush=True)

    # Down: production (TMA, N-tiles fastest) against the persistent grid.
    out0 = torch.zeros(tokens * K, H, device=dev, dtype=dt)

    def prod_down(out, bn=256 if not TINY else 32, bk=BK, warps=8, stages=3):
        descs = (TensorDescriptor.from_tensor(act0, [BM, bk]),
                 TensorDescriptor.from_tensor(dn.view(-1, I), [bn, bk]))
        down_kernel[(triton.cdiv(H, bn), n_m)](
            act0, dn, dn, *descs, out, w, *tiles, H, I, E, dn.stride(0), dn.stride(1),
            dn.stride(0), dn.stride(1), PAIRS_PER_TOKEN=K, BLOCK_M=BM, BLOCK_N=bn,
            BLOCK_K=bk, EVEN_K=True, DIRECT=False, PRECISION=prec, TMA=True,
            num_warps=warps, num_stages=stages)

    def pers_down(out, bn=256 if not TINY else 32, bk=BK, warps=8, stages=3):
        descs = (TensorDescriptor.from_tensor(act0, [BM, bk]),
                 TensorDescriptor.from_tensor(dn.view(-1, I), [bn, bk]))
        n_n = triton.cdiv(H, bn)
        down_persistent[(min(sms, n_m * n_n),)](
            *descs, out, w, *tiles[:4], tokens, K, H, I, E, n_m, n_n, PPT=K, BM=BM, BN=bn,
            BK=bk, num_warps=warps, num_stages=stages)

    prod_down(out0)
    for name, fn, kw in [("production down", prod_down, {}),
                         ("production down, 4 stages", prod_down, dict(stages=4)),
                         ("persistent down", pers_down, {}),
                         ("persistent down, 4 stages", pers_down, dict(stages=4)),
                         ("persistent down, bn 128", pers_down, dict(bn=128 if not TINY else 16))]:
        out = torch.full_like(out0, float("nan"))
        try:
            fn(out, **kw)
            diff = (out.float() - out0.float()).abs().max().item()
            us = time_us(lambda fn=fn, kw=kw, out=out: fn(out, **kw))
        except Exception as err:  # noqa: BLE001
            print(f"  {name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        print(f"  down {name:51s} {us:8.1f} us {flops_dn / us / 1e6:6.0f} TFLOP/s "
              f"max|diff| {diff:.3g}", flush=True)
    if not TINY:  # the ceiling: cuBLAS on dense operands of the same shapes
        a = torch.randn(tokens * K, H, device=dev, dtype=dt)
        b = torch.randn(H, 2 * I, device=dev, dtype=dt)
        us = time_us(lambda: a @ b)
        print(f"  cuBLAS dense [{tokens * K}, {H}] x [{H}, {2 * I}] {us:8.1f} us "
              f"{flops_gu / us / 1e6:6.0f} TFLOP/s")
        a2 = torch.randn(tokens * K, I, device=dev, dtype=dt)
        b2 = torch.randn(I, H, device=dev, dtype=dt)
        us = time_us(lambda: a2 @ b2)
        print(f"  cuBLAS dense [{tokens * K}, {I}] x [{I}, {H}] {us:8.1f} us "
              f"{flops_dn / us / 1e6:6.0f} TFLOP/s")


if __name__ == "__main__":
    main()
