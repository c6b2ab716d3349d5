"""End-to-end benchmarks of the V2-Lite-shaped step (issue: end-to-end performance).

One run measures the ceilings, then: decode-step latency per mode next to its floor, the same
decode steps in HF transformers, prefill throughput eager vs piecewise, and `generate`
throughput. Floors count the bytes a step must move: attention and dense weights, router and
shared experts, the distinct routed experts that step's routing actually touched, the lm_head,
and the KV cache read; over the measured copy bandwidth (or FLOPs over the matmul rate). Each
decode row also gives the same bytes over the read-only bandwidth (`floor_read_ms`): the step
only reads its weights and cache, and a read stream is a little faster than a copy.
"""

import gc
import json
import math
import statistics
import time
from pathlib import Path

import torch

import mla_func as mf
from scripts import bench_args
from scripts.bench_common import (
    StateChain,
    cuda_time_ms,
    measure_ceilings,
    pipelined_ms,
    print_table,
)
from scripts.bench_decode import count_distinct_experts, decode_batch, step_floor
from scripts.bench_hf import bench_hf, bench_hf_compile


def bench_decode(params, chain: StateChain, ceil, args) -> list[dict]:
    from mla_func.compile_step import compile_step

    steps = {"eager": lambda s, b: mf.forward(params, s, b)}
    for mode in ("piecewise", "full"):
        t0 = time.perf_counter()
        steps[mode] = compile_step(params, chain.state, mode=mode, max_tokens=args.max_tokens,
                                   max_seqs=max(args.batches + [8]), max_pages=args.max_pages,
                                   backend=args.backend, progress=False)
        print(f"compiled {mode} in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for ctx in args.contexts:
        for bsz in args.batches:
            batch = decode_batch(chain.state, bsz, ctx, args.backend, seed=bsz * 7 + ctx,
                                 max_pages=args.max_pages)
            distinct = count_distinct_experts(params, chain, batch)
            row = {"ctx": ctx, "batch": bsz, **step_floor(params, distinct, bsz, ctx, ceil),
                   "distinct_experts": sum(distinct) / max(len(distinct), 1)}
            for mode, step in steps.items():
                row[f"{mode}_ms"] = cuda_time_ms(lambda f=step, b=batch: chain(f, b), reps=20)
            row["best_over_floor"] = min(row[f"{m}_ms"] for m in steps) / row["floor_ms"]
            # Full steps back to back (the host's work hidden behind the GPU's, as in
            # `generate`); the columns above sync after each step.
            row["full_pipelined_ms"] = pipelined_ms(lambda b=batch: chain(steps["full"], b))
            row["pipelined_over_floor"] = row["full_pipelined_ms"] / row["floor_ms"]
            if "floor_read_ms" in row:
                row["pipelined_over_read_floor"] = (row["full_pipelined_ms"]
                                                    / row["floor_read_ms"])
            rows.append(row)
            print(row, flush=True)
    return rows


def bench_prefill(params, chain: StateChain, args) -> list[dict]:
    from mla_func.compile_step import compile_step

    state = chain.state  # for its allocator and geometry; the steps run on chain's
    piecewise = compile_step(params, state, mode="piecewise", max_tokens=args.max_tokens,
                             max_seqs=max(args.batches + [8]), max_pages=args.max_pages,
                             backend=args.backend, progress=False)
    rows = []
    for n in args.prefill_tokens:
        alloc = state.allocator
        for seq in list(alloc.pages):
            alloc.release(seq)
        pages = alloc.reserve(0, n)
        toks = torch.randint(0, 100000, (n,)).tolist()
        batch = mf.make_batch([mf.SeqWork(toks, 0, pages)], state.page_size, args.max_pages,
                              device=state.cache.device, backend=args.backend)
        steps = {"eager": lambda b=batch: chain(lambda s, b: mf.forward(params, s, b), b),
                 "piecewise": lambda b=batch: chain(piecewise, b)}
        # Rounds in alternating order: a 4096-token step is GPU-bound, where eager and
        # piecewise differ by less than the drift of one timing after the other (clocks, heat).
        rounds: dict[str, list[float]] = {"eager": [], "piecewise": []}
        for r in range(args.prefill_rounds):
            for mode in (("eager", "piecewise") if r % 2 == 0 else ("piecewise", "eager")):
                rounds[mode].append(cuda_time_ms(steps[mode], reps=5))
        eager, piece = (statistics.median(rounds[m]) for m in ("eager", "piecewise"))
        # Which path the piecewise step takes: graphs up to its largest bucket, eager past it.
        path = piecewise.choose(piecewise._merge((state, batch)))[0]
        rows.append({"tokens": n, "piecewise_path": path, "eager_ms": eager,
                     "piecewise_ms": piece,
                     "eager_tok_s": n / eager * 1e3, "piecewise_tok_s": n / piece * 1e3,
                     "eager_rounds_ms": rounds["eager"],
                     "piecewise_rounds_ms": rounds["piecewise"]})
        print(rows[-1], flush=True)
    return rows


def generate_ctx(args) -> int:
    """The mean context of `generate`'s decode steps: prompt + new / 2."""
    return args.gen_prompt + args.gen_new // 2


def generate_floor(params, chain: StateChain, ceil, args) -> dict[str, float]:
    """The floor of one of `generate`'s decode steps: all `gen_requests` sequences at their mean
    context (`generate_ctx`), the distinct experts counted on one eager step of that batch
    (random tokens). Its ceiling is gen_requests tokens per floor."""
    ctx = generate_ctx(args)
    batch = decode_batch(chain.state, args.gen_requests, ctx, args.backend, seed=ctx,
                         max_pages=args.max_pages, vocab=params.cfg.vocab_size)
    distinct = count_distinct_experts(params, chain, batch)
    return {"ctx": ctx, **step_floor(params, distinct, args.gen_requests, ctx, ceil)}


def bench_generate(cfg, params, args, floor: dict[str, float]) -> dict:
    """Output tokens/s of `generate` over its step loop, beside the ceiling of `floor`
    (`generate_floor`)."""
    prompts = torch.randint(2, 100000, (args.gen_requests, args.gen_prompt)).tolist()
    kw = dict(max_new_tokens=args.gen_new, mode="full_and_piecewise",
              attention_backend=args.backend, eos_token_id=None, page_size=args.page_size,
              max_seqs=args.gen_requests, max_batch_tokens=args.gen_batch_tokens)
    # A warm-up call with the same prompts and 2 new tokens first: it runs the prefill and
    # decode shapes once, so Triton's first compiles (seconds on a machine with an empty
    # kernel cache: docs/DECISIONS.md, `bench_step.bench_generate` warm-up) land in
    # `warmup_s`, not in the timed loop.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    mf.generate(cfg, params, prompts, **{**kw, "max_new_tokens": 2})
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = mf.generate(cfg, params, prompts, **kw)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    new = sum(len(t) for t in out.tokens)
    # Throughput over the step loop; setup (cache allocation, graph capture) reported apart.
    res = {"requests": args.gen_requests, "prompt": args.gen_prompt, "new": args.gen_new,
           "steps": out.steps, "warmup_s": warm, "setup_s": out.setup_time_s,
           "loop_s": out.wall_time_s, "total_s": wall, "out_tok_s": new / out.wall_time_s}
    res["ceiling_out_tok_s"] = args.gen_requests / floor["floor_ms"] * 1e3
    return {**res, "floor_ctx": floor["ctx"], "floor_ms": floor["floor_ms"]}


def plot(rows: list[dict], path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["ctx"] for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(6 * len(contexts), 4.5), squeeze=False)
    for ax, ctx in zip(axes[0], contexts, strict=True):
        sub = [r for r in rows if r["ctx"] == ctx]
        xs = [r["batch"] for r in sub]
        for key, label, color in (("eager_ms", "eager", "C0"), ("piecewise_ms", "piecewise", "C1"),
                                  ("full_ms", "full", "C2"),
                                  ("full_pipelined_ms", "full, back to back", "C4"),
                                  ("hf_grouped_mm_ms", "HF grouped_mm", "C3"),
                                  ("floor_ms", "floor", "k")):
            ys = [r.get(key) for r in sub]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, marker="o", label=label, color=color,
                        linestyle="--" if key == "floor_ms" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("decode batch (sequences)")
        ax.set_ylabel("step latency (ms)")
        ax.set_title(f"V2-Lite decode step, context {ctx}, {gpu}")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("bench step needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceil = measure_ceilings()
    print("ceilings", ceil, flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    result: dict = {"gpu": gpu, "torch": torch.__version__, "ceilings": ceil}
    if "hf" in args.parts:
        result["hf"] = bench_hf(cfg, args)
    if "hfcompile" in args.parts:
        result["hf_compile"] = bench_hf_compile(cfg, args)
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    generate = "generate" in args.parts
    max_ctx = max(args.contexts + [max(args.prefill_tokens, default=0)]
                  + ([generate_ctx(args)] if generate else []))
    pages_per_seq = math.ceil((max_ctx + 1) / args.page_size)
    args.max_pages = pages_per_seq
    num_pages = max(args.batches + ([args.gen_requests] if generate else [])) \
        * pages_per_seq + 2
    state = mf.init_state(cfg, num_pages, args.page_size, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    chain = StateChain(state)  # each step consumes the state: the chain passes it on
    del state
    if "decode" in args.parts:
        rows = bench_decode(params, chain, ceil, args)
        for r in rows:
            hf = [h for h in result.get("hf", []) if h["batch"] == r["batch"]
                  and h["ctx"] == r["ctx"]]
            if hf:
                r["hf_grouped_mm_ms"] = hf[0]["hf_grouped_mm_ms"]
        result["decode"] = rows
        plot(rows, out / "decode_step.png", gpu)
    if "prefill" in args.parts:
        result["prefill"] = bench_prefill(params, chain, args)
    if generate:  # measured here: the engine below allocates its own cache
        gen_floor = generate_floor(params, chain, ceil, args)
    del chain
    gc.collect()
    torch.cuda.empty_cache()
    if generate:
        result["generate"] = bench_generate(cfg, params, args, gen_floor)
    (out / "bench_step.json").write_text(json.dumps(result, indent=1))
    summarize(result)
    return result


def summarize(result: dict) -> None:
    print(f"\nGPU {result['gpu']}, torch {result['torch']}, ceilings {result['ceilings']}")
    cols = ["ctx", "batch", "floor_ms", "eager_ms", "piecewise_ms", "full_ms",
            "full_pipelined_ms", "hf_grouped_mm_ms", "best_over_floor", "pipelined_over_floor",
            "floor_read_ms", "pipelined_over_read_floor", "distinct_experts"]
    print_table(result.get("decode", []), cols, "decode step (ms)")
    print_table(result.get("prefill", []), ["tokens", "eager_ms", "piecewise_ms",
                                            "piecewise_path", "eager_tok_s",
                                            "piecewise_tok_s"], "prefill")
    print_table(result.get("hf_compile", []), ["batch", "ctx", "hf_compile_ms", "compile_s"],
                "HF + torch.compile(reduce-overhead)")
    if result.get("generate"):
        print_table([result["generate"]], list(result["generate"]), "generate")


add_arguments = bench_args.step  # its options (bench.py reads them without torch)
