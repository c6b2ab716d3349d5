"""MoE layer (fused router + Triton experts, shared experts apart: the model's path from 513
tokens) with whole 128-row tiles (the default config) against `MoEConfig.halves` (runs padded
to 64 rows, two units a program), V2-Lite shape, 4 layers' weights per CUDA graph, µs a layer,
three alternating rounds, medians; the floor as `bench moe` computes it; and whether the two
give the same bits. Needs `halves.patch` (beside this file) applied to the tree: the option is
not in the package (it was written in the fifth session of 2026-11-23 and never GPU-run)."""

import statistics
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us


def main() -> None:
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    layers = make_layers(cfg, 4)
    print(f"# copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    for tokens in (1024, 2048, 4096, 8192):
        x = torch.randn(tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        base = pick_config(tokens)
        variants = {"whole": replace(base, halves=False), "halves": replace(base, halves=True)}
        fns = {n: (lambda x, layer, c, v=v: fused_layer(x, layer, c, v))
               for n, v in variants.items()}
        times: dict[str, list[float]] = {n: [] for n in variants}
        for r in range(3):
            for n in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                times[n].append(time_layer_us(fns[n], x, layers, cfg))
        same = torch.equal(fns["whole"](x, layers[0], cfg), fns["halves"](x, layers[0], cfg))
        cols = "  ".join(f"{n} {statistics.median(t):7.1f} ({statistics.median(t) / floor:.2f}x)"
                         f" [{', '.join(f'{v:.1f}' for v in t)}]" for n, t in times.items())
        print(f"# tokens {tokens:5d} floor {floor:6.1f}  {cols}  same_bits {same}", flush=True)


if __name__ == "__main__":
    main()
