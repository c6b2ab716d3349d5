"""Decode-size projections (GPU): the skinny Triton GEMM vs cuBLAS, next to the weight floor.

    python -m scripts.bench_linear [--tokens 1 8 32 64]

Shapes are V2-Lite's (N, K); each case is timed as a CUDA-graph replay over 8 distinct weight
copies (so the weights are not L2-resident), median of 50 replays; floor = weight bytes / copy
bandwidth measured in the same run.
"""

import argparse

import torch
import torch.nn.functional as F

from mla_func.kernels.skinny_gemm import skinny_linear
from scripts.bench_common import graph_time_ms, measure_ceilings, print_table

SHAPES = {"q_proj": (3072, 2048), "kv_a_proj": (576, 2048), "o_proj": (2048, 2048),
          "shared_gate_up": (5632, 2048), "shared_down": (2048, 2816),
          "dense_gate_up": (21888, 2048), "dense_down": (2048, 10944), "lm_head": (102400, 2048)}
COPIES = 8


def run(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 64])
    args = p.parse_args(argv)
    ceil = measure_ceilings()
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = 1 if n * k > 50_000_000 else COPIES
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
              for _ in range(copies)]
        for m in args.tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.double(), ws[0].double())
            got = skinny_linear(x, ws[0]).double()
            err = float((got - ref).norm() / ref.norm())
            t_cublas = graph_time_ms(lambda x=x, ws=ws: [F.linear(x, w) for w in ws]) / copies
            t_skinny = graph_time_ms(
                lambda x=x, ws=ws: [skinny_linear(x, w) for w in ws]) / copies
            floor = n * k * 2 / (ceil["copy_gbs"] * 1e9) * 1e3
            rows.append({"proj": name, "n": n, "k": k, "tokens": m, "floor_us": floor * 1e3,
                         "cublas_us": t_cublas * 1e3, "skinny_us": t_skinny * 1e3,
                         "cublas_x": t_cublas / floor, "skinny_x": t_skinny / floor,
                         "rel_err": err})
    print_table(rows, list(rows[0]), f"skinny GEMM vs cuBLAS ({torch.cuda.get_device_name()}, "
                f"copy {ceil['copy_gbs']:.0f} GB/s)")
    return rows


if __name__ == "__main__":
    run()
