"""Where the time of `generate` goes: each step's GPU time by kind, or cProfile of the loop.

    python -m scripts.profile_generate [--requests 128] [--prompt 512] [--new 256] [--timeline]
    torchrun --nproc-per-node N -m scripts.profile_generate --tp N [--timeline]

Builds the engine (cache, graph capture) and runs the workload once with 2 new tokens (1 with
`--new 1`; first compiles) outside the measurement. `--timeline` (the method of docs/PERF.md's
generate table) wraps the engine's step function: per step its token, sequence and decode
counts, the path the compiled step takes (full, piecewise, eager), the host time of the call and
CUDA events around it (no sync), then prints, per kind of step (decode / prefill / mixed, by
path), the steps, tokens, host ms and GPU ms, and the GPU's idle time before them. Without it,
cProfile over `Engine.run`: the functions with the most own time (a CUDA sync inside a function,
such as the argmax's `.tolist()`, shows up as that function's time). `--tp N` (under torchrun)
runs this rank's share of the random weights (`parallel.shard.random_shard`) on a
tensor-parallel group, every rank the same requests; rank 0 prints its own steps. `--preset tiny
--device cpu --mode eager` runs on a CPU (host times only); the graph modes and `--device cuda`
need a CUDA GPU.
"""

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scripts.cli import MODES, PRESET_NAMES, check_ranks, cli_words, device_name, int_at_least

if TYPE_CHECKING:  # imported after the command line is read (`--help` at once)
    import mla_func as mf


def kind_of(row: dict[str, Any]) -> str:
    if row["decodes"] == row["seqs"]:
        work = "decode"
    else:
        work = "prefill" if row["decodes"] == 0 else "prefill + decodes"
    return f"{work}, {row['path']}"


def timed_steps(step: Callable[..., Any], log: list[dict[str, Any]]) -> Callable[..., Any]:
    """`step` recording each call in `log` (CUDA events only on CUDA: nothing syncs)."""
    import torch

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


_positive = int_at_least(1)
RENAME = {"attention_backend": "backend"}  # package argument -> this script's option


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="v2-lite", choices=PRESET_NAMES)
    p.add_argument("--device", default="cuda", type=device_name)
    p.add_argument("--mode", default="full_and_piecewise", choices=MODES)
    p.add_argument("--backend", default=None, choices=("torch", "triton"),
                   help="default: triton on CUDA, else torch")
    p.add_argument("--requests", type=_positive, default=128)
    p.add_argument("--prompt", type=_positive, default=512)
    p.add_argument("--new", type=_positive, default=256)
    p.add_argument("--page-size", type=_positive, default=64)
    p.add_argument("--max-batch-tokens", type=_positive, default=None,
                   help="tokens per step (default: the engine's, 8192 a rank: "
                        "engine.default_batch_tokens)")
    p.add_argument("--tp", type=_positive, default=1,
                   help="ranks of a tensor-parallel group: torchrun --nproc-per-node N -m "
                        "scripts.profile_generate --tp N (rank 0 prints)")
    p.add_argument("--max-seq-len", type=_positive, default=None,
                   help="the engine's (page-table width); default prompt + new - 1, as "
                        "generate() sizes it")
    p.add_argument("--timeline", action="store_true", help="each step's GPU time by kind")
    p.add_argument("--top", type=_positive, default=25)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    need = args.prompt + args.new - 1  # the last new token is never written to the cache
    if args.max_seq_len is not None and args.max_seq_len < need:
        p.error(f"argument --max-seq-len: {args.max_seq_len} is less than --prompt + --new - 1 "
                f"= {need}, the cache positions of each request")
    check_ranks(p, args.tp, "-m scripts.profile_generate")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import mla_func as mf
    from scripts.generate import check_memory

    cuda = torch.device(args.device).type == "cuda"
    needs = [f"--{k} {v}" for k, v, yes in (("device", args.device, cuda),
                                            ("mode", args.mode, args.mode != "eager")) if yes]
    if needs and not torch.cuda.is_available():  # before any work
        raise SystemExit(f"profile_generate: {' and '.join(needs)} need{'s' * (len(needs) == 1)} "
                         "a CUDA GPU; none is available (on a CPU: --preset tiny --device cpu "
                         "--mode eager)")
    tp = None
    if args.tp > 1:
        from mla_func.parallel.group import init_from_env

        tp, device = init_from_env(torch.device(args.device).type)
        args.device = str(device)
    try:  # the package's input errors (sizes, backend, prompt too long) are ValueErrors
        cfg = mf.MLAConfig.preset(args.preset)
        dtype = torch.bfloat16 if cuda else torch.float32
        check_memory(cfg, dtype, args.device, tp)
        if tp is None:
            params = mf.init_params(cfg, seed=0, device=args.device, dtype=dtype)
        else:  # this rank's share only, drawn a layer at a time
            from mla_func.parallel.shard import random_shard

            params = random_shard(cfg, tp, 0, args.device, dtype, "bf16")
        need = -(-(args.prompt + args.new) // args.page_size)
        engine = mf.Engine(cfg, params, num_pages=args.requests * need + 2, mode=args.mode,
                           attention_backend=args.backend or ("triton" if cuda else "torch"),
                           page_size=args.page_size, max_batch_tokens=args.max_batch_tokens,
                           max_seqs=args.requests, eos_token_id=None, progress=False,
                           max_seq_len=args.max_seq_len or args.prompt + args.new - 1)
        measure(engine, cfg, args, cuda, tp is None or tp.rank == 0)
    except ValueError as err:
        where = f"rank {tp.rank}: " if tp is not None else ""  # every rank's error is shown
        print(f"error: {where}{cli_words(str(err), parser(), RENAME)}", file=sys.stderr)
        return 2
    if tp is not None:
        from mla_func.parallel.group import finish

        finish(tp)
    return 0


def measure(engine: "mf.Engine", cfg: "mf.MLAConfig", args: argparse.Namespace,
            cuda: bool, main: bool = True) -> None:
    """A warm-up run of the workload, then the measured one; prints what it found (`main`:
    this process prints; the ranks of a group but one stay quiet)."""
    import torch

    from scripts.bench_common import print_table

    # The same prompts in every process: the ranks of a group must schedule alike.
    prompts = torch.randint(2, cfg.vocab_size, (args.requests, args.prompt),
                            generator=torch.Generator().manual_seed(0)).tolist()

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

    # First compiles (seconds with an empty kernel cache) stay out of the measurement: 2 new
    # tokens compile the prefill and the decode step; with --new 1 the engine holds no decode
    # position (it is sized for prompt + new - 1) and the measured run has no decode either.
    run(min(2, args.new))
    steps_before = engine.steps
    log: list[dict[str, Any]] = []
    prof = None if args.timeline else cProfile.Profile()
    if args.timeline:
        engine._step_fn = timed_steps(engine._step_fn, log)
    wall = run(args.new, prof)
    if not main:
        return
    how = "" if args.timeline else " (under cProfile)"
    print(f"{engine.steps - steps_before} steps, loop {wall * 1e3:.1f} ms{how}, "
          f"{args.requests * args.new / wall:.0f} output tokens/s")
    if args.timeline:
        print_table(summary(log), ["steps", "count", "tokens", "host_ms_median", "gpu_ms_sum",
                                   "gpu_ms_median", "idle_ms_before"], "steps by kind")
    else:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
