"""Where a prefill step's host time goes (2026-11-24, twenty-first session; after run 110's
`exp_gen.py`: eager prefill steps held the host 75-106 ms against 24-74 ms of kernels, and
piecewise mixed steps of 2048 tokens 31-53 ms, pure prefill 20 ms). cProfile over a few calls
of each step (after warm-up), top functions by own time and by cumulative time.

    PYTHONPATH=. python3 exp_hostprof.py [--prompts 4 16] [--decodes 124] [--piecewise]
"""

import argparse
import cProfile
import io
import pstats
import time

import torch

import mla_func as mf

VOCAB = 100000


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def batch_of(state, prompts: int, prompt: int, decodes: int, ctx: int, backend: str):
    alloc = state.allocator
    for seq in list(alloc.pages):
        alloc.release(seq)
    work = []
    for i in range(decodes):  # decodes first, as make_batch requires
        work.append(mf.SeqWork([int(torch.randint(2, VOCAB, ()))], ctx,
                               alloc.reserve(i, ctx + 1)))
    for i in range(prompts):
        toks = torch.randint(2, VOCAB, (prompt,)).tolist()
        work.append(mf.SeqWork(toks, 0, alloc.reserve(decodes + i, prompt)))
    return mf.make_batch(work, state.page_size, 16, device=state.cache.device, backend=backend)


def prof(name: str, fn, calls: int, top: int) -> None:
    for _ in range(2):
        fn()
    sync()
    hosts = []
    for _ in range(calls):
        sync()
        t = time.perf_counter()
        fn()
        hosts.append((time.perf_counter() - t) * 1e3)
    sync()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    sync()
    pr.disable()
    print(f"\n## {name}: host ms a call {sorted(hosts)} (without the profiler)", flush=True)
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(top)
        lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
        start = next(i for i, ln in enumerate(lines) if "ncalls" in ln)
        print(f"### by {key} ({calls} calls)")
        print("\n".join(lines[start:start + top + 1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, nargs="+", default=[4, 16])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decodes", type=int, default=124)
    p.add_argument("--ctx", type=int, default=600)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--piecewise", action="store_true")
    p.add_argument("--backend", default="triton")
    p.add_argument("--preset", default="v2-lite")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a check of this script
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda":
        print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset(args.preset)
    global VOCAB
    VOCAB = min(VOCAB, cfg.vocab_size)
    params = mf.init_params(cfg, seed=0, device=device, dtype=dtype)
    state = mf.init_state(cfg, 1 + 16 * 160, 64, device=device, dtype=dtype)
    state.cache.normal_()
    step = None
    if args.piecewise:
        from mla_func.compile_step import compile_step

        t = time.perf_counter()
        step = compile_step(params, state, mode="piecewise", max_seqs=128, max_pages=16,
                            backend=args.backend, progress=False)
        print(f"piecewise compiled in {time.perf_counter() - t:.1f} s", flush=True)
    for n in args.prompts:
        for decodes in sorted({0, args.decodes}):
            batch = batch_of(state, n, args.prompt, decodes, args.ctx, args.backend)
            label = f"{n} x {args.prompt} prompt tokens + {decodes} decodes"
            prof(f"eager, {label}", lambda b=batch: mf.forward(params, state, b), args.calls,
                 args.top)
            if step is not None and batch.num_tokens <= 2560:
                prof(f"piecewise, {label}", lambda b=batch: step(state, b), args.calls,
                     args.top)


if __name__ == "__main__":
    main()
