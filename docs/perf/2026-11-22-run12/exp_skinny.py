"""Decode-size GEMMs of the V2-Lite attention block: cuBLAS against a skinny Triton prototype.

x [M, K] @ W[N, K]^T for qkv_a (N 3648) and o_proj (N 2048), K 2048; the absorption bmms
(16 heads: [M,128]@[128,512] and [M,512]@[512,128]). Graph-replayed, L2 not flushed (as in
a step, where other layers' weights evict these).
"""
import torch
import triton
import triton.language as tl

from scripts.bench_common import graph_time_ms, measure_ceilings


@triton.jit
def _skinny(x, w, y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    k = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(x + m[:, None] * K + k0 + k[None, :], mask=m[:, None] < M, other=0.0)
        b = tl.load(w + n[None, :] * K + k0 + k[:, None])
        acc = tl.dot(a, b, acc)
    tl.store(y + m[:, None] * N + n[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] < M)


def skinny(x, w, bn, bk, warps, stages):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    _skinny[(N // bn,)](x, w, y, M, N, K, BM=max(16, triton.next_power_of_2(M)), BN=bn, BK=bk,
                        num_warps=warps, num_stages=stages)
    return y


def main():
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()} copy {ceil['copy_gbs']:.0f} GB/s")
    kw = dict(device="cuda", dtype=torch.bfloat16)
    n_w = 8  # distinct weight copies per graph, so that each GEMM reads its weights from HBM
    for name, N, K in (("qkv_a", 3648, 2048), ("o_proj", 2048, 2048)):
        ws = [torch.randn(N, K, **kw) * K**-0.5 for _ in range(n_w)]
        floor = N * K * 2 / ceil["copy_gbs"] / 1e3
        for M in (1, 8, 32, 128):
            x = torch.randn(M, K, **kw)
            ref = x @ ws[0].T
            cub = graph_time_ms(lambda: [x @ w.T for w in ws]) * 1e3 / n_w
            best = None
            for bn, bk, warps, stages in ((16, 256, 4, 4), (32, 256, 4, 4), (16, 512, 4, 3),
                                         (32, 128, 4, 5), (64, 128, 4, 4), (16, 128, 4, 6)):
                if M > 64:
                    continue
                try:
                    got = skinny(x, ws[0], bn, bk, warps, stages)
                    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    us = graph_time_ms(lambda: [skinny(x, w, bn, bk, warps, stages) for w in ws]
                                       ) * 1e3 / n_w
                except Exception as e:  # noqa: BLE001
                    print(f"  {name} M={M} {bn},{bk},{warps},{stages}: {type(e).__name__}")
                    continue
                if err > 2e-2:
                    print(f"  WRONG {name} M={M} {bn},{bk}: {err}")
                    continue
                if best is None or us < best[0]:
                    best = (us, (bn, bk, warps, stages))
            print(f"{name:7s} M={M:4d} floor {floor:5.2f} us  cublas {cub:6.2f} us "
                  f"({cub / floor:4.2f}x)  skinny {'-' if best is None else f'{best[0]:6.2f}'}"
                  f" {'' if best is None else best[1]}", flush=True)
    for name, shape_a, shape_b in (("W_UK", (16, 1, 128), (16, 128, 512)),
                                   ("W_UV", (16, 1, 512), (16, 512, 128))):
        bs = [torch.randn(*shape_b, **kw) for _ in range(n_w)]
        floor = bs[0].numel() * 2 / ceil["copy_gbs"] / 1e3
        for M in (1, 8, 32, 128):
            a = torch.randn(shape_a[0], M, shape_a[2], **kw)
            us = graph_time_ms(lambda: [torch.bmm(a, b) for b in bs]) * 1e3 / n_w
            print(f"{name:7s} M={M:4d} floor {floor:5.2f} us  cublas bmm {us:6.2f} us", flush=True)


if __name__ == "__main__":
    main()
