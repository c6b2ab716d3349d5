"""The shared experts' side stream in the eager prefill step past 2560 tokens (twenty-ninth
session, 2026-11-25).

Steps past 2560 tokens (`dims.TOKENS_MAX_CAPTURED`) run eagerly in every mode. In CUDA graphs
the side stream made the MoE layer faster at every size from 2560 tokens up (runs 6, 7, 13),
but it adds host work (a fork and a join a layer), and the eager layer is bound by the host
below ~4k tokens: run 13 (`exp_fork.py`) timed the layer eagerly 15% over its graph at 3072
tokens, 4% at 4096, and the stream 8.7% slower at 3072, 2.1% faster at 4096. This times the
whole eager prefill step (V2-Lite, random bf16 weights, one prompt of N tokens, `mf.forward`)
with the stream off and on in every table row past 2560 tokens, alternating rounds, ms a step
(synced after each; and 3 steps back to back), and the host's time to queue a step.

    PYTHONPATH=. python3 exp_eager.py [--tokens 3072 3584 4096 6144 8192] [--rounds 8]
"""

import argparse
import math
import statistics
import time
from dataclasses import replace

import torch

import mla_func as mf
from mla_func.kernels import moe_config
from scripts.bench_common import cuda_time_ms, pipelined_ms


def with_stream(configs, on: bool):
    """The table with `shared_stream` set to `on` in the rows past 2560 tokens."""
    return tuple((bound, replace(c, shared_stream=on) if bound > 2560 else c)
                 for bound, c in configs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[3072, 3584, 4096, 6144, 8192])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    page = 64
    max_pages = math.ceil((max(args.tokens) + 1) / page)
    state = mf.init_state(cfg, max_pages + 2, page, device="cuda", dtype=torch.bfloat16)
    table = moe_config.CONFIGS
    variants = {"stream off": with_stream(table, False), "stream on": with_stream(table, True)}
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
        same = torch.equal(logits["stream off"], logits["stream on"])
        print(f"\n{n} tokens: logits equal: {same}")
        names = list(variants)
        synced = {name: [] for name in names}
        b2b = {name: [] for name in names}
        host = {name: [] for name in names}
        step = lambda b=batch: mf.forward(params, state, b)  # noqa: E731
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                moe_config.CONFIGS = variants[name]
                synced[name].append(cuda_time_ms(step, reps=5))
                b2b[name].append(pipelined_ms(step, calls=3, reps=3))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                host[name].append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
        moe_config.CONFIGS = table
        base = statistics.median(synced["stream off"])
        base_b = statistics.median(b2b["stream off"])
        for name in names:
            s, b, h = (statistics.median(v[name]) for v in (synced, b2b, host))
            print(f"  {name:10s} synced {s:8.2f} ms {100 * (s / base - 1):+5.1f}%  back to back "
                  f"{b:8.2f} ms {100 * (b / base_b - 1):+5.1f}%  host {h:6.2f} ms  rounds "
                  + " ".join(f"{v:.1f}" for v in synced[name]))
            rows.append((n, name, s, 100 * (s / base - 1), min(synced[name]),
                         max(synced[name]), b, 100 * (b / base_b - 1), h))
    print("\n| tokens | variant | synced ms (rounds) | change | back to back ms | change | "
          "host ms to queue |")
    print("|---|---|---|---|---|---|---|")
    for n, name, s, c, lo, hi, b, cb, h in rows:
        print(f"| {n} | {name} | {s:.2f} ({lo:.2f}–{hi:.2f}) | {c:+.1f}% | {b:.2f} | {cb:+.1f}% "
              f"| {h:.2f} |")


if __name__ == "__main__":
    main()
