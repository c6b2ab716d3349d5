"""Where the host time of one compiled full decode step goes (V2-Lite, GPU): the step called
and synced one at a time (as `bench step` times `full_ms`), back to back (`full_pipelined_ms`),
and the bare graph replay; then the host time of each stage of `CompiledStep.__call__`
(perf_counter around each method, steps synced one at a time), at B = 1, 32, 128.

    PYTHONPATH=. python3 exp_host.py [--batch 1 32 128]
"""

import argparse
import collections
import math
import time

import torch

import mla_func as mf
from mla_func.capture.dispatch import CompiledStep
from mla_func.compile_step import compile_step
from scripts.bench_common import cuda_time_ms
from scripts.bench_step import decode_batch


def pipelined_ms(fn, calls: int = 20, reps: int = 5) -> float:
    """As scripts.bench_common.pipelined_ms (here too for trees that lack it)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return sorted(times)[reps // 2]


STAGES = ("_merge", "_leaves_of", "_check", "_choose", "_fill", "_outputs", "_run")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    max_pages = math.ceil(4097 / 64)
    state = mf.init_state(cfg, max(args.batch) * max_pages + 2, 64, device="cuda",
                          dtype=torch.bfloat16)
    state.cache.normal_()
    step = compile_step(params, state, mode="full", max_seqs=max(args.batch),
                        max_pages=max_pages, backend="triton", progress=False)
    spent: dict[str, float] = collections.defaultdict(float)
    originals = {name: getattr(CompiledStep, name) for name in STAGES}

    def timed(name):
        fn = originals[name]

        def run(self, *a, **k):
            t = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return run

    print(f"# {torch.cuda.get_device_name()}")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, 1024, "triton", seed=bsz, max_pages=max_pages)
        call = lambda b=batch: step(state, b)  # noqa: E731
        kind, size = step.choose(step._merge((state, batch)))
        graph = step.full[size].graph
        sync = cuda_time_ms(call, reps=30)
        pipe = pipelined_ms(call)
        bare = cuda_time_ms(graph.replay, reps=30)
        for name in STAGES:
            setattr(CompiledStep, name, timed(name))
        spent.clear()
        n = 50
        wall = 0.0
        try:
            for _ in range(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                call()
                wall += time.perf_counter() - t
        finally:
            for name, fn in originals.items():
                setattr(CompiledStep, name, fn)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            graph.replay()
        replay_host = (time.perf_counter() - t) / n
        torch.cuda.synchronize()
        print(f"B={bsz} ({kind} {size}): step synced {sync:.3f} ms, back to back {pipe:.3f}, "
              f"bare replay {bare:.3f}; host a call {wall / n * 1e6:.0f} us: " + ", ".join(
                  f"{k} {v / n * 1e6:.0f}" for k, v in spent.items())
              + f"; bare graph.replay() host {replay_host * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
