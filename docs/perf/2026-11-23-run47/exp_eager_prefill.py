"""Eager prefill step (V2-Lite, random bf16 weights, Triton backend, one prompt): host time
per call (the step is CPU-bound up to ~4096 tokens) and GPU time, then a cProfile of one
1024-token call (top entries by own time). Run in each tree to compare them."""

import cProfile
import pstats
import sys
import time

import torch

import mla_func as mf
from scripts.bench_common import cuda_time_ms


def main() -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, num_pages=160, page_size=64, device="cuda",
                          dtype=torch.bfloat16)
    for n in (1024, 2048, 8192):
        alloc = state.allocator
        for seq in list(alloc.pages):
            alloc.release(seq)
        pages = alloc.reserve(0, n)
        toks = torch.randint(0, 100000, (n,)).tolist()
        batch = mf.make_batch([mf.SeqWork(toks, 0, pages)], state.page_size, 128,
                              device="cuda", backend="triton")
        step = lambda b=batch: mf.forward(params, state, b)  # noqa: E731
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        host = []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        gpu = cuda_time_ms(step, reps=5)
        print(f"# tokens {n:5d} host_ms {sorted(host)[2]:.1f} ({min(host):.1f}-{max(host):.1f})"
              f" step_ms {gpu:.1f}", flush=True)
        if n == 1024:
            prof = cProfile.Profile()
            prof.enable()
            step()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
