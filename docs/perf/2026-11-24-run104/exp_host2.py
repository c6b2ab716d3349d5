"""Where a synced compiled step's host time goes (2026-11-24, twentieth session; after run 105,
exp_host.py: the step call's host time was 0.16 / 0.59 / 0.75 ms at B = 1 / 32 / 128 against
0.01 / 0.15 / 0.33 for `replay()` alone). One synced step at a time, with the dispatch's
phases timed on the host (perf_counter) and CUDA events recorded between them, so that the GPU's
clock shows when each phase's work reached it:

    PYTHONPATH=. python3 exp_host2.py [--batch 1 32 128] [--ctx 1024]
"""

import argparse
import math
import statistics
import time

import torch

import mla_func as mf
from mla_func.compile_step import compile_step
from scripts.bench_step import decode_batch

PHASES = ("merge+leaves", "check", "choose", "fill", "replay", "outputs")


def timed_call(step, state, batch) -> tuple[dict[str, float], dict[str, float]]:
    """One step as `CompiledStep.__call__` + `_run` do it (full bucket), phase by phase."""
    host, ev = {}, [torch.cuda.Event(enable_timing=True) for _ in range(len(PHASES) + 1)]
    torch.cuda.synchronize()
    ev[0].record()
    t = time.perf_counter()

    def mark(i: int, name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        host[name] = (now - t) * 1e3
        t = now
        ev[i + 1].record()

    full_args = step._merge((state, batch))
    leaves = step._leaves_of(full_args)
    mark(0, "merge+leaves")
    step._check(leaves)
    mark(1, "check")
    kind, size = step._choose(full_args, leaves)
    assert kind == "full"
    mark(2, "choose")
    real = step.plan.signature.dynamic_sizes(leaves)
    step._fill(leaves, size, None)
    mark(3, "fill")
    bucket = step.full[size]
    bucket.graph.replay()
    mark(4, "replay")
    step._outputs(list(bucket.outputs), leaves, real, full_args, set())
    mark(5, "outputs")
    ev[-1].synchronize()
    gpu = {name: ev[i].elapsed_time(ev[i + 1]) for i, name in enumerate(PHASES)}
    return host, gpu


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--max-pages", type=int, default=129)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    step = compile_step(params, state, mode="full", max_seqs=max(args.batch),
                        max_pages=args.max_pages, backend="triton", progress=False)
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=args.max_pages)
            for _ in range(3):
                timed_call(step, state, batch)
            hosts, gpus = [], []
            for _ in range(args.reps):
                h, g = timed_call(step, state, batch)
                hosts.append(h)
                gpus.append(g)
            print(f"ctx {ctx} B={bsz}: per phase, median ms: host time / GPU event gap "
                  "(from the event before the phase to the one after it)", flush=True)
            for name in PHASES:
                print(f"  {name:13s} {statistics.median(h[name] for h in hosts):.4f} / "
                      f"{statistics.median(g[name] for g in gpus):.4f}", flush=True)
            print(f"  {'total':13s} {statistics.median(sum(h.values()) for h in hosts):.4f} / "
                  f"{statistics.median(sum(g.values()) for g in gpus):.4f}", flush=True)
            leaves = step._leaves_of(step._merge((state, batch)))
            print("  leaves on the host:", [i for i, t in enumerate(leaves)
                                            if t.device.type != "cuda"], flush=True)


if __name__ == "__main__":
    main()
