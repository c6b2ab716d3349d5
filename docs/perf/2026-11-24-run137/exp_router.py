"""The fused router alone (`kernels/router.py`), 2026-11-24, twenty-fourth session: the router
in the weights' dtype (bf16, one bf16 product a dot step: the tree) against the float32 router
the params kept before (two TF32 products), and the bf16 form at deeper hidden steps
(`_BLOCK_H_HALF` 64 / 128, through the cost model). One process, CUDA graphs of 20 launches,
alternating rounds, us a launch; the chosen experts are compared with the tree's:

    PYTHONPATH=. python3 exp_router.py [--tokens 1 8 32 128 512 4096 8192] [--rounds 6]
"""

import argparse
import statistics

import torch

from mla_func.kernels import router as fused
from scripts.bench_common import cuda_time_ms

VARIANTS = {"bf16 (tree)": (torch.bfloat16, 32), "fp32 (before)": (torch.float32, 32),
            "bf16 h64": (torch.bfloat16, 64), "bf16 h128": (torch.bfloat16, 128)}


def call(x, router):
    return fused._launch(x, router, None, 6, 1, 1, "greedy", False, 1.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128, 512, 4096, 8192])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    g = torch.Generator(device="cuda").manual_seed(0)
    router = (torch.randn(64, 2048, device="cuda", generator=g) * 2048**-0.5).bfloat16()
    for tokens in args.tokens:
        x = torch.randn(tokens, 2048, device="cuda", generator=g).bfloat16()
        graphs, times, ref = {}, {}, None
        for name, (dtype, block_h) in VARIANTS.items():
            fused._BLOCK_H_HALF = block_h
            fused.launch_config.cache_clear()
            r = router.to(dtype)
            w, ids = call(x, r)
            ref = ref or (w, ids)
            same = torch.equal(ids.sort(1).values, ref[1].sort(1).values)
            cfg = fused.launch_config(tokens, 64, 2048, 1, dtype == torch.bfloat16)
            print(f"  {tokens} tokens {name}: ids equal to the tree's {same}, weights max diff "
                  f"{(w - ref[0]).abs().max().item():.3g}, {cfg}", flush=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(20):
                    call(x, r)
            graphs[name], times[name] = graph, []
        fused._BLOCK_H_HALF = 32
        fused.launch_config.cache_clear()
        for i in range(args.rounds):
            for name in (list(graphs) if i % 2 == 0 else list(graphs)[::-1]):
                times[name].append(cuda_time_ms(graphs[name].replay, reps=20) * 1000 / 20)
        print(f"router alone, {tokens} tokens, us a launch, median (rounds)")
        for name in graphs:
            print(f"  {name:14s} {statistics.median(times[name]):7.2f} "
                  f"({min(times[name]):.2f}-{max(times[name]):.2f})", flush=True)


if __name__ == "__main__":
    main()
