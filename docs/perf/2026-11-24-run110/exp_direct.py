"""Eager calls of the custom ops straight into their functions (`mla_func.custom_op.DIRECT`)
against through the dispatcher (2026-11-24, twenty-first session; after run 112's exp_ops.py).
One process, alternating rounds:
- eager `forward` on prefill, mixed and decode batches (each with its own pages): host ms of
  one call (synced before it) and the GPU span (CUDA events); logits compared to the bit;
- `generate`, 128 requests x (512 + 256), `full_and_piecewise`, max_batch_tokens 8192 (its
  eager prefill steps are the ones the change reaches): output tokens/s of the step loop, one
  engine for every round.

    PYTHONPATH=. python3 exp_direct.py [--rounds 4] [--gen-rounds 2]
"""

import argparse
import statistics
import time

import torch

import mla_func as mf
from mla_func import custom_op
from mla_func.engine import Engine

PAGE = 64
MAX_PAGES = 17


def batch_of(state, first_seq: int, prompts: int, prompt: int, decodes: int, ctx: int):
    alloc, work = state.allocator, []
    for i in range(decodes):
        work.append(mf.SeqWork([int(torch.randint(2, 100000, ()))], ctx,
                               alloc.reserve(first_seq + i, ctx + 1)))
    for i in range(prompts):
        work.append(mf.SeqWork(torch.randint(2, 100000, (prompt,)).tolist(), 0,
                               alloc.reserve(first_seq + decodes + i, prompt)))
    return mf.make_batch(work, PAGE, MAX_PAGES, device="cuda", backend="triton")


def time_call(fn, reps: int) -> tuple[float, float]:
    hosts, spans = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t = time.perf_counter()
        fn()
        hosts.append((time.perf_counter() - t) * 1e3)
        e1.record()
        e1.synchronize()
        spans.append(e0.elapsed_time(e1))
    return statistics.median(hosts), statistics.median(spans)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--gen-rounds", type=int, default=2)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    specs = {"prefill 4x512": (4, 0, 0), "mixed 4x512+124 (ctx 600)": (4, 124, 600),
             "prefill 16x512": (16, 0, 0), "decode B=1 ctx 1024": (0, 1, 1024),
             "decode B=32 ctx 1024": (0, 32, 1024), "decode B=128 ctx 1024": (0, 128, 1024)}
    seqs = sum(n + d for n, d, _ in specs.values())
    state = mf.init_state(cfg, 2 + seqs * MAX_PAGES, PAGE, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    batches, first = {}, 0
    for name, (n, d, ctx) in specs.items():
        batches[name] = batch_of(state, first, n, 512, d, ctx)
        first += n + d
    for name, b in batches.items():  # compiles, then the same logits either way
        outs = []
        for direct in (False, True):
            custom_op.DIRECT = direct
            outs.append(mf.forward(params, state, b)[0])
        print(f"{name}: logits equal either way: {torch.equal(*outs)}", flush=True)
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for name, b in batches.items():
            for direct in ((False, True) if r % 2 == 0 else (True, False)):
                custom_op.DIRECT = direct
                fn = lambda b=b, s=state: mf.forward(params, s, b)  # noqa: E731
                fn()
                results.setdefault((name, direct), []).append(time_call(fn, args.reps))
    print("\nbatch | dispatcher: host / GPU ms | direct: host / GPU ms")
    for name in batches:
        cells = []
        for direct in (False, True):
            rows = results[(name, direct)]
            cells.append(f"{statistics.median(h for h, _ in rows):.2f} / "
                         f"{statistics.median(s for _, s in rows):.2f}")
        print(f"{name} | " + " | ".join(cells))
    for (name, direct), rows in results.items():
        print(f"  {name} {'direct' if direct else 'dispatcher'}: host "
              + " ".join(f"{h:.1f}" for h, _ in rows) + ", GPU "
              + " ".join(f"{s:.1f}" for _, s in rows))
    del state
    torch.cuda.empty_cache()
    if not args.gen_rounds:
        return
    requests, prompt, new = 128, 512, 256
    prompts = torch.randint(2, 100000, (requests, prompt)).tolist()
    t = time.perf_counter()
    engine = Engine(cfg, params, num_pages=1 + requests * -(-(prompt + new - 1) // PAGE),
                    mode="full_and_piecewise", attention_backend="triton", page_size=PAGE,
                    max_batch_tokens=8192, max_seqs=requests, max_seq_len=prompt + new - 1,
                    eos_token_id=None, progress=False)
    print(f"\nengine built in {time.perf_counter() - t:.1f} s", flush=True)

    def run(n_new: int) -> float:
        for ids in prompts:
            engine.submit(ids, n_new)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.run(progress=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(2)  # first compiles
    for r in range(args.gen_rounds):
        for direct in ((False, True) if r % 2 == 0 else (True, False)):
            custom_op.DIRECT = direct
            wall = run(new)
            print(f"generate round {r}, {'direct' if direct else 'dispatcher'}: "
                  f"{wall * 1e3:.0f} ms, {requests * new / wall:.0f} output tok/s", flush=True)
    custom_op.DIRECT = True


if __name__ == "__main__":
    main()
