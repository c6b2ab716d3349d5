"""Where a synced step's extra time goes (2026-11-24, twentieth session). A whole-step graph
timed alone (start event, replay, end event, sync) takes 0.1-0.3 ms more than one of 20 back
to back (runs 40-42 of 2026-11-23, run 95). Three timings of the same graph:

    idle:   start, replay, end with the GPU idle (the benchmark's synced timing);
    queued: a sleep kernel first, then start, replay, end: the replay is queued before the
            GPU reaches the start event, so the host's launch time is hidden;
    b2b:    20 replays back to back, per replay;

and the host's time in `replay()` itself. Also graphs of N small kernels (N = 50 .. 800), to
see whether a graph's launch cost grows with its nodes:

    PYTHONPATH=. python3 exp_launch.py [--batch 1 32 128] [--ctx 1024]
"""

import argparse
import math
import statistics
import time

import torch

import mla_func as mf
from scripts.bench_common import pipelined_ms
from scripts.bench_step import decode_batch


def timings(replay, reps: int = 30) -> dict[str, float]:
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    idle, queued, host = [], [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        replay()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        idle.append(a.elapsed_time(b))
        torch.cuda._sleep(4_000_000)  # ~2 ms of GPU time: the replay below queues behind it
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        queued.append(a.elapsed_time(b))
    return {"idle": statistics.median(idle), "queued": statistics.median(queued),
            "b2b": pipelined_ms(replay), "host_replay": statistics.median(host)}


def capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def show(name: str, t: dict[str, float]) -> None:
    print(f"  {name:28s} idle {t['idle']:.4f}  queued {t['queued']:.4f}  b2b {t['b2b']:.4f}  "
          f"host replay() {t['host_replay']:.4f} ms", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--nodes", type=int, nargs="+", default=[50, 200, 400, 800])
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    x = torch.randn(1024, device="cuda")
    for n in args.nodes:
        def chain(n=n):
            y = x
            for _ in range(n):
                y = y + 1.0
            return y
        show(f"{n} small kernels", timings(capture(chain).replay))
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            g = capture(lambda b=batch: mf.forward(params, state, b))
            show(f"step ctx {ctx} B={bsz}", timings(g.replay))
            del g


if __name__ == "__main__":
    main()
