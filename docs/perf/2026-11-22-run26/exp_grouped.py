"""torch._grouped_mm (CUTLASS grouped GEMM on sm90) at the 4096-token MoE shapes, on the
aligned layout of `moe_align` (each expert's run padded to 128 rows), against the Triton
kernels of `moe_gemm` and dense cuBLAS of the same size.

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/.../exp_grouped.py
"""
import torch

from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_align import align
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms


def main() -> None:
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    E, H, I, K, T, BM = 64, 2048, 1408, 6, 4096, 128
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    x = torch.randn(T, H, device=dev, dtype=dt)
    gu = torch.randn(E, 2, I, H, device=dev, dtype=dt) * H**-0.5
    dn = torch.randn(E, H, I, device=dev, dtype=dt) * I**-0.5
    ids = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)])
    w = torch.rand(T, K, device=dev)
    sorted_pairs, block_expert, block_rows = align(ids, E, 0, BM)
    rows = sorted_pairs.shape[0]
    # Each expert's run: its tiles (every expert is hit at 4096 tokens); offs = run ends.
    tiles = torch.bincount(block_expert[block_expert >= 0].long(), minlength=E)
    offs = (tiles.cumsum(0) * BM).to(torch.int32)
    used = int(offs[-1])
    print(f"  rows {rows}, used {used}, pairs {T * K}", flush=True)
    flops_gu, flops_dn = 2 * T * K * H * 2 * I, 2 * T * K * I * H
    real = (torch.arange(BM, device=dev)[None] < block_rows[:, None]).flatten()
    tok = torch.where(real, sorted_pairs.long().clamp(min=0) // K, 0)
    xs = x[tok]  # the gathered A of gate_up
    act = torch.randn(rows, I, device=dev, dtype=dt)

    def report(name, us, flops):
        print(f"  {name:50s} {us:8.1f} us {flops / us / 1e6:6.0f} TFLOP/s", flush=True)

    b_gu = gu.flatten(1, 2).transpose(1, 2)  # [E, H, 2I]
    b_dn = dn.transpose(1, 2)  # [E, I, H]
    try:
        report("grouped_mm gate_up [rows, H] x [E, H, 2I]",
               graph_time_ms(lambda: torch._grouped_mm(xs, b_gu, offs=offs)) * 1e3, flops_gu)
        report("grouped_mm down [rows, I] x [E, I, H]",
               graph_time_ms(lambda: torch._grouped_mm(act, b_dn, offs=offs)) * 1e3, flops_dn)
        ref = torch.cat([act[(offs[e - 1] if e else 0):offs[e]] @ b_dn[e] for e in range(E)])
        got = torch._grouped_mm(act, b_dn, offs=offs)[:used]
        print(f"  grouped_mm down max|diff| vs per-expert mm {(got - ref).abs().max().item():.3g}")
    except Exception as err:  # noqa: BLE001  (an experiment: report and go on)
        print(f"  grouped_mm: {type(err).__name__}: {str(err)[:300]}")
    report("gather x rows (x[tok])", graph_time_ms(lambda: x[tok]) * 1e3, 0.0)
    a, b = torch.randn(rows, H, device=dev, dtype=dt), torch.randn(H, 2 * I, device=dev, dtype=dt)
    report("cuBLAS dense gate_up", graph_time_ms(lambda: a @ b) * 1e3, flops_gu)
    a2, b2 = torch.randn(rows, I, device=dev, dtype=dt), torch.randn(I, H, device=dev, dtype=dt)
    report("cuBLAS dense down", graph_time_ms(lambda: a2 @ b2) * 1e3, flops_dn)
    cfg = pick_config(T)
    report("fused_experts (routed only, this tree)",
           graph_time_ms(lambda: fused_experts(x, w, ids, gu, dn, config=cfg)) * 1e3,
           flops_gu + flops_dn)


if __name__ == "__main__":
    main()
