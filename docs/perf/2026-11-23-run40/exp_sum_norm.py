"""The MoE's final sum with the residual add and the next RMSNorm fused in (sum_kernel
ADD_NORM) against the two launches it replaces (sum_kernel, then norm.add_rmsnorm), V2-Lite
shape (8 pair rows a token: top-6 + 2 folded shared experts, hidden 2048, bf16), 26 layers'
buffers in one CUDA graph, µs per layer. Variants: one pass in registers (4 or 8 warps), and
the two-pass loop (1024 columns at a time), which run 40's census caught at 4.5 µs a layer."""

import torch

from mla_func.kernels.moe_gemm import sum_kernel
from mla_func.kernels.norm import add_rmsnorm
from scripts.bench_common import graph_time_ms

HIDDEN, PAIRS, LAYERS = 2048, 8, 26


def bench(tokens: int) -> None:
    bufs = [torch.randn(tokens * PAIRS, HIDDEN, device="cuda", dtype=torch.bfloat16)
            for _ in range(LAYERS)]
    res = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(res)
    y = torch.empty_like(res)

    def two():
        for b in bufs:
            sum_kernel[(tokens, 2)](b, b, out, out, out, out, HIDDEN, 0.0,
                                    PAIRS_PER_TOKEN=PAIRS, HAS_EXTRA=False, ADD_NORM=False,
                                    BLOCK=1024, num_warps=4)
            add_rmsnorm(res, out, w, 1e-6)

    def fused(block, warps):
        def run():
            for b in bufs:
                sum_kernel[(tokens, 1)](b, b, out, res, y, w, HIDDEN, 1e-6,
                                        PAIRS_PER_TOKEN=PAIRS, HAS_EXTRA=False,
                                        ADD_NORM=True, BLOCK=block, num_warps=warps)
        return run

    variants = {"two launches": two, "fused 1 pass w4": fused(2048, 4),
                "fused 1 pass w8": fused(2048, 8), "fused 2 pass w4": fused(1024, 4)}
    for rnd in range(2):
        for name, fn in variants.items():
            us = graph_time_ms(fn) * 1e3 / LAYERS
            print(f"# tokens {tokens:4d} round {rnd} {name:16s} {us:6.2f} us/layer")
    # The fused result against the two launches'.
    ref_out = torch.empty_like(out)
    sum_kernel[(tokens, 2)](bufs[-1], bufs[-1], ref_out, ref_out, ref_out, ref_out, HIDDEN,
                            0.0, PAIRS_PER_TOKEN=PAIRS, HAS_EXTRA=False, ADD_NORM=False,
                            BLOCK=1024, num_warps=4)
    want_h, want_y = add_rmsnorm(res, ref_out, w, 1e-6)
    fused(2048, 4)()
    print(f"# tokens {tokens:4d} fused==two: h {torch.equal(out, want_h)} "
          f"y {torch.equal(y, want_y)} max|dy| {(y.float() - want_y.float()).abs().max():.3g}")


if __name__ == "__main__":
    torch.manual_seed(0)
    for n in (1, 8, 32, 128):
        bench(n)
