"""What a whole-step graph's launch costs, per batch (2026-11-24, twentieth session). Run 105:
`replay()` of the V2-Lite step graph held the host 0.01 / 0.15 / 0.33 ms at B = 1 / 32 / 128,
and a synced replay ran 8 / 158 / 116 us over one back to back. Per batch here: the graph's
GPU activities by name (the profiler over one replay), the host's time in `replay()` with the
GPU idle and with it busy (a sleep kernel queued first: then the launch cannot wait on the
GPU's progress), and the replay idle / queued / back to back (exp_launch.py's three timings):

    PYTHONPATH=. python3 exp_graph.py [--batch 1 8 32 128] [--ctx 1024]
"""

import argparse
import collections
import math
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf
from scripts.bench_step import decode_batch

sys_path = os.path.dirname(os.path.abspath(__file__))
import sys  # noqa: E402

sys.path.insert(0, sys_path)
from exp_launch import timings  # noqa: E402


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


def node_names(replay) -> collections.Counter:
    """The GPU activities of one replay under the profiler, by name (first 40 characters)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return collections.Counter(e.name[:40] for e in prof.events()
                               if e.device_type == torch.autograd.DeviceType.CUDA)


def busy_host_ms(replay, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(4_000_000)
        t0 = time.perf_counter()
        replay()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, default=1024)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=129)
        g = capture(params, state, batch)
        names = node_names(g.replay)
        t = timings(g.replay)
        print(f"B={bsz}: {sum(names.values())} GPU activities; host replay() idle "
              f"{t['host_replay']:.4f} / busy {busy_host_ms(g.replay):.4f} ms; replay idle "
              f"{t['idle']:.4f} queued {t['queued']:.4f} b2b {t['b2b']:.4f} ms", flush=True)
        print(f"  kernels: {names.most_common(40)}", flush=True)
        del g


if __name__ == "__main__":
    main()
