"""What the custom-op dispatcher costs an eager step on the host (2026-11-24, twenty-first
session; after run 111's cProfile put most of an eager prefill step's host time under
`custom_ops.backend_impl`). Eager `forward` on the same batches, alternating rounds:
- base: as the engine runs it (grad mode on; no tensor requires grad);
- nograd: under torch.no_grad();
- infer: under torch.inference_mode();
- bypass: every mla_func custom op replaced on `torch.ops.mla_func` by its Python function
  (`CustomOpDef._init_fn`): no dispatcher, the same kernels;
- bypass_infer: both.
Per variant: host ms of one call (synced before it) and the synced GPU span (CUDA events).
First a micro-benchmark: one small rmsnorm through the op and through its function.

    PYTHONPATH=. python3 exp_ops.py [--rounds 4]
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch._library.custom_ops as custom_ops

import mla_func as mf
from scripts.bench_step import decode_batch

VARIANTS = ("base", "nograd", "infer", "bypass", "bypass_infer")


def prefill_batch(state, prompts: int, prompt: int, decodes: int, ctx: int):
    alloc = state.allocator
    for seq in list(alloc.pages):
        alloc.release(seq)
    work = [mf.SeqWork([int(torch.randint(2, 100000, ()))], ctx, alloc.reserve(i, ctx + 1))
            for i in range(decodes)]
    for i in range(prompts):
        work.append(mf.SeqWork(torch.randint(2, 100000, (prompt,)).tolist(), 0,
                               alloc.reserve(decodes + i, prompt)))
    return mf.make_batch(work, state.page_size, 17, device="cuda", backend="triton")


@contextlib.contextmanager
def variant(name: str, ops: dict):
    ns = torch.ops.mla_func
    if name.startswith("bypass"):
        for short, opdef in ops.items():
            setattr(ns, short, opdef._init_fn)
    ctx = (torch.inference_mode() if name.endswith("infer")
           else torch.no_grad() if name == "nograd" else contextlib.nullcontext())
    try:
        with ctx:
            yield
    finally:
        for short in ops:
            if short in ns.__dict__:
                delattr(ns, short)  # the namespace looks the op up again


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


def micro(ops: dict) -> None:
    from mla_func.kernels.norm import rmsnorm

    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    calls = {"op": lambda: torch.ops.mla_func.rmsnorm(x, w, 1e-6),
             "function": lambda: rmsnorm._init_fn(x, w, 1e-6)}
    for name, fn in calls.items():
        for mode in ("grad", "nograd", "infer"):
            ctx = (torch.inference_mode() if mode == "infer" else torch.no_grad()
                   if mode == "nograd" else contextlib.nullcontext())
            with ctx:
                for _ in range(200):
                    fn()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(2000):
                    fn()
                host = (time.perf_counter() - t) / 2000 * 1e6
                torch.cuda.synchronize()
            print(f"micro rmsnorm [4 x 2048] through the {name}, {mode}: {host:.1f} us a call "
                  "(host)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, 1 + 160 * 17, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    batches = {
        "prefill 4x512": prefill_batch(state, 4, 512, 0, 600),
        "mixed 4x512+124": prefill_batch(state, 4, 512, 124, 600),
        "prefill 16x512": prefill_batch(state, 16, 512, 0, 600),
        "decode B=1 ctx1024": decode_batch(state, 1, 1024, "triton", seed=1, max_pages=17),
        "decode B=32 ctx1024": decode_batch(state, 32, 1024, "triton", seed=2, max_pages=17),
    }
    for b in batches.values():
        mf.forward(params, state, b)  # every op registered, every kernel compiled
    torch.cuda.synchronize()
    ops = {k.split("::")[1]: v for k, v in custom_ops.OPDEFS.items() if k.startswith("mla_func")}
    print("custom ops bypassed:", sorted(ops), flush=True)
    micro(ops)
    ref = {name: mf.forward(params, state, b)[0].float() for name, b in batches.items()}
    for name, b in batches.items():
        with variant("bypass_infer", ops):
            logits = mf.forward(params, state, b)[0].float()
        diff = (logits - ref[name]).abs().max().item()
        print(f"{name}: bypass_infer logits against base, max |diff| {diff:.3g}", flush=True)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for name, b in batches.items():
            for v in order:
                with variant(v, ops):
                    fn = lambda b=b: mf.forward(params, state, b)  # noqa: E731
                    fn()
                    results.setdefault((name, v), []).append(time_call(fn, args.reps))
    print("\nbatch | " + " | ".join(f"{v} host / GPU ms" for v in VARIANTS))
    for name in batches:
        cells = []
        for v in VARIANTS:
            rows = results[(name, v)]
            cells.append(f"{statistics.median(h for h, _ in rows):.2f} / "
                         f"{statistics.median(s for _, s in rows):.2f}")
        print(f"{name} | " + " | ".join(cells))
    print("\n(rounds: host ms of each)")
    for (name, v), rows in results.items():
        print(f"  {name} {v}: " + " ".join(f"{h:.1f}" for h, _ in rows))


if __name__ == "__main__":
    main()
