"""Capture benchmark (GPU): `python -m scripts.bench capture [--preset v2-lite] ...`.

One `compile_step(mode="full_and_piecewise")` on random bf16 weights: capture seconds, graph-pool
bytes and graph count (targets: <= 30 s, <= 1.5 GiB for V2-Lite's default buckets); then per
decode batch size the step time eager / piecewise / full, and per prefill length eager /
piecewise (the same compiled step, each kind forced through `step.run`). Results go to
docs/PERF.md by hand.
"""

import argparse
import math
import sys
from typing import TYPE_CHECKING

from scripts import bench_args

if TYPE_CHECKING:  # imported once the command line is read (`--help` at once)
    import mla_func as mf


add_args = bench_args.capture  # its options (bench.py reads them without torch)


def _parse(args) -> argparse.Namespace:
    if isinstance(args, argparse.Namespace):
        return args
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_args(p)
    return p.parse_args(args or [])


def _batch(state: "mf.KVState", lengths: list[tuple[int, int]], max_pages: int, backend: str,
           vocab: int, device: str = "cuda") -> "mf.Batch":
    """(cached, new) tokens per sequence; pages from a fresh allocation."""
    import torch

    import mla_func as mf

    alloc = state.allocator
    for seq in list(alloc.pages):
        alloc.release(seq)
    g = torch.Generator().manual_seed(0)
    work = []
    for i, (cached, new) in enumerate(lengths):
        pages = alloc.reserve(i, cached + new)
        work.append(mf.SeqWork(torch.randint(vocab, (new,), generator=g).tolist(), cached,
                               pages))
    return mf.make_batch(work, state.page_size, max_pages, device=device, backend=backend)


def run(args=None) -> list[dict]:
    a = _parse(args)
    import torch

    import mla_func as mf
    from mla_func.capture.buckets import pad_to
    from mla_func.capture.plan import leaves_of
    from mla_func.compile_step import compile_step
    from scripts.bench_common import cuda_time_ms, print_table

    cfg = mf.MLAConfig.preset(a.preset)
    batches = [int(x) for x in a.batches.split(",") if x]
    prefill = [int(x) for x in a.prefill.split(",") if x]
    longest = max([a.ctx + 1] + prefill)
    max_pages = math.ceil(longest / a.page_size)
    num_pages = max(batches) * math.ceil((a.ctx + 1) / a.page_size) + max_pages + 2
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, num_pages, a.page_size, device="cuda", dtype=torch.bfloat16)
    step = compile_step(params, state, mode="full_and_piecewise", max_tokens=a.max_tokens,
                        max_seqs=a.max_seqs, max_pages=max_pages, backend=a.backend)
    rep = step.report
    rows: list[dict] = [{
        "what": "capture", "preset": a.preset, "backend": a.backend, "mode": rep["mode"],
        "graphs": rep["graphs"], "capture_s": rep["capture_seconds"],
        "pool_gib": rep["graph_pool_bytes"] / 2**30,
        "static_buffers_mib": rep["static_buffer_bytes"] / 2**20, "downgrade": rep["downgrade"],
    }]

    def timed(batch: "mf.Batch", kinds: list[str]) -> dict:
        full_args = step._merge((state, batch))
        chosen, size = step.choose(full_args)
        out = {"dispatch": chosen, "bucket": size}
        eager_ms = cuda_time_ms(lambda: step.run("eager", 0, full_args), reps=a.reps)
        out["eager_ms"] = eager_ms
        ref = step.run("eager", 0, full_args)[0].float()
        n = max(step.plan.signature.dynamic_sizes(leaves_of(step.plan, full_args)).values())
        for kind in kinds:
            b = pad_to(n, step.plan.buckets[kind])
            table = step.full if kind == "full" else step.piecewise
            if b not in table:
                continue
            ms = cuda_time_ms(lambda k=kind, s=b: step.run(k, s, full_args), reps=a.reps)
            got = step.run(kind, b, full_args)[0].float()
            out[f"{kind}_ms"] = ms
            out[f"{kind}_speedup"] = eager_ms / ms
            out[f"{kind}_max_diff"] = float((got - ref).abs().max())
        return out

    for bsz in batches:
        batch = _batch(state, [(a.ctx, 1)] * bsz, max_pages, a.backend, cfg.vocab_size)
        rows.append({"what": "decode", "batch": bsz, "ctx": a.ctx,
                     **timed(batch, ["piecewise", "full"])})
    for n in prefill:
        batch = _batch(state, [(0, n)], max_pages, a.backend, cfg.vocab_size)
        rows.append({"what": "prefill", "tokens": n, **timed(batch, ["piecewise"])})
    print_table(rows[:1], list(rows[0]), "capture")
    cols = ["what", "batch", "tokens", "bucket", "eager_ms", "piecewise_ms", "piecewise_speedup",
            "full_ms", "full_speedup", "piecewise_max_diff", "full_max_diff"]
    print_table(rows[1:], cols, f"step time, {a.preset}, {a.backend} attention")
    return rows


def main(argv: list[str] | None = None) -> int:
    import json

    print(json.dumps(run(argv if argv is not None else sys.argv[1:]), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
