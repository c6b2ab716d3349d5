"""Where `generate`'s time goes (2026-11-24, twenty-first session). The bench's workload (128
requests x (512 prompt + 256 new), `full_and_piecewise`) run by an `Engine` whose step function
is wrapped: per step, its token / sequence / decode counts, the path the compiled step takes
(full, piecewise, eager), the host time of the call, and CUDA events around it (no sync), so
that after the run each step's GPU time and the GPU's idle time between steps are known.
Then (`--census`) a kernel census of one eager prefill step per size, after every timing
(a profiler window slows later launches in the same process).

    PYTHONPATH=. python3 exp_gen.py [--batch-tokens 8192 2048] [--census 2048 8192]
"""

import argparse
import gc
import statistics
import time

import torch

import mla_func as mf
from mla_func.engine import Engine


def wrap(engine: Engine, log: list[dict]) -> None:
    inner = engine._step_fn
    cuda = engine.params.device.type == "cuda"

    def timed(state, batch):
        kind = (inner.choose(inner._merge((state, batch)))[0] if hasattr(inner, "choose")
                else "eager")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
        if cuda:
            ev[0].record()
        t = time.perf_counter()
        out = inner(state, batch)
        host = time.perf_counter() - t
        if cuda:
            ev[1].record()
        log.append({"tokens": batch.num_tokens, "seqs": batch.num_seqs,
                    "decodes": batch.num_decodes, "kind": kind, "host_ms": host * 1e3,
                    "t": time.perf_counter(), "ev": ev})
        return out

    engine._step_fn = timed


def category(row: dict) -> str:
    if row["decodes"] == row["seqs"]:
        return f"decode/{row['kind']}"
    if row["decodes"] == 0:
        return f"prefill/{row['kind']}"
    return f"mixed/{row['kind']}"


def run_generate(cfg, params, args, batch_tokens: int) -> None:
    prompts = torch.randint(2, min(100000, cfg.vocab_size), (args.requests, args.prompt)).tolist()
    pages = -(-(args.prompt + args.new - 1) // args.page_size)
    eng_kw = dict(num_pages=1 + args.requests * pages, mode=args.mode,
                  attention_backend=args.backend, page_size=args.page_size,
                  max_batch_tokens=batch_tokens, max_seqs=args.requests,
                  max_seq_len=args.prompt + args.new - 1, eos_token_id=None, progress=False)
    t0 = time.perf_counter()
    engine = Engine(cfg, params, **eng_kw)
    print(f"# batch_tokens {batch_tokens}: engine built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    for new in (2, args.new):  # the first: Triton's first compiles, untimed
        for p in prompts:
            engine.submit(p, new)
        log: list[dict] = []
        if new == args.new:
            wrap(engine, log)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.run(progress=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    out_tokens = args.requests * args.new
    print(f"loop {wall * 1e3:.1f} ms, {len(log)} steps, {out_tokens / wall:.0f} output tok/s")
    if log and log[0]["ev"] is not None:
        for i, row in enumerate(log):
            row["gpu_ms"] = row["ev"][0].elapsed_time(row["ev"][1])
            row["gap_ms"] = (log[i - 1]["ev"][1].elapsed_time(row["ev"][0]) if i else 0.0)
    cats: dict[str, list[dict]] = {}
    for row in log:
        cats.setdefault(category(row), []).append(row)
    print("category | steps | tokens | host ms (median) | GPU ms (sum) | GPU ms (median) "
          "| gap before (sum ms)")
    for name, rows in sorted(cats.items()):
        gpu = [r.get("gpu_ms", float("nan")) for r in rows]
        print(f"{name} | {len(rows)} | {sum(r['tokens'] for r in rows)} | "
              f"{statistics.median(r['host_ms'] for r in rows):.2f} | {sum(gpu):.1f} | "
              f"{statistics.median(gpu):.2f} | {sum(r.get('gap_ms', 0.0) for r in rows):.1f}")
    print("steps (index: tokens seqs decodes kind host_ms gpu_ms gap_ms), the first 40 and "
          "every 16th after:")
    for i, row in enumerate(log):
        if i < 40 or i % 16 == 0 or i == len(log) - 1:
            print(f"  {i}: {row['tokens']} {row['seqs']} {row['decodes']} {row['kind']} "
                  f"{row['host_ms']:.2f} {row.get('gpu_ms', float('nan')):.2f} "
                  f"{row.get('gap_ms', float('nan')):.2f}")
    del engine


def census(cfg, params, args) -> None:
    from torch.profiler import ProfilerActivity, profile

    from scripts.bench_common import cuda_time_ms

    state = mf.init_state(cfg, 1 + args.requests * 9, args.page_size, device="cuda",
                          dtype=torch.bfloat16)
    for n in args.census:
        alloc = state.allocator
        for seq in list(alloc.pages):
            alloc.release(seq)
        work = []
        for i in range(n // args.prompt):
            toks = torch.randint(2, 100000, (args.prompt,)).tolist()
            work.append(mf.SeqWork(toks, 0, alloc.reserve(i, args.prompt)))
        batch = mf.make_batch(work, state.page_size, 9, device="cuda", backend=args.backend)
        fn = lambda b=batch: mf.forward(params, state, b)  # noqa: E731
        ms = cuda_time_ms(fn, reps=5)
        hosts = []
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            hosts.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        print(f"\n## eager prefill, {n // args.prompt} x {args.prompt} tokens: {ms:.2f} ms "
              f"synced, host in forward {statistics.median(hosts):.2f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        rows: dict[str, list[float]] = {}
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                r = rows.setdefault(evt.name[:90], [0, 0.0])
                r[0] += 1
                r[1] += evt.device_time
        total = sum(v[1] for v in rows.values())
        print(f"{sum(v[0] for v in rows.values())} kernels, {total / 1e3:.2f} ms of kernel time")
        for name, (count, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:args.top]:
            print(f"  {us / 1e3:8.3f} ms {count:5d}  {name}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--batch-tokens", type=int, nargs="+", default=[8192, 2048])
    p.add_argument("--census", type=int, nargs="*", default=[2048, 8192])
    p.add_argument("--mode", default="full_and_piecewise")
    p.add_argument("--backend", default="triton")
    p.add_argument("--top", type=int, default=18)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset(args.preset)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    params = mf.init_params(cfg, seed=0, device=device, dtype=dtype)
    for bt in args.batch_tokens:
        run_generate(cfg, params, args, bt)
        gc.collect()  # the engine's graphs and cache go before the next one is built
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.census and device == "cuda":
        census(cfg, params, args)


if __name__ == "__main__":
    main()
