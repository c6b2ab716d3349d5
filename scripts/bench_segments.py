"""Inductor segments against plain ones (GPU): `python -m scripts.bench segments [...]`.

One state, random bf16 weights, one `compile_step(mode="piecewise")` per segments kind
(`--segments`, default "plain,inductor": the traced segments as they are, and each compiled
by Inductor before capture): their capture seconds (Inductor's compilation included) and
graph-pool bytes; then per decode batch size (`--batches` sequences at `--ctx` cached tokens)
and per prefill length (`--prefill` tokens, one sequence) the piecewise step time of each kind
at the step's bucket (forced through `step.run`), in `--rounds` rounds whose order alternates
(the median kept), eager beside them, each kind's largest difference from eager, and
plain / inductor. Results go to docs/PERF.md by hand.

`run(args, device="cpu")` runs the same on the CPU with the capture emulated and host timing
(tests/test_bench_segments.py, the tiny preset).
"""

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

import mla_func as mf
from scripts import bench_args
from scripts.bench_capture import _batch
from scripts.bench_common import alternating, cuda_time_ms, print_table

add_args = bench_args.segments  # the options: scripts/bench_args.py


def _parse(args) -> argparse.Namespace:
    if isinstance(args, argparse.Namespace):
        return args
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_args(p)
    return p.parse_args(args or [])


def host_time_ms(fn: Callable[[], object], warmup: int = 1, reps: int = 3) -> float:
    """Median host milliseconds of `fn()` (the CPU run's timer)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run(args=None, device: str = "cuda") -> list[dict]:
    from mla_func.compile_step import compile_step

    a = _parse(args)
    kinds = [k for k in a.segments.split(",") if k]
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_segments needs a CUDA GPU; none is available")
    cuda = device == "cuda"
    timer = ((lambda fn: cuda_time_ms(fn, reps=a.reps)) if cuda
             else (lambda fn: host_time_ms(fn, reps=min(a.reps, 3))))
    cfg = mf.MLAConfig.preset(a.preset)
    dtype = torch.bfloat16 if cuda else torch.float32
    batches = [int(x) for x in a.batches.split(",") if x]
    prefill = [int(x) for x in a.prefill.split(",") if x]
    max_pages = math.ceil(max([a.ctx + 1] + prefill) / a.page_size)
    num_pages = max(batches) * math.ceil((a.ctx + 1) / a.page_size) + max_pages + 2
    params = mf.init_params(cfg, seed=0, device=device, dtype=dtype)
    state = mf.init_state(cfg, num_pages, a.page_size, device=device, dtype=dtype)
    steps, rows = {}, []
    for kind in kinds:
        t = time.perf_counter()
        steps[kind] = compile_step(params, state, mode="piecewise", max_tokens=a.max_tokens,
                                   max_seqs=max(batches), max_pages=max_pages,
                                   backend=a.backend, progress=False, emulate=not cuda,
                                   segments=kind)
        rep = steps[kind].report
        rows.append({"what": "capture", "segments": kind, "graphs": rep["graphs"],
                     "capture_s": time.perf_counter() - t,
                     "pool_gib": rep["graph_pool_bytes"] / 2**30})
    first = steps[kinds[0]]

    def timed(batch: mf.Batch) -> dict:
        # `run` forces the kind and leaves donation to its caller: one state, every call.
        full_args = first._merge((state, batch))
        chosen, size = first.choose(full_args)
        out: dict = {"dispatch": chosen, "bucket": size}
        ref = first.run("eager", 0, full_args)[0].float()
        cases = {"eager": lambda: first.run("eager", 0, full_args)}
        if chosen == "piecewise":
            cases.update({k: (lambda s=s: s.run("piecewise", size, full_args))
                          for k, s in steps.items()})
            for k, s in steps.items():
                got = s.run("piecewise", size, full_args)[0].float()
                out[f"{k}_max_diff"] = float((got - ref).abs().max())
        times: dict[str, list[float]] = {k: [] for k in cases}
        for order in alternating(list(cases), a.rounds):
            for k in order:
                times[k].append(timer(cases[k]))
        out.update({f"{k}_ms": statistics.median(v) for k, v in times.items()})
        if "plain_ms" in out and "inductor_ms" in out:
            out["inductor_speedup"] = out["plain_ms"] / out["inductor_ms"]
        return out

    for bsz in batches:
        batch = _batch(state, [(a.ctx, 1)] * bsz, max_pages, a.backend, cfg.vocab_size, device)
        rows.append({"what": "decode", "batch": bsz, "ctx": a.ctx, **timed(batch)})
    for n in prefill:
        batch = _batch(state, [(0, n)], max_pages, a.backend, cfg.vocab_size, device)
        rows.append({"what": "prefill", "tokens": n, **timed(batch)})
    captures = [r for r in rows if r["what"] == "capture"]
    print_table(captures, list(captures[0]), "capture, per segments kind")
    cols = ["what", "batch", "tokens", "dispatch", "bucket", "eager_ms",
            *(f"{k}_ms" for k in kinds), "inductor_speedup", *(f"{k}_max_diff" for k in kinds)]
    print_table(rows[len(captures):], cols,
                f"piecewise step time, {a.preset}, {a.backend} attention")
    return rows


def main(argv: list[str] | None = None) -> int:
    import json

    print(json.dumps(run(argv if argv is not None else sys.argv[1:]), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
