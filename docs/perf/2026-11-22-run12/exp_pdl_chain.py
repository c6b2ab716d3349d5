"""A chain of decode-size GEMMs (each feeds the next) in one CUDA graph: cuBLAS against a
skinny Triton GEMM, plain, launched early (PDL: trigger + wait at the start), and launched early
with its weights prefetched into L2 before the wait. Per-GEMM time = graph time / chain length.
"""
import torch
import triton
import triton.language as tl

from scripts.bench_common import graph_time_ms, measure_ceilings


@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise("mov.u32 $0, 0; prefetch.global.L2 [$1];", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _skinny(x, w, y, M, N, K, sx, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            PDL: tl.constexpr, PREFETCH: tl.constexpr, KP: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        if PREFETCH:  # one prefetch per 128-byte line of this program's weight rows
            lines = tl.arange(0, KP // 64) * 64
            for k0 in range(0, K, KP):
                _prefetch_l2(w + n[:, None] * K + k0 + lines[None, :])
        tl.extra.cuda.gdc_wait()
    m = tl.arange(0, BM)
    k = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(x + m[:, None] * sx + k0 + k[None, :], mask=m[:, None] < M, other=0.0)
        b = tl.load(w + n[None, :] * K + k0 + k[:, None])
        acc = tl.dot(a, b, acc)
    tl.store(y + m[:, None] * N + n[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] < M)


def skinny(x, w, pdl, prefetch, bn=16, bk=256, warps=4, stages=4):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    _skinny[(N // bn,)](x, w, y, M, N, K, x.stride(0), BM=16, BN=bn, BK=bk, PDL=pdl,
                        PREFETCH=prefetch, KP=512, num_warps=warps, num_stages=stages,
                        launch_pdl=pdl)
    return y


def main():
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()} copy {ceil['copy_gbs']:.0f} GB/s")
    kw = dict(device="cuda", dtype=torch.bfloat16)
    L = 16
    for N in (2048, 3648):
        ws = [torch.randn(N, 2048, **kw) * 2048**-0.5 for _ in range(L)]
        floor = N * 2048 * 2 / ceil["copy_gbs"] / 1e3
        for M in (1, 8, 16):
            x0 = torch.randn(M, 2048, **kw)

            def chain(fn):
                x = x0
                for w in ws:
                    x = fn(x, w)[:, :2048]
                return x

            ref = chain(lambda x, w: x @ w.T)
            row = []
            for name, fn in (("cublas", lambda x, w: x @ w.T),
                             ("triton", lambda x, w: skinny(x, w, False, False)),
                             ("pdl", lambda x, w: skinny(x, w, True, False)),
                             ("pdl+pf", lambda x, w: skinny(x, w, True, True))):
                got = chain(fn)
                err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                us = graph_time_ms(lambda fn=fn: chain(fn)) * 1e3 / L
                row.append(f"{name} {us:5.2f}{'' if err < 0.05 else ' WRONG'}")
            print(f"N={N} M={M:3d} floor {floor:4.2f} us | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
