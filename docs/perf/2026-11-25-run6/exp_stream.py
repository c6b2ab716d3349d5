"""The shared experts on a side stream (`MoEConfig.shared_stream`) past 2048 tokens, in the
whole prefill step (twenty-eighth session, 2026-11-25).

The table runs the shared experts on a side stream from 513 to 2048 tokens only: on
2026-11-23 the piecewise prefill step at 4096 tokens was slower with it (docs/perf/
2026-11-23-h100-run5, run6), though the layer alone was faster. Run 6 of 2026-11-25 timed the
layer alone again on today's kernels (`exp_mid.py`): 5.8% faster with it at 3072 tokens, 2.8%
at 4096 (rounds overlapping). This times what a prefill step makes of it: V2-Lite, random
bf16 weights, one prompt of N tokens, `mf.forward` (eager: steps past 2560 tokens run the
eager path in every mode), the table against the table with `shared_stream` flipped in its
rows past 2048 tokens (on before the table took it there, off after), alternating rounds, ms a
step (synced after each), and the logits of the two.

    PYTHONPATH=. python3 exp_stream.py [--tokens 3072 4096 8192] [--rounds 6]
"""

import argparse
import math
import statistics
from dataclasses import replace

import torch

import mla_func as mf
from mla_func.kernels import moe_config
from scripts.bench_common import cuda_time_ms


def flipped(configs):
    """The table with `shared_stream` flipped in the rows past 2048 tokens."""
    return tuple((bound, replace(c, shared_stream=not c.shared_stream) if bound > 2048 else c)
                 for bound, c in configs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[3072, 4096, 8192])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    page = 64
    max_pages = math.ceil((max(args.tokens) + 1) / page)
    state = mf.init_state(cfg, max_pages + 2, page, device="cuda", dtype=torch.bfloat16)
    table = moe_config.CONFIGS
    other = f"shared_stream {not table[-1][1].shared_stream} past 2048"
    variants = {"table": table, other: flipped(table)}
    rows = []
    for n in args.tokens:
        alloc = state.allocator
        for seq in list(alloc.pages):
            alloc.release(seq)
        pages = alloc.reserve(0, n)
        toks = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        batch = mf.make_batch([mf.SeqWork(toks.tolist(), 0, pages)], page, max_pages,
                              device="cuda", backend="triton")
        logits = {}
        for name, configs in variants.items():
            moe_config.CONFIGS = configs
            logits[name] = mf.forward(params, state, batch)[0].float()
        moe_config.CONFIGS = table
        d = (logits["table"] - logits[other]).abs().max().item()
        same = torch.equal(logits["table"], logits[other])
        print(f"\n{n} tokens: {moe_config.pick_config(n)}\n  logits equal: {same} "
              f"(max |d| {d:.3g})")
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                moe_config.CONFIGS = variants[name]
                times[name].append(cuda_time_ms(lambda b=batch: mf.forward(params, state, b),
                                                reps=5))
        moe_config.CONFIGS = table
        base = statistics.median(times["table"])
        for name in names:
            ms = statistics.median(times[name])
            print(f"  {name:24s} {ms:8.2f} ms {100 * (ms / base - 1):+5.1f}%  rounds "
                  + " ".join(f"{v:.2f}" for v in times[name]))
            rows.append((n, name, ms, 100 * (ms / base - 1), min(times[name]),
                         max(times[name])))
    print("\n| tokens | variant | ms (rounds) | change |")
    print("|---|---|---|---|")
    for n, name, ms, change, lo, hi in rows:
        print(f"| {n} | {name} | {ms:.2f} ({lo:.2f}–{hi:.2f}) | {change:+.1f}% |")


if __name__ == "__main__":
    main()
