"""Does the copy bandwidth, the decode floors' ceiling, hold under sustained load as the matmul
rate does not? The run's burst reading (`measure_ceilings`), then a 2 GiB device-to-device
copy replayed back to back for 3 s in blocks of 10 (median block of the second half), then
the same after 3 s of sustained 8192^3 matmuls, with the SM clock after each."""

import statistics
import time

import torch

from scripts import bench_common as common


def held_copy(seconds: float = 3.0, block: int = 10) -> tuple[float, list[float]]:
    n = 1 << 30
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b.record()
        for _ in range(block):
            dst.copy_(src)
        e.record()
        e.synchronize()
        ms.append(b.elapsed_time(e) / block)
    gbs = [2 * n * 2 / (m * 1e-3) / 1e9 for m in ms]
    return statistics.median(gbs[len(gbs) // 2:]), gbs


ceil = common.measure_ceilings()
print(f"burst: copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
copy, blocks = held_copy()
print(f"copy held 3 s: {copy:.0f} GB/s (first block {blocks[0]:.0f}, min {min(blocks):.0f}); "
      f"SM clock {common.sm_clock_mhz()} MHz")
mm = common.sustained_matmul(seconds=3.0)
print(f"matmul held 3 s: {mm['sustained_tflops']:.0f} TFLOP/s at {mm['sustained_mhz']} MHz "
      f"(first block {mm['first_block_tflops']:.0f})")
copy, blocks = held_copy()
print(f"copy held 3 s after the matmuls: {copy:.0f} GB/s (first block {blocks[0]:.0f}); "
      f"SM clock {common.sm_clock_mhz()} MHz")
print(f"burst again: {common.measure_ceilings()}")
