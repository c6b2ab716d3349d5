"""torch._grouped_mm (CUTLASS on sm90) on the 4096-token MoE shapes, against the tree's Triton
expert GEMMs in the same process (2026-11-24, eleventh session): is it fast enough to carry
the routed experts at 4096 tokens?

Balanced rows (384 per expert, 24576 in all; V2-Lite: 64 experts, hidden 2048, moe_inter
1408), bf16, each timed alone in a CUDA graph (4 weight sets a graph), µs and TFLOP/s:
  gm-gate_up / gm-down   torch._grouped_mm, weights as the model keeps them ([E, N, K],
                         passed transposed: K contiguous)
  gm-*-kn                the same with weights copied to [E, K, N] (N contiguous)
  triton-routed          the tree's fused_experts on the same routing, shared experts left
                         out (alignment + gate_up + down + sum)
  gm-routed              a routed-experts path through _grouped_mm: gather rows in expert
                         order, gate_up, SiLU * up, down, weighted sum through the inverse order

    PYTHONPATH=. python3 exp_grouped_mm.py [--tokens 4096]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms, measure_ceilings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16)
    E, H, I, K = 64, 2048, 1408, 6
    T = args.tokens
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    L = 4
    gate_up = [torch.randn(E, 2, I, H, **kw) * H**-0.5 for _ in range(L)]
    down = [torch.randn(E, H, I, **kw) * I**-0.5 for _ in range(L)]
    gu_nk = [w.flatten(1, 2) for w in gate_up]  # [E, 2I, H]
    gu_kn = [w.transpose(1, 2).contiguous() for w in gu_nk]  # [E, H, 2I]
    dn_kn = [w.transpose(1, 2).contiguous() for w in down]  # [E, I, H]
    x = torch.randn(T, H, **kw)
    # Balanced routing: token t picks experts (t * K + j) % E.
    ids = ((torch.arange(T, device="cuda")[:, None] * K + torch.arange(K, device="cuda"))
           % E).int()
    w = torch.softmax(torch.randn(T, K, device="cuda"), -1).to(torch.bfloat16)
    rows = T * K
    per = rows // E
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * per
    a_gu = torch.randn(rows, H, **kw)
    a_dn = torch.randn(rows, I, **kw)

    def routed_gm(layer):
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device="cuda")
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        o = counts.cumsum(0, dtype=torch.int32)
        xs = x[order // K]
        h = torch._grouped_mm(xs, gu_nk[layer].transpose(1, 2), offs=o)
        a = F.silu(h[:, :I]) * h[:, I:]
        y = torch._grouped_mm(a, down[layer].transpose(1, 2), offs=o)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(rows, device="cuda")
        yp = y[inv].view(T, K, H).float() * w[:, :, None].float()
        return yp.sum(1).to(x.dtype)

    cases = {
        "gm-gate_up": (lambda i: torch._grouped_mm(a_gu, gu_nk[i].transpose(1, 2), offs=offs),
                       2 * rows * H * 2 * I),
        "gm-gate_up-kn": (lambda i: torch._grouped_mm(a_gu, gu_kn[i], offs=offs),
                          2 * rows * H * 2 * I),
        "gm-down": (lambda i: torch._grouped_mm(a_dn, down[i].transpose(1, 2), offs=offs),
                    2 * rows * I * H),
        "gm-down-kn": (lambda i: torch._grouped_mm(a_dn, dn_kn[i], offs=offs),
                       2 * rows * I * H),
        "triton-routed": (lambda i: fused_experts(x, w, ids, gate_up[i], down[i],
                                                  config=pick_config(T)),
                          2 * rows * H * 3 * I),
        "gm-routed": (routed_gm, 2 * rows * H * 3 * I),
    }
    ref = fused_experts(x, w, ids, gate_up[0], down[0], config=pick_config(T))
    got = routed_gm(0)
    print(f"gm-routed against triton-routed: max |diff| "
          f"{(got.float() - ref.float()).abs().max().item():.3g} (|ref| max "
          f"{ref.float().abs().max().item():.3g})")
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, (fn, _) in cases.items():
            try:
                ms = graph_time_ms(lambda fn=fn: [fn(i) for i in range(L)], reps=20)
            except Exception as err:  # noqa: BLE001  (reported, not fatal)
                print(f"  {name}: {type(err).__name__}: {err}"[:300])
                ms = float("nan")
            times[name].append(ms * 1e3 / L)
    for name, (_, flops) in cases.items():
        us = statistics.median(times[name])
        print(f"  {name:15s} {us:8.1f} us  {flops / (us * 1e-6) / 1e12:6.0f} TFLOP/s  "
              f"rounds {' '.join(f'{u:.0f}' for u in times[name])}")


if __name__ == "__main__":
    main()
