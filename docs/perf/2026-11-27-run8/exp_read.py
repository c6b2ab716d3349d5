"""What rate does weight streaming reach on this GPU, against the copy bandwidth the decode
floors divide by? The floors (`bench step`, `bench moe`) take bytes over the device-to-device
copy rate (bytes read + written). The decode step's big kernels only read. If a read-only
stream runs faster than a copy, the floors' ceiling is conservative and the weight-streaming
kernels have room left; if not, they are at the ceiling.

For each working set S (the step's kernel sizes: the B=1 down and gate_up GEMMs' 46 and 92 MB,
the B=128 down GEMM's 381 MB, and 2 GiB), k distinct buffers of S (k*S >= 1.5 GB, so nothing
is served from L2) are read in turn inside one CUDA graph; the time of a read is the replay's
over k (launch gaps included, as in a graph of the step). Methods:
- copy: dst.copy_(src), GB/s counted as the floors count it (read + written);
- triton pS wW bB: a grid-stride read-and-sum kernel, S programs an SM, W warps, B bf16 a load;
- gemv: torch.mv (cuBLAS) of a [S / 4096 B, 2048] bf16 matrix (K = V2-Lite's hidden);
- gemm128: a [128, 2048] x [2048, N] bf16 product (B=128's projections and experts' shape);
- sum: torch.sum of the buffer.
Medians of 5 alternating rounds of 20 replays each.
"""

import statistics

import torch
import triton
import triton.language as tl

from scripts import bench_common as common


@triton.jit
def _read_kernel(x, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, step):
        acc += tl.load(x + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def read_fn(bufs, per_sm, warps, block, sms):
    grid = sms * per_sm
    out = torch.empty(grid * block, device="cuda", dtype=torch.float32)

    def run():
        for b in bufs:
            _read_kernel[(grid,)](b, out, b.numel(), BLOCK=block, num_warps=warps)
    return run


def cases_for(size_bytes: int, sms: int) -> tuple[dict, int, list]:
    n = size_bytes // 2 // 16384 * 16384  # bf16 elements, a multiple of every block
    k = max(2, -(-1_500_000_000 // (2 * n)))
    bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
    dsts = [torch.empty_like(b) for b in bufs[:max(2, k // 2)]]
    rows = n // 2048
    mats = [b.view(rows, 2048) for b in bufs]
    vec = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    act = torch.randn(128, 2048, device="cuda", dtype=torch.bfloat16)
    outv = torch.empty(rows, device="cuda", dtype=torch.bfloat16)
    outm = torch.empty(128, rows, device="cuda", dtype=torch.bfloat16)
    cases = {
        "copy": (lambda: [d.copy_(b) for d, b in zip(dsts, bufs)], len(dsts), 2),
        "gemv": (lambda: [torch.mv(m, vec, out=outv) for m in mats], k, 1),
        "gemm128": (lambda: [torch.mm(act, m.T, out=outm) for m in mats], k, 1),
        "sum": (lambda: [b.sum() for b in bufs], k, 1),
    }
    for per_sm in (2, 4, 8):
        for warps in (4, 8):
            for block in (4096, 16384):
                cases[f"triton p{per_sm} w{warps} b{block}"] = (
                    read_fn(bufs, per_sm, warps, block, sms), k, 1)
    return cases, n * 2, bufs


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceil = common.measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: burst copy {ceil['copy_gbs']:.0f} GB/s, "
          f"SMs {sms}")
    for size in (46_100_000, 92_300_000, 381_000_000, 1 << 31):
        cases, nbytes, keep = cases_for(size, sms)
        graphs = {name: common.capture_graph(fn) for name, (fn, _, _) in cases.items()}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for order in common.alternating(list(cases), 5):
            for name in order:
                times[name].append(common.cuda_time_ms(graphs[name].replay, warmup=2, reps=20))
        print(f"\n== working set {nbytes / 1e6:.1f} MB")
        rows = []
        for name, (_, count, factor) in cases.items():
            per = [t / count for t in times[name]]
            med = statistics.median(per)
            rows.append((factor * nbytes / (med * 1e-3) / 1e9, name, med * 1e3,
                         factor * nbytes / (max(per) * 1e-3) / 1e9))
        for gbs, name, us, low in sorted(rows, reverse=True):
            print(f"{name:28s} {us:9.2f} us a read  {gbs:7.0f} GB/s (slowest round {low:.0f})")
        del graphs, keep
        torch.cuda.empty_cache()
    print(f"\nburst copy at the end: {common.measure_ceilings()['copy_gbs']:.0f} GB/s")


if __name__ == "__main__":
    main()
