"""Host time of a compiled full decode step (V2-Lite, GPU), 2026-11-24 thirteenth session:
synced / back to back / bare replay (ms), then cProfile of 200 calls (host only: the profiler
is on for the call, off for the sync after it), at B = 1, 32, 128, ctx 1024.

    PYTHONPATH=. python3 exp_step_host.py [--batch 1 32 128] [--top 25]
"""

import argparse
import cProfile
import io
import math
import pstats
import time

import torch

import mla_func as mf
from mla_func.compile_step import compile_step
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    max_pages = 129
    state = mf.init_state(cfg, max(args.batch) * math.ceil(1025 / 64) + 130, 64,
                          device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    step = compile_step(params, state, mode="full", max_seqs=max(args.batch),
                        max_pages=max_pages, backend="triton", progress=False)
    print(f"# {torch.cuda.get_device_name()}")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, 1024, "triton", seed=bsz, max_pages=max_pages)
        call = lambda b=batch: step(state, b)  # noqa: E731
        kind, size = step.choose(step._merge((state, batch)))
        graph = step.full[size].graph
        sync, pipe = cuda_time_ms(call, reps=30), pipelined_ms(call)
        bare = cuda_time_ms(graph.replay, reps=30)
        prof = cProfile.Profile()
        wall = 0.0
        for _ in range(200):
            torch.cuda.synchronize()
            t = time.perf_counter()
            prof.enable()
            call()
            prof.disable()
            wall += time.perf_counter() - t
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            call()
        unprofiled = (time.perf_counter() - t) / 200
        torch.cuda.synchronize()
        print(f"B={bsz} ({kind} {size}): synced {sync:.3f} ms, back to back {pipe:.3f}, bare "
              f"replay {bare:.3f}; host a call {unprofiled * 1e6:.0f} us unprofiled (back to "
              f"back, so it may wait on the queue), {wall / 200 * 1e6:.0f} us profiled")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000],
              flush=True)


if __name__ == "__main__":
    main()
