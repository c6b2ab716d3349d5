"""Where the time of `generate` goes: each step's GPU time by kind, or cProfile of the loop.

    python -m scripts.profile_generate [--requests 128] [--prompt 512] [--new 256] [--timeline]

Builds the engine (cache, graph capture) and runs the workload once with 2 new tokens (first
compiles) outside the measurement. `--timeline` (the method of docs/perf/2026-11-24-h100-run110)
wraps the engine's step function: per step its token, sequence and decode counts, the path the
compiled step takes (full, piecewise, eager), the host time of the call and CUDA events around it
(no sync), then prints, per kind of step (decode / prefill / mixed, by path), the steps, tokens,
host ms and GPU ms, and the GPU's idle time before them. Without it, cProfile over
`Engine.run`: the functions with the most own time (a CUDA sync inside a function, such as the
argmax's `.tolist()`, shows up as that function's time). `--preset tiny --device cpu --mode
eager` runs on a CPU (host times only).
"""

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import mla_func as mf


def kind_of(row: dict[str, Any]) -> str:
    if row["decodes"] == row["seqs"]:
        work = "decode"
    else:
        work = "prefill" if row["decodes"] == 0 else "prefill + decodes"
    return f"{work}, {row['path']}"


def timed_steps(step: Callable[..., Any], log: list[dict[str, Any]]) -> Callable[..., Any]:
    """`step` recording each call in `log` (CUDA events only on CUDA: nothing syncs)."""
    choose = getattr(step, "choose", None)  # a compiled step names the path it will take

    def timed(state, batch):
        path = choose(step._merge((state, batch)))[0] if choose else "eager"
        cuda = batch.token_ids.is_cuda
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else []
        if cuda:
            ev[0].record()
        t = time.perf_counter()
        out = step(state, batch)
        host = (time.perf_counter() - t) * 1e3
        if cuda:
            ev[1].record()
        log.append({"tokens": batch.num_tokens, "seqs": batch.num_seqs,
                    "decodes": batch.num_decodes, "path": path, "host_ms": host, "ev": ev})
        return out

    return timed


def summary(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind of step: count, tokens, median host ms, GPU ms (sum, median) and the GPU's idle
    ms before those steps (after the previous step's end). GPU columns need CUDA events: call
    after the last step has finished."""
    for i, row in enumerate(log):
        if row["ev"]:
            row["gpu_ms"] = row["ev"][0].elapsed_time(row["ev"][1])
            row["idle_ms"] = log[i - 1]["ev"][1].elapsed_time(row["ev"][0]) if i else 0.0
    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in log:
        kinds.setdefault(kind_of(row), []).append(row)
    out = []
    for name, rows in sorted(kinds.items()):
        gpu = [r["gpu_ms"] for r in rows if "gpu_ms" in r]
        out.append({"steps": name, "count": len(rows), "tokens": sum(r["tokens"] for r in rows),
                    "host_ms_median": statistics.median(r["host_ms"] for r in rows),
                    "gpu_ms_sum": sum(gpu) if gpu else None,
                    "gpu_ms_median": statistics.median(gpu) if gpu else None,
                    "idle_ms_before": sum(r["idle_ms"] for r in rows) if gpu else None})
    return out


def main(argv: list[str] | None = None) -> None:
    from mla_func.engine import MAX_BATCH_TOKENS
    from scripts.bench_common import print_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mode", default="full_and_piecewise")
    p.add_argument("--backend", default=None, help="default: triton on CUDA, else torch")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--max-batch-tokens", type=int, default=MAX_BATCH_TOKENS,
                   help="tokens per step (default: the engine's, %(default)s)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="the engine's (page-table width); default prompt + new - 1, as "
                        "generate() sizes it")
    p.add_argument("--timeline", action="store_true", help="each step's GPU time by kind")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    cfg = mf.MLAConfig.preset(args.preset)
    params = mf.init_params(cfg, seed=0, device=args.device,
                            dtype=torch.bfloat16 if cuda else torch.float32)
    need = -(-(args.prompt + args.new) // args.page_size)
    engine = mf.Engine(cfg, params, num_pages=args.requests * need + 2, mode=args.mode,
                       attention_backend=args.backend or ("triton" if cuda else "torch"),
                       page_size=args.page_size, max_batch_tokens=args.max_batch_tokens,
                       max_seqs=args.requests, eos_token_id=None, progress=False,
                       max_seq_len=args.max_seq_len or args.prompt + args.new - 1)
    prompts = torch.randint(2, cfg.vocab_size, (args.requests, args.prompt)).tolist()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def run(new: int, profiler: cProfile.Profile | None = None) -> float:
        for prompt in prompts:
            engine.submit(prompt, new)
        sync()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        engine.run(progress=False)
        if profiler is not None:
            profiler.disable()
        sync()
        return time.perf_counter() - start

    run(2)  # first compiles (seconds with an empty kernel cache) stay out of the measurement
    steps_before = engine.steps
    log: list[dict[str, Any]] = []
    prof = None if args.timeline else cProfile.Profile()
    if args.timeline:
        engine._step_fn = timed_steps(engine._step_fn, log)
    wall = run(args.new, prof)
    how = "" if args.timeline else " (under cProfile)"
    print(f"{engine.steps - steps_before} steps, loop {wall * 1e3:.1f} ms{how}, "
          f"{args.requests * args.new / wall:.0f} output tokens/s")
    if args.timeline:
        print_table(summary(log), ["steps", "count", "tokens", "host_ms_median", "gpu_ms_sum",
                                   "gpu_ms_median", "idle_ms_before"], "steps by kind")
    else:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
