"""Triton 3.6's automatic warp specialisation on sm90 (`tl.range(..., warp_specialize=True)`,
the `add_hopper_warpspec` pass) on the MoE's 4096-token GEMM shapes, against the same kernel
without it and against cuBLAS (2026-11-24, nineteenth session).

On CPU (Triton 3.6 AOT for sm90) the pass partitions a TMA-only matmul loop (12 warps: a
producer and two consumer warpgroups), but it fails on a loop that gathers A through pointer
loads (the routed gate_up's token rows) and on a kernel that returns early before the loop (the
tree's `if e < 0: return`). So this measures what it would give to GEMMs whose operands are both
TMA-loadable: A contiguous (`act` in the down GEMM; a pre-gathered x for gate_up), B one
expert's rows picked by a tile table (no early return).

Shapes (V2-Lite at 4096 tokens, 26624 rows = 208 whole 128-row tiles, the routed rows with
their padding): gate_up [26624, 2048] x [2816, 2048]^T, down [26624, 1408] x [2048, 1408]^T;
`dense`: one B; `grouped`: 64 experts' B stacked, 3 or 4 tiles an expert.

    PYTHONPATH=. python3 exp_ws.py [--rounds 5] [--variants plain4 plain3 cublas ws4 ws3 gluon4]
        [--shapes gate_up down] [--layouts dense grouped]

Run 102's first try (all variants in one process, ws3 launched first) printed nothing for 400 s:
the first warp-specialised launch did not finish. Hence one variant a process here (run.sh).
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import gluon_mm  # beside this file


@triton.jit
def _mm(a_desc, b_desc, te_ptr, c_ptr, N, K, BM: tl.constexpr, BN: tl.constexpr,
        BK: tl.constexpr, WS: tl.constexpr):
    pid_n = tl.program_id(0)  # N-tiles fastest, as the tree's aligned GEMMs
    pid_m = tl.program_id(1)
    e = tl.maximum(tl.load(te_ptr + pid_m), 0)
    row_w = e * N + pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        a = a_desc.load([pid_m * BM, k])
        b = b_desc.load([row_w, k])
        acc = tl.dot(a, b.T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(tl.bfloat16))


def run(a, b, te, n, ws: bool, stages: int, bn: int = 256):
    m, k = a.shape
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    a_desc = TensorDescriptor.from_tensor(a, [128, 64])
    b_desc = TensorDescriptor.from_tensor(b, [bn, 64])
    grid = (n // bn, m // 128)

    def go():
        _mm[grid](a_desc, b_desc, te, c, n, k, BM=128, BN=bn, BK=64, WS=ws,
                  num_warps=4 if ws else 8, num_stages=stages)
    return go, c


def run_gluon(a, b, te, n, stages: int, bn: int = 256, persistent: bool = False):
    """`gluon_mm.ws_mm`: the hand-written warp-specialised kernel, same tiles and operands."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    m, k = a.shape
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    lay = gl.NVMMASharedLayout.get_default_for
    a_desc = GluonDescriptor.from_tensor(a, [64, 64], lay([64, 64], gl.bfloat16))
    b_desc = GluonDescriptor.from_tensor(b, [bn, 64], lay([bn, 64], gl.bfloat16))
    grid = (n // bn, m // 128)
    if persistent:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count

        def go_p():
            gluon_mm.ws_mm_persistent[(min(sms, grid[0] * grid[1]),)](
                a_desc, b_desc, te, c, m, n, k, BN=bn, BK=64, STAGES=stages,
                CONSUMER_REGS=232, num_warps=4)
        return go_p, c

    def go():
        gluon_mm.ws_mm[grid](a_desc, b_desc, te, c, n, k, BN=bn, BK=64, STAGES=stages,
                             CONSUMER_REGS=232, num_warps=4)
    return go, c


def time_us(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", nargs="+", default=["plain4", "plain3", "cublas"])
    p.add_argument("--shapes", nargs="+", default=["gate_up", "down"])
    p.add_argument("--layouts", nargs="+", default=["dense", "grouped"])
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}")
    m = 26624
    tiles = m // 128
    per = [4] * 16 + [3] * 48  # 64 experts, 208 tiles
    te_grouped = torch.repeat_interleave(torch.arange(64), torch.tensor(per)).to(
        torch.int32).to(dev)
    te_dense = torch.zeros(tiles, dtype=torch.int32, device=dev)
    for name, k, n in (("gate_up", 2048, 2816), ("down", 1408, 2048)):
        if name not in args.shapes:
            continue
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        flops = 2 * m * k * n
        for layout, te, experts in (("dense", te_dense, 1), ("grouped", te_grouped, 64)):
            if layout not in args.layouts:
                continue
            b = torch.randn(experts * n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
            variants = {}
            for v in args.variants:
                if v.startswith(("gluon", "pgluon")):
                    variants[v] = run_gluon(a, b, te, n, int(v[-1]), persistent=v[0] == "p")
                elif v.startswith(("ws", "plain")):
                    variants[v] = run(a, b, te, n, v.startswith("ws"), int(v[-1]))
                elif v == "cublas" and experts == 1:
                    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                    variants[v] = (lambda: torch.mm(a, b.T, out=out), out)
            times: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                    times[v].append(time_us(variants[v][0]))
            # Every variant against the same product in fp32; grouped: per expert's tiles.
            if experts == 1:
                ref = a.float() @ b.float().T
            else:
                rows_e = torch.repeat_interleave(te, 128).long()
                ref = torch.empty(m, n, device=dev)
                for e in range(experts):
                    sel = rows_e == e
                    ref[sel] = a[sel].float() @ b[e * n:(e + 1) * n].float().T
            print(f"{name} {layout} [{m} x {k}] x [{n} x {k}]^T:")
            for v, t in times.items():
                med = statistics.median(t)
                err = f"; max err to fp32 {(variants[v][1].float() - ref).abs().max().item():.3g}"
                print(f"  {v:8s} {med:7.1f} us  {flops / med / 1e6:6.1f} TFLOP/s  "
                      f"(rounds {min(t):.1f}-{max(t):.1f}{err})", flush=True)


if __name__ == "__main__":
    main()
