"""What one dependent step costs on this GPU: the unit prices of B=1's attention chain.

1. A dependent load: one warp chases a random cycle of 128-byte lines (each load's address is
   the last load's value), over 4 MiB (served by L2 after a warm pass) and over 256 MiB and
   1 GiB (DRAM; L2 flushed first). ns a hop, from 4000 hops less a 0-hop launch.
2. A dependent level: CUDA graphs of 208 chained launches (8 a layer, 26 layers), 132
   programs of 4 warps each, as the chain's kernels launch. Each program reads one value the
   launch before wrote and writes one value. Variants:
   - `plain`: no PDL (the launch waits for the one before to end);
   - `pdl`: launched as a programmatic dependent, `gdc_wait` before the read;
   - `pdl+last`: as `pdl`, and the program's value goes through the last-to-arrive tail the
     chain's merges, `proj_norm` and the router end with (store, acq_rel counter, the last
     program loads every value and writes the sum the next launch reads);
   - `pdl+2x`: as `pdl`, with a second dependent load (an index, then the value it names:
     a page-table entry, then its cache row).
   µs a level: the replay over 208, medians of 5 alternating rounds.
"""

import statistics

import torch
import triton
import triton.language as tl

from mla_func.kernels.counters import last_to_arrive
from scripts import bench_common as common

LINE = 16  # int64 elements in a 128-byte line


@triton.jit
def _chase(buf, out, hops, start):
    i = start.to(tl.int64)
    for _ in range(hops):
        i = tl.load(buf + i, volatile=True).to(tl.int64)
    tl.store(out, i)


@triton.jit
def _level(src, dst, parts, idx, counter, programs, PDL: tl.constexpr, LAST: tl.constexpr,
           TWO: tl.constexpr, BLOCK: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TWO:  # an index first, then the value it names
        at = tl.load(idx + tl.load(src + pid).to(tl.int32) % programs)
    else:
        at = pid
    v = tl.load(src + at) + 1.0
    if LAST:
        tl.store(parts + pid, v)
        if last_to_arrive(counter, programs):
            k = tl.arange(0, BLOCK)
            s = tl.sum(tl.load(parts + k, mask=k < programs, other=0.0, cache_modifier=".cg"))
            tl.store(dst + k, s * 1e-3 + k, mask=k < programs)
            tl.store(counter, 0)
    else:
        tl.store(dst + pid, v)


def chase_ns(size_bytes: int, hops: int = 4000) -> float:
    lines = size_bytes // 128
    perm = torch.randperm(lines, device="cuda")
    nxt = torch.empty(lines, dtype=torch.int64, device="cuda")
    nxt[perm] = torch.roll(perm, -1)
    buf = torch.zeros(lines * LINE, dtype=torch.int64, device="cuda")
    buf[::LINE] = nxt * LINE
    out = torch.empty(1, dtype=torch.int64, device="cuda")
    flush = torch.empty(1 << 28, dtype=torch.uint8, device="cuda") if size_bytes > 1 << 26 \
        else None
    start = int(perm[0]) * LINE

    def timed(n: int) -> float:
        if flush is None:
            buf.sum()  # warm: the whole buffer into L2
        else:
            flush.add_(1)  # 256 MiB through L2: the chase's lines are evicted
        b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b.record()
        _chase[(1,)](buf, out, n, start, num_warps=1)
        e.record()
        e.synchronize()
        return b.elapsed_time(e) * 1e6
    for _ in range(2):
        timed(10)
    ns = [(timed(hops) - timed(0)) / hops for _ in range(5)]
    return statistics.median(ns)


def level_graph(variant: str, levels: int = 208, programs: int = 132):
    bufs = [torch.rand(programs, device="cuda") for _ in range(2)]
    parts = torch.empty(programs, device="cuda")
    idx = torch.randperm(programs, device="cuda").to(torch.int32)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    pdl = variant != "plain"
    kw = dict(PDL=pdl, LAST="last" in variant, TWO="2x" in variant,
              BLOCK=triton.next_power_of_2(programs), num_warps=4,
              **({"launch_pdl": True} if pdl else {}))

    def run():
        for i in range(levels):
            _level[(programs,)](bufs[i % 2], bufs[(i + 1) % 2], parts, idx, counter,
                                programs, **kw)
    return common.capture_graph(run), (bufs, parts, idx, counter), levels


def main() -> None:
    print(torch.cuda.get_device_name())
    for size in (4 << 20, 256 << 20, 1 << 30):
        print(f"dependent load, {size >> 20} MiB working set: {chase_ns(size):.0f} ns a hop")
    variants = ["plain", "pdl", "pdl+last", "pdl+2x"]
    graphs = {v: level_graph(v) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for order in common.alternating(variants, 5):
        for v in order:
            g, _, levels = graphs[v]
            times[v].append(common.cuda_time_ms(g.replay, warmup=2, reps=20) * 1e3 / levels)
    for v in variants:
        print(f"level {v:9s} {statistics.median(times[v]):6.2f} us "
              f"(rounds {min(times[v]):.2f}-{max(times[v]):.2f})")


if __name__ == "__main__":
    main()
