"""Shared benchmark helpers: the ceilings (copy bandwidth, bf16 matmul rate, and beside them
the read-only bandwidth) and timing.

METHOD: the ceilings are measured in the same run as the code they bound; times are medians
of CUDA-event-timed repetitions after warm-up, on random (never zero) data.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl


class StateChain:
    """Steps on one state, each passed the state the one before returned (a step consumes the
    state it is given: `mla_func.donation`): `chain(step, batch)` runs `step(state, batch)`
    and returns its logits; `chain.state` is the live state."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def __call__(self, step: Callable[..., tuple], batch: Any) -> Any:
        logits, self.state = step(self.state, batch)
        return logits


def cuda_time_ms(fn: Callable[[], object], warmup: int = 3, reps: int = 20) -> float:
    """Median milliseconds of `fn()` timed with CUDA events, synced after each call."""
    return pipelined_ms(fn, calls=1, reps=reps, warmup=warmup)


def pipelined_ms(fn: Callable[[], object], calls: int = 20, reps: int = 5,
                 warmup: int = 3) -> float:
    """Median milliseconds a call of `fn` over `calls` calls made back to back, with no sync
    between them: the host prepares call k+1 while the GPU runs call k, as a serving loop with
    a step in flight does. (`cuda_time_ms`, one call a timing, syncs after every call, so there
    the host's work before the GPU's counts too.)"""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`fn` warmed up on a side stream, then captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_time_ms(fn: Callable[[], object], reps: int = 50) -> float:
    """Median milliseconds of one replay of `fn` captured in a CUDA graph."""
    return cuda_time_ms(capture_graph(fn).replay, warmup=3, reps=reps)


def alternating(names: list[str], rounds: int) -> list[list[str]]:
    """The order of the cases in each timing round: as given, then reversed, and so on, so that
    a drift of the clocks over the run does not fall on one case (METHOD: time each version
    more than once; a difference smaller than one version's spread is noise)."""
    return [list(names) if r % 2 == 0 else list(names)[::-1] for r in range(rounds)]


def measure_ceilings(device: str = "cuda") -> dict[str, float | dict[str, float]]:
    """Device-to-device copy bandwidth (bytes read + written), the read-only bandwidth (the
    faster of two reads of the same buffer, `read_rates`: bytes read; both kept in
    `read_probes_gbs`) and the bf16 matmul rate. The floors divide by the copy bandwidth
    (docs/PERF.md); the read rate is reported beside it because the step's big kernels only
    read, and a read stream runs a little faster than a copy (2026-11-27 run 8, H100: 3064
    against 2988 GB/s at 2 GiB)."""
    n = 1 << 30  # 2 GiB of bf16 per buffer: far beyond L2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    ms = cuda_time_ms(lambda: dst.copy_(src), reps=10)
    copy_gbs = 2 * nbytes / (ms * 1e-3) / 1e9
    reads = read_rates(src)
    size = 8192
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: a @ b, reps=10)
    return {"copy_gbs": copy_gbs, "read_gbs": max(reads.values()),
            "matmul_tflops": _matmul_tflops(size, ms), "read_probes_gbs": reads}


@triton.jit
def _read_kernel(x, out, n, BLOCK: tl.constexpr):
    """Sums `x` (n a multiple of BLOCK) grid-stride, BLOCK elements a load; one sum a lane
    to `out`, so that the loads are kept."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc += tl.load(x + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


def read_rates(src: torch.Tensor, block: int = 4096, per_sm: int = 4) -> dict[str, float]:
    """GB/s of reading `src` once (bytes read), by `torch.sum` and by a grid-stride Triton
    read (`per_sm` programs an SM, 8 warps, `block` elements a load: of the twelve shapes of
    2026-11-27 run 8, the fastest at 46-381 MB and within 0.1% of it at 2 GiB), each
    replayed in a CUDA graph. Two probes, not one: `torch.sum` timed eagerly read 2 GiB at
    2454 GB/s (run 9), under the copy rate, where in a graph it read 3064 (run 8)."""
    assert src.numel() % block == 0
    programs = per_sm * torch.cuda.get_device_properties(src.device).multi_processor_count
    out = torch.empty(programs * block, dtype=torch.float32, device=src.device)
    probes = {"sum": lambda: src.sum(),
              "triton": lambda: _read_kernel[(programs,)](src, out, src.numel(), BLOCK=block,
                                                          num_warps=8)}
    nbytes = src.numel() * src.element_size()
    return {name: nbytes / (graph_time_ms(fn, reps=10) * 1e-3) / 1e9
            for name, fn in probes.items()}


def _matmul_tflops(size: int, ms: float) -> float:
    """TFLOP/s of a `size`³ product that took `ms` milliseconds."""
    return 2 * size**3 / (ms * 1e-3) / 1e12


def _matmul_graph(size: int) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """A `size`³ bf16 product captured in a CUDA graph, and its operands: the graph holds their
    raw addresses, so the caller keeps them alive as long as it replays (freed, the next
    capture's empty_cache would unmap them under the replay)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    return capture_graph(lambda: a @ b), (a, b)


def matmul_probe(size: int = 8192, reps: int = 5) -> Callable[[], float]:
    """The bf16 matmul ceiling, measured again at each call: a call returns TFLOP/s, the
    median of `reps` replays of a captured `size`³ product. Sustained tensor-core load can
    lower the clocks (the power limit), so a rate read once at the start of a run may not hold
    for a layer timed a minute later; a probe around each timing gives the rate of the same
    moment (`measure_ceilings` keeps the run's one reading)."""
    graph, operands = _matmul_graph(size)

    def probe(_operands: tuple = operands) -> float:
        return _matmul_tflops(size, cuda_time_ms(graph.replay, warmup=1, reps=reps))
    return probe


def sustained_matmul(seconds: float = 2.0, size: int = 8192, block: int = 16
                     ) -> dict[str, float | None]:
    """The bf16 matmul rate the GPU holds under sustained load: a captured `size`³ product
    replayed back to back for `seconds`, timed in blocks of `block` replays; the median block
    of the second half (once the power limit has settled the clocks), the SM clock read at the
    end, and the first block's rate (a short burst, as `measure_ceilings` times: the boost
    clock)."""
    graph, _operands = _matmul_graph(size)
    ms: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(ms) < 4:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(block):
            graph.replay()
        end.record()
        end.synchronize()
        ms.append(begin.elapsed_time(end) / block)
    return {"sustained_tflops": _matmul_tflops(size, statistics.median(ms[len(ms) // 2:])),
            "sustained_mhz": sm_clock_mhz(), "first_block_tflops": _matmul_tflops(size, ms[0])}


def sm_clock_mhz() -> int | None:
    """The SM clock (MHz) NVML reports for the current GPU's last sample period; None where
    it cannot tell (no NVML binding, no GPU)."""
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001  (pynvml missing or NVML unavailable: no reading)
        return None


def floor_of(costs: list[tuple[int, int]], copy_gbs: float, matmul_tflops: float) -> float:
    """The floor (µs) of work given as (bytes, FLOPs) per part, averaged over the parts:
    max(bytes / copy bandwidth, FLOPs / matmul rate) each (docs/PERF.md, "Conventions")."""
    return sum(max(b / (copy_gbs * 1e9), f / (matmul_tflops * 1e12))
               for b, f in costs) / len(costs) * 1e6


@dataclass(frozen=True)
class Round:
    """One timing of a form: µs a part; with a probe, the matmul rate around it (TFLOP/s, the
    mean of a `matmul_probe` just before and one just after) and the SM clock NVML reported
    right after it (MHz, None where NVML cannot tell)."""

    us: float
    tflops: float | None = None
    mhz: int | None = None


def paired_ratios(rounds: list[Round], costs: list[tuple[int, int]], copy_gbs: float
                  ) -> list[float]:
    """Each round's time over the floor at the matmul rate probed around that round (the copy
    bandwidth is the run's); rounds without a probe are left out."""
    return [r.us / floor_of(costs, copy_gbs, r.tflops) for r in rounds if r.tflops]


def held_sustained_rate(start: dict, end: dict) -> dict:
    """Of two `sustained_matmul` readings (before and after the timings), the higher rate, so
    that the sustained floor is the lower (the ratio to it the more conservative); both
    readings kept."""
    best = max(start, end, key=lambda r: r["sustained_tflops"])
    return {**best, "sustained_start_tflops": start["sustained_tflops"],
            "sustained_end_tflops": end["sustained_tflops"]}


def median_or_none(values: list) -> float | None:
    """The median of the values that are not None; None if there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def print_table(rows: list[dict], columns: list[str], title: str = "") -> None:
    if title:
        print(f"\n## {title}")
    if not rows:
        print("(no rows)")
        return

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
