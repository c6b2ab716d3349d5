"""A compiled full step's dispatch with and without the `_real` shape cache (2026-11-24,
twentieth session). One process, one compiled step (mode "full"), alternating rounds per
batch: `step(state, batch)` synced and back to back with the tree's `CompiledStep._real`
(cached shapes) and with the version before it (a sympy substitution per output per call),
and the bare replay of the bucket's graph as the reference. No profiler runs in this process
(run 105 showed it slowing later graph launches). `--mode piecewise`: the same for a
piecewise step (graphs up to the largest batch's tokens), whose dispatch narrows ~110 values
a step (no bare replay then):

    PYTHONPATH=. python3 exp_dispatch.py [--batch 1 32 128] [--ctx 1024] [--rounds 6]
                                         [--mode full|piecewise]
"""

import argparse
import math
import statistics
import time

import torch

import mla_func as mf
from mla_func.capture.capture import narrow_to
from mla_func.capture.dispatch import CompiledStep
from mla_func.compile_step import compile_step
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

CACHED = CompiledStep._real


def uncached(self, node, t, real):
    """`CompiledStep._real` before this session."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return t
    return narrow_to(t, [self.plan.traced.evaluate(s, real) for s in val.shape])


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
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-pages", type=int, default=129)
    p.add_argument("--mode", choices=("full", "piecewise"), default="full")
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    step = compile_step(params, state, mode=args.mode, max_seqs=max(args.batch),
                        max_tokens=max(args.batch) if args.mode == "piecewise" else None,
                        max_pages=args.max_pages, backend="triton", progress=False)
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=args.max_pages)
            kind, size = step.choose(step._merge((state, batch)))
            assert kind == args.mode
            replay = step.full[size].graph.replay if kind == "full" else None

            def call(b=batch):
                return step(state, b)

            variants = {"cached": CACHED, "uncached": uncached}
            res: dict[str, list[float]] = {}
            for r in range(args.rounds):
                for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                    CompiledStep._real = variants[name]
                    res.setdefault(f"step {name} synced", []).append(cuda_time_ms(call, reps=30))
                    res.setdefault(f"step {name} b2b", []).append(pipelined_ms(call))
                    res.setdefault(f"host step() {name}", []).append(host_ms(call))
                if replay is not None:
                    res.setdefault("replay synced", []).append(cuda_time_ms(replay, reps=30))
                    res.setdefault("replay b2b", []).append(pipelined_ms(replay))
                    res.setdefault("host replay()", []).append(host_ms(replay))
            CompiledStep._real = CACHED
            print(f"{kind} ctx {ctx} B={bsz}, ms, median of {args.rounds} rounds (min-max):",
                  flush=True)
            for k, v in res.items():
                print(f"  {k:24s} {statistics.median(v):.4f}  ({min(v):.4f}-{max(v):.4f})",
                      flush=True)


if __name__ == "__main__":
    main()
