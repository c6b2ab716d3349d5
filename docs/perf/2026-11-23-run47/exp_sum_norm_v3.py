"""The MoE's final sum with the residual add and the next RMSNorm (sum_kernel ADD_NORM) at
V3's hidden (7168, wider than the 2048-column block: the two-pass path) against the two
launches it replaces (sum_kernel, then norm.add_rmsnorm). V3 shape: top-8 + 1 folded shared
expert = 9 pair rows a token, bf16; 58 MoE layers' buffers in one CUDA graph, µs per layer,
two rounds; then the bits of the fused result against the two launches'."""

import torch

from mla_func.kernels.moe_gemm import sum_kernel
from mla_func.kernels.norm import add_rmsnorm
from scripts.bench_common import graph_time_ms

HIDDEN, PAIRS, LAYERS = 7168, 9, 58


def bench(tokens: int) -> None:
    bufs = [torch.randn(tokens * PAIRS, HIDDEN, device="cuda", dtype=torch.bfloat16)
            for _ in range(LAYERS)]
    res = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    out, y = torch.empty_like(res), torch.empty_like(res)

    def plain_sum(b, dst):
        sum_kernel[(tokens, HIDDEN // 1024)](
            b, b, dst, dst, dst, dst, HIDDEN, 0.0, PAIRS_PER_TOKEN=PAIRS, HAS_EXTRA=False,
            ADD_NORM=False, BLOCK=1024, num_warps=4)

    def two():
        for b in bufs:
            plain_sum(b, out)
            add_rmsnorm(res, out, w, 1e-6)

    def fused():  # what fused_experts launches at this width
        for b in bufs:
            sum_kernel[(tokens, 1)](b, b, out, res, y, w, HIDDEN, 1e-6, PAIRS_PER_TOKEN=PAIRS,
                                    HAS_EXTRA=False, ADD_NORM=True, BLOCK=2048, num_warps=4)

    for rnd in range(2):
        for name, fn in (("two launches", two), ("fused 2 pass", fused)):
            us = graph_time_ms(fn) * 1e3 / LAYERS
            print(f"# v3 tokens {tokens:4d} round {rnd} {name:14s} {us:6.2f} us/layer")
    ref = torch.empty_like(out)
    plain_sum(bufs[-1], ref)
    want_h, want_y = add_rmsnorm(res, ref, w, 1e-6)
    fused()
    print(f"# v3 tokens {tokens:4d} fused==two: h {torch.equal(out, want_h)} "
          f"y {torch.equal(y, want_y)} max|dy| {(y.float() - want_y.float()).abs().max():.3g}")


if __name__ == "__main__":
    torch.manual_seed(0)
    for n in (1, 8, 32, 128):
        bench(n)
