"""Where an eager prefill step (V2-Lite, random bf16 weights, Triton backend, one prompt of
1024 tokens) spends its host time: the synchronising CUDA calls it makes (torch's sync debug
mode, with the Python line of each), then a torch.profiler table of one step (CPU ops by
self time, CUDA runtime calls, kernel time against wall time)."""

import cProfile
import pstats
import sys
import time
import traceback
import warnings
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf


def main() -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, num_pages=160, page_size=64, device="cuda",
                          dtype=torch.bfloat16)
    n = 1024
    pages = state.allocator.reserve(0, n)
    toks = torch.randint(0, 100000, (n,)).tolist()
    batch = mf.make_batch([mf.SeqWork(toks, 0, pages)], state.page_size, 128,
                          device="cuda", backend="triton")

    def step():
        return mf.forward(params, state, batch)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"# host {1e3 * (t1 - t0):.1f} ms, host+drain {1e3 * (time.perf_counter() - t0):.1f}"
              " ms", flush=True)
    sites: Counter = Counter()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
    torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        sites[f"{w.filename}:{w.lineno} {str(w.message)[:80]}"] += 1
    print(f"# synchronising calls in one step: {sum(sites.values())}")
    for site, count in sites.most_common(20):
        print(f"#   {count:4d} {site}")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events)
    print(f"# profiled step: wall {1e3 * wall:.1f} ms, device time {kernel_us / 1e3:.1f} ms")
    print(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=sys.stdout)
    print("# cProfile of one step, by cumulative time")
    stats.sort_stats("cumulative").print_stats(r"mla_func|triton|custom_ops", 45)
    print("# cProfile of one step, by own time")
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
