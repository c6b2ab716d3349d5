"""A compiled full step timed synced against its bare graph (2026-11-24, twentieth session).
`bench step`'s synced column (start event, `step(state, batch)`, end event, sync) read 0.1-0.26
ms above back to back in run 95, while the bare replay of the same graph is 10-25 us above
(run 104, exp_launch.py). Here, in one process, per batch: the step and its full bucket's bare
replay, synced and back to back; the host's time in the step call (no sync inside); and a
torch.profiler listing of three synced calls (CUDA kernels outside the graph, CPU ops):

    PYTHONPATH=. python3 exp_host.py [--batch 1 32 128] [--ctx 1024]
"""

import argparse
import math
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf
from mla_func.compile_step import compile_step
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def host_ms(fn, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--max-pages", type=int, default=129)
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
            kind, size = step.choose(step._merge((state, batch)))
            replay = step.full[size].graph.replay

            def call(b=batch):
                return step(state, b)

            res = {}
            for r in range(3):
                for name, fn in (("step", call), ("replay", replay)):
                    res.setdefault(name + " synced", []).append(cuda_time_ms(fn, reps=30))
                    res.setdefault(name + " b2b", []).append(pipelined_ms(fn))
            res["host step()"] = [host_ms(call)]
            res["host replay()"] = [host_ms(replay)]
            print(f"ctx {ctx} B={bsz} ({kind} bucket {size}), ms, median of rounds:", flush=True)
            for k, v in res.items():
                print(f"  {k:15s} {statistics.median(v):.4f}  ({min(v):.4f}-{max(v):.4f})",
                      flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    call()
                    torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14,
                                            max_name_column_width=50), flush=True)


if __name__ == "__main__":
    main()
