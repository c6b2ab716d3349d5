"""Where the host's time goes in an eager prefill step (twenty-ninth session, 2026-11-25).

Run 14 (`exp_eager.py`) found the host taking 58-66 ms to queue one eager V2-Lite prefill step
of 3072 or 3584 tokens and 36-39 ms at 4096-8192: more host work for fewer tokens. This
queues steps of each size under cProfile (after warm-up steps of that size; synced before and
after, so the time is the host's up to the step's return) and prints the functions that took
the most time, their own and with what they call.

    PYTHONPATH=. python3 exp_host.py [--tokens 3072 4096] [--steps 3]
"""

import argparse
import cProfile
import io
import math
import pstats
import time

import torch

import mla_func as mf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[3072, 4096])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    page = 64
    max_pages = math.ceil((max(args.tokens) + 1) / page)
    state = mf.init_state(cfg, max_pages + 2, page, device="cuda", dtype=torch.bfloat16)
    for n in args.tokens:
        alloc = state.allocator
        for seq in list(alloc.pages):
            alloc.release(seq)
        pages = alloc.reserve(0, n)
        toks = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        batch = mf.make_batch([mf.SeqWork(toks.tolist(), 0, pages)], page, max_pages,
                              device="cuda", backend="triton")
        for _ in range(3):
            mf.forward(params, state, batch)
        torch.cuda.synchronize()
        host = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            mf.forward(params, state, batch)
            host.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        print(f"\n{n} tokens: host ms to queue a step (no profiler): "
              + " ".join(f"{h:.1f}" for h in host))
        prof = cProfile.Profile()
        for _ in range(args.steps):
            prof.enable()
            mf.forward(params, state, batch)
            prof.disable()
            torch.cuda.synchronize()
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(22)
            text = out.getvalue()
            print(f"--- {n} tokens, by {key}, {args.steps} steps\n"
                  + text[text.index("ncalls"):].rstrip())


if __name__ == "__main__":
    main()
