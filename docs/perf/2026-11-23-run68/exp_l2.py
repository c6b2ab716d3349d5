"""Does warming the L2 with a weight, on a side stream while latency-bound kernels run, make
the skinny GEMM that reads it next faster? (H100/H200; run from the repository root.)

Per pattern, all in one CUDA graph (20 patterns a replay, medians of replays):
  cold:  flush, sleep, gemm            minus  flush, sleep
  pf_X:  flush, [sleep || prefetch X], gemm   minus  flush, [sleep || prefetch X]
  hot:   flush, gemm, gemm             minus  flush, gemm
`sleep` (torch.cuda._sleep, one SM) stands for the latency-bound attention kernels.
X: line (prefetch.global.L2 per 128-byte line), line_el (the same, ::evict_last),
bulk (cp.async.bulk.prefetch.L2, 16 KiB a thread), load (tl.load evict_last into a sum).
"""

import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _pf_kernel(base, nbytes, sink, LINES: tl.constexpr, STEP: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    offs = (pid * LINES + tl.arange(0, LINES)).to(tl.int64) * STEP
    offs = tl.minimum(offs, nbytes - STEP)
    addr = base + offs
    if MODE == 0:
        r = tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                      [addr], dtype=tl.int32, is_pure=False, pack=1)
    elif MODE == 1:
        r = tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
                                      "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise(
            "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
            [addr, tl.full([LINES], STEP, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + pid + tl.arange(0, LINES) * 0, r, mask=r == 12345)



@triton.jit
def _load_kernel(x, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        o = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x + o, mask=o < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    s = tl.sum(acc)
    tl.store(out + pid, s, mask=s == 12345.0)


def prefetch(w: torch.Tensor, mode: str, programs: int) -> None:
    nbytes = w.numel() * w.element_size()
    if mode == "load":
        flat = w.view(-1)
        block = 1024
        iters = triton.cdiv(triton.cdiv(flat.numel(), block), programs)
        _load_kernel[(programs,)](flat, _SINK, flat.numel(), BLOCK=block, ITERS=iters,
                                  num_warps=4)
        return
    step = 16384 if mode == "bulk" else 128
    units = triton.cdiv(nbytes, step)
    lines = max(32, triton.next_power_of_2(triton.cdiv(units, programs)))
    lines = min(lines, 4096)
    grid = triton.cdiv(units, lines)
    _pf_kernel[(grid,)](w.data_ptr(), nbytes, _ISINK, LINES=lines, STEP=step,
                        MODE={"line": 0, "line_el": 1, "bulk": 2}[mode], num_warps=4)


_SINK = None
_ISINK = None


def graph_us(body, patterns: int = 20, reps: int = 30) -> float:
    side = torch.cuda.Stream()
    for _ in range(2):
        body(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(patterns):
            body(side)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / patterns)
    return statistics.median(ts)


def main() -> None:
    global _SINK, _ISINK
    dev = "cuda"
    _SINK = torch.zeros(4096, device=dev)
    _ISINK = torch.zeros(4096, device=dev, dtype=torch.int32)
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    sleep_cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 30000
    shapes = {"o_proj": (2048, 2048), "q+kv_a": (3648, 2048), "shared gate_up": (5632, 2048)}
    print(f"# {torch.cuda.get_device_name()}, sleep {sleep_cycles} cycles")
    print("| weight | MB | M | gemm hot | gemm cold | " + " | ".join(
        f"after {m}" for m in ("line", "line_el", "bulk", "load")) + " | pf alone (line, bulk) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        mb = w.numel() * 2 / 1e6
        for m in (1, 32, 128):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

            def flush(side):
                flush_buf.zero_()

            def sleep(side):
                torch.cuda._sleep(sleep_cycles)

            def gemm(side):
                F.linear(x, w)

            def pf(mode):
                def run(side):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        prefetch(w, mode, 16 if mode != "load" else 64)
                    torch.cuda._sleep(sleep_cycles)
                    torch.cuda.current_stream().wait_stream(side)
                return run

            def seq(*fs):
                def run(side):
                    for f in fs:
                        f(side)
                return run

            base = graph_us(seq(flush, sleep))
            cold = graph_us(seq(flush, sleep, gemm)) - base
            hot = graph_us(seq(flush, gemm, gemm)) - graph_us(seq(flush, gemm))
            after, alone = [], []
            for mode in ("line", "line_el", "bulk", "load"):
                b = graph_us(seq(flush, pf(mode)))
                after.append(graph_us(seq(flush, pf(mode), gemm)) - b)
                if mode in ("line", "bulk"):
                    alone.append(b - base)
            print(f"| {name} | {mb:.1f} | {m} | {hot:.2f} | {cold:.2f} | "
                  + " | ".join(f"{a:.2f}" for a in after)
                  + f" | {alone[0]:+.2f}, {alone[1]:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
