"""What a dependent level costs: a chain of matrix-vector products (one row, as the B=1 decode
step's projections are) run as one launch a level (cuBLAS; a Triton kernel without and with
PDL, the weights loaded before the wait as `kernels/small_linear.py` does) against one
persistent launch a chain whose programs meet at a grid barrier between levels (an atomic
counter; each program loads its next weights before it waits). 2026-11-24, twenty-third
session: a bound for the persistent per-layer kernel that PERF.md names as B=1's last lever.

Each chain: LEVELS products v <- W_i v, W_i [D, D] bf16, fp32 accumulation, rounded to bf16.
A CUDA graph holds REPEATS chains (as a step holds layers); graphs are replayed back to back,
variants in alternating rounds; µs a level = graph time / (REPEATS * LEVELS), next to the bytes
of a level over the copy bandwidth measured in the same process:

    PYTHONPATH=. python3 exp_chain.py [--dims 512 1024 2048] [--levels 8] [--repeats 26]
"""

import argparse
import statistics
from typing import no_type_check

import torch
import triton
import triton.language as tl

from scripts.bench_common import pipelined_ms


@triton.jit
@no_type_check
def _level_kernel(x, w, y, D: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, D)
    wt = tl.load(w + n[:, None].to(tl.int64) * D + k[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()
    v = tl.load(x + k).to(tl.float32)
    acc = tl.sum(wt.to(tl.float32) * v[None, :], 1)
    tl.store(y + n, acc.to(y.dtype.element_ty))


@triton.jit
@no_type_check
def _chain_kernel(v, w, counters, LEVELS: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Program p owns output rows [p*BLOCK_N, (p+1)*BLOCK_N) of every level. v: [LEVELS + 1,
    D] (v[0] the input); w: [LEVELS, D, D]; counters: [LEVELS + 1] int32, zero at entry and
    left zero (the last program out resets them)."""
    p = tl.program_id(0)
    nprog = tl.num_programs(0)
    n = p * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, D)
    for i in tl.static_range(LEVELS):
        wt = tl.load(w + i * D * D + n[:, None].to(tl.int64) * D + k[None, :])
        if i > 0:  # wait until every program has stored its rows of level i - 1
            while tl.atomic_add(counters + i - 1, 0, sem="acquire") < nprog:
                pass
        x = tl.load(v + i * D + k, cache_modifier=".cg").to(tl.float32)  # not from L1
        acc = tl.sum(wt.to(tl.float32) * x[None, :], 1)
        tl.store(v + (i + 1) * D + n, acc.to(v.dtype.element_ty))
        tl.debug_barrier()  # every thread's stores before the release below
        tl.atomic_add(counters + i, 1, sem="release")
    done = tl.atomic_add(counters + LEVELS, 1, sem="acq_rel")
    if done == nprog - 1:  # every program is past every barrier: reset for the next launch
        for i in tl.static_range(LEVELS + 1):
            tl.atomic_xchg(counters + i, 0)


@triton.jit
@no_type_check
def _flags_kernel(v, w, flags, done, LEVELS: tl.constexpr, D: tl.constexpr,
                  BLOCK_N: tl.constexpr, P: tl.constexpr):
    """The same chain with a flag per program and level instead of one counter a level: each
    program sets its own flag (no contended atomic) and a waiter reads all P flags at once.
    flags: [LEVELS, P] int32, done: [1] int32, zero at entry and left zero."""
    p = tl.program_id(0)
    n = p * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, D)
    q = tl.arange(0, P)
    for i in tl.static_range(LEVELS):
        wt = tl.load(w + i * D * D + n[:, None].to(tl.int64) * D + k[None, :])
        if i > 0:
            seen = tl.min(tl.load(flags + (i - 1) * P + q, volatile=True), 0)
            while seen == 0:
                seen = tl.min(tl.load(flags + (i - 1) * P + q, volatile=True), 0)
            tl.atomic_add(flags + (i - 1) * P, 0, sem="acquire")  # order the loads below
        x = tl.load(v + i * D + k, cache_modifier=".cg").to(tl.float32)
        acc = tl.sum(wt.to(tl.float32) * x[None, :], 1)
        tl.store(v + (i + 1) * D + n, acc.to(v.dtype.element_ty))
        tl.debug_barrier()
        tl.atomic_xchg(flags + i * P + p, 1, sem="release")
    last = tl.atomic_add(done, 1, sem="acq_rel")
    if last == P - 1:
        for i in tl.static_range(LEVELS):
            tl.store(flags + i * P + q, tl.zeros([P], tl.int32))
        tl.atomic_xchg(done, 0)


def copy_gbps() -> float:
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = pipelined_ms(lambda: b.copy_(a), calls=20, reps=5)
    return 2 * a.numel() / ms / 1e6


def graph_of(fn, repeats):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(repeats):
            fn()
    return g


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--levels", type=int, default=8)
    p.add_argument("--repeats", type=int, default=26)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_gbps()
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs, copy {bw:.0f} GB/s, "
          f"{args.levels} levels a chain, {args.repeats} chains a graph")
    print("| D | MB a level | floor µs | cuBLAS | Triton | Triton + PDL | persistent, counter "
          "(programs) | persistent, flags | max err (persistent, flags; others) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.dims:
        g = torch.Generator(device="cuda").manual_seed(d)
        w = (torch.randn(args.levels, d, d, device="cuda", generator=g) / d ** 0.5
             ).to(torch.bfloat16)
        v = torch.zeros(args.levels + 1, d, device="cuda", dtype=torch.bfloat16)
        v[0] = torch.randn(d, device="cuda", generator=g).to(torch.bfloat16)
        counters = torch.zeros(args.levels + 1, dtype=torch.int32, device="cuda")
        block_p = max(1, triton.next_power_of_2(triton.cdiv(d, sms)))  # rows a persistent prog
        programs = d // block_p
        assert programs <= sms, "every persistent program must be resident at once"

        def cublas():
            for i in range(args.levels):
                torch.mv(w[i], v[i], out=v[i + 1])

        def triton_chain(pdl):
            def run():
                for i in range(args.levels):
                    _level_kernel[(d // 4,)](v[i], w[i], v[i + 1], D=d, BLOCK_N=4, PDL=pdl,
                                             num_warps=4, **({"launch_pdl": True} if pdl else {}))
            return run

        def persistent():
            _chain_kernel[(programs,)](v, w, counters, LEVELS=args.levels, D=d,
                                       BLOCK_N=block_p, num_warps=8)

        flags = torch.zeros(args.levels, programs, dtype=torch.int32, device="cuda")
        done = torch.zeros(1, dtype=torch.int32, device="cuda")

        def flagged():
            _flags_kernel[(programs,)](v, w, flags, done, LEVELS=args.levels, D=d,
                                       BLOCK_N=block_p, P=programs, num_warps=8)

        variants = {"cublas": cublas, "triton": triton_chain(False),
                    "pdl": triton_chain(True), "persistent": persistent, "flags": flagged}
        # Reference: levels in float32 from the same bf16 weights, rounded as the kernels do.
        ref = v[0].clone()
        for i in range(args.levels):
            ref = (w[i].float() @ ref.float()).to(torch.bfloat16)
        errs = {}
        for name, fn in variants.items():
            v[1:].zero_()
            fn()
            torch.cuda.synchronize()
            errs[name] = (v[-1].float() - ref.float()).abs().max().item()
        graphs = {name: graph_of(fn, args.repeats) for name, fn in variants.items()}
        times: dict[str, list[float]] = {name: [] for name in graphs}
        order = list(graphs)
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                times[name].append(pipelined_ms(graphs[name].replay, calls=10, reps=5))
        per = {n: statistics.median(t) * 1e3 / (args.repeats * args.levels)
               for n, t in times.items()}
        mb = d * d * 2 / 1e6
        print(f"| {d} | {mb:.2f} | {mb / bw * 1e3:.2f} | {per['cublas']:.2f} | "
              f"{per['triton']:.2f} | {per['pdl']:.2f} | {per['persistent']:.2f} ({programs}) "
              f"| {per['flags']:.2f} | {errs['persistent']:.3g}, {errs['flags']:.3g}; "
              f"{max(errs[n] for n in ('cublas', 'triton', 'pdl')):.3g} |",
              flush=True)
        spread = {n: f"{min(t) * 1e3 / (args.repeats * args.levels):.2f}-"
                     f"{max(t) * 1e3 / (args.repeats * args.levels):.2f}" for n, t in times.items()}
        print(f"  rounds' spread (µs a level): {spread}", flush=True)
        del graphs


if __name__ == "__main__":
    main()
