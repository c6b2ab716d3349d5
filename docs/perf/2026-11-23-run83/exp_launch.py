"""Where a synced whole-step graph replay loses time against back-to-back replays (GPU): per
batch, the host time of `graph.replay()` with the GPU idle, the synced replay (CUDA events,
a sync after each), back-to-back replays, and two replays between one pair of events.

    PYTHONPATH=. python3 exp_launch.py [--batch 1 8 32 128] [--ctx 1024]
"""

import argparse
import math
import statistics
import time

import torch

import mla_func as mf
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def capture(params, state, batch):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            mf.forward(params, state, batch)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mf.forward(params, state, batch)
    g.replay()
    torch.cuda.synchronize()
    return g


def host_ms(fn, reps=30) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def sleep_then(fn, us: float):
    """fn launched behind a GPU sleep of `us` (the launch is then off the measured path)."""
    def run():
        torch.cuda._sleep(int(us * 1.98e3))  # ~1.98 GHz cycles a microsecond on an H100
        fn()
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, default=1024)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    print("| B | host replay() ms | synced ms | back to back ms | 2 replays synced ms "
          "| 1 ms sleep + replay, synced, minus the sleep alone ms |")
    print("|---|---|---|---|---|---|")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=129)
        g = capture(params, state, batch)
        host = host_ms(g.replay)
        synced = cuda_time_ms(g.replay, reps=30)
        back = pipelined_ms(g.replay)
        two = cuda_time_ms(lambda g=g: (g.replay(), g.replay()), reps=30)
        slept = cuda_time_ms(sleep_then(g.replay, 1000), reps=30)
        sleep = cuda_time_ms(sleep_then(lambda: None, 1000), reps=30)
        print(f"| {bsz} | {host:.3f} | {synced:.3f} | {back:.3f} | {two:.3f} "
              f"| {slept - sleep:.3f} |", flush=True)
        del g


if __name__ == "__main__":
    main()
