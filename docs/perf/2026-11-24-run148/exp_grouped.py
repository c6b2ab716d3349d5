"""What rate a grouped GEMM reaches at the MoE's 4096-token shapes (twenty-sixth session,
2026-11-24): #5's floor divides the layer's FLOPs by a dense 8192^3 product's rate, but the
routed GEMMs are 64 products of ~384 rows, each with its own weights (11.5 MB gate_up, 5.8 MB
down), so their weights cross HBM once per expert instead of once in all. This times, at
V2-Lite's shapes (64 experts, top-6, hidden 2048, moe_inter 1408, bf16), on balanced routing
(every expert exactly 384 of the 24576 pairs) and on random routing:

- cuBLAS dense: all 24576 rows through one expert's weights (what the floor's rate assumes);
- cuBLAS bmm: 64 x [384 rows] through 64 experts' weights (balanced only: a batched GEMM
  needs equal rows);
- `torch._grouped_mm` (CUTLASS) on the same rows by offsets;
- the tree's routed experts (`fused_experts` without shared experts: alignment, gate_up,
  down, pair sum), and last, under the profiler, its gate_up and down kernels alone.

    PYTHONPATH=. python3 exp_grouped.py [--rounds 5]

Times are medians over alternating rounds of CUDA-graph replays (µs), TFLOP/s over the real
rows' FLOPs.
"""

import argparse
import statistics
from collections import defaultdict

import torch
import torch.nn.functional as F

from mla_func.kernels.fused_moe import fused_experts
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import graph_time_ms, measure_ceilings

E, TOPK, H, INTER, T = 64, 6, 2048, 1408, 4096


def make_inputs():
    kw = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    x = torch.randn(T, H, **kw)
    gate_up = torch.randn(E, 2, INTER, H, **kw) * H**-0.5
    down = torch.randn(E, H, INTER, **kw) * INTER**-0.5
    balanced = (torch.arange(T, device="cuda")[:, None] * TOPK
                + torch.arange(TOPK, device="cuda")) % E
    rand = torch.randn(T, E, device="cuda").topk(TOPK, dim=-1).indices
    weights = torch.rand(T, TOPK, device="cuda") + 0.1
    return x, gate_up, down, {"balanced": balanced, "random": rand}, weights


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}")
    ceil = measure_ceilings()
    print(f"copy {ceil['copy_gbs']:.0f} GB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    x, gate_up, down, ids, weights = make_inputs()
    pairs = T * TOPK
    per = pairs // E
    gu_flops = 2 * pairs * H * 2 * INTER
    dn_flops = 2 * pairs * INTER * H
    kw = dict(device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(pairs, H, **kw)
    act = torch.randn(pairs, INTER, **kw)
    w_gu = gate_up.view(E, 2 * INTER, H)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * per
    cases = {
        "gate_up dense (cuBLAS)": (lambda: rows @ w_gu[0].T, gu_flops),
        "gate_up bmm (cuBLAS)": (lambda: torch.bmm(rows.view(E, per, H),
                                                   w_gu.transpose(1, 2)), gu_flops),
        "gate_up _grouped_mm": (lambda: torch._grouped_mm(rows, w_gu.transpose(1, 2),
                                                          offs=offs), gu_flops),
        "down dense (cuBLAS)": (lambda: act @ down[0].T, dn_flops),
        "down bmm (cuBLAS)": (lambda: torch.bmm(act.view(E, per, INTER),
                                                down.transpose(1, 2)), dn_flops),
        "down _grouped_mm": (lambda: torch._grouped_mm(act, down.transpose(1, 2), offs=offs),
                             dn_flops),
    }

    def bmm_routed(kind: str):
        """The balanced routed path on cuBLAS: gather, bmm, SiLU * up, bmm, weighted sum."""
        order = ids[kind].flatten().argsort(stable=True)
        tok = order // TOPK
        w = weights.flatten()[order, None]

        def fn():
            gu = torch.bmm(x[tok].view(E, per, H), w_gu.transpose(1, 2))
            gate, up = gu.chunk(2, dim=-1)
            y = torch.bmm(F.silu(gate) * up, down.transpose(1, 2)).view(pairs, H)
            return torch.zeros_like(x).index_add_(0, tok, (y.float() * w).to(x.dtype))
        return fn

    cases["routed bmm path, balanced (cuBLAS)"] = (bmm_routed("balanced"), gu_flops + dn_flops)
    for kind in ids:
        cases[f"routed tree (Triton), {kind}"] = (
            lambda k=kind: fused_experts(x, weights, ids[k], gate_up, down),
            gu_flops + dn_flops)
    ref = fused_experts(x, weights, ids["balanced"], gate_up, down).float()
    got = bmm_routed("balanced")().float()
    print(f"routed bmm path against the tree, balanced: max |d| "
          f"{(got - ref).abs().max().item():.3g} (|out| <= {ref.abs().max().item():.3g})")
    print(f"tree config at {T} tokens: {pick_config(T)}")

    times: dict[str, list[float]] = defaultdict(list)
    names = list(cases)
    for r in range(args.rounds):
        for name in (list(names) if r % 2 == 0 else names[::-1]):
            try:
                times[name].append(graph_time_ms(cases[name][0], reps=20) * 1e3)
            except Exception as err:  # noqa: BLE001  (a form that cannot run here)
                print(f"{name}: {type(err).__name__}: {err}"[:300])
                names.remove(name)
    print(f"\n| case | µs (rounds) | TFLOP/s | × dense floor ({ceil['matmul_tflops']:.0f}) |")
    print("|---|---|---|---|")
    for name in names:
        us = statistics.median(times[name])
        flops = cases[name][1]
        floor = flops / (ceil["matmul_tflops"] * 1e12) * 1e6
        print(f"| {name} | {us:.1f} ({min(times[name]):.1f}-{max(times[name]):.1f}) | "
              f"{flops / (us * 1e-6) / 1e12:.0f} | {us / floor:.2f} |")

    # Last (the profiler stays out of the timings above): the tree's kernels one by one.
    for kind in ids:
        fn = lambda k=kind: fused_experts(x, weights, ids[k], gate_up, down)  # noqa: E731
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        total: dict[str, float] = defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                total[ev.name[:40]] += ev.device_time_total / 10
        print(f"\nthe tree's kernels, {kind} routing (µs a call, profiler):")
        for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
            extra = ""
            if "gate_up" in name:
                extra = f"  {gu_flops / (us * 1e-6) / 1e12:.0f} TFLOP/s on the real rows"
            elif "down" in name:
                extra = f"  {dn_flops / (us * 1e-6) / 1e12:.0f} TFLOP/s on the real rows"
            print(f"  {name:40s} {us:8.1f}{extra}")


if __name__ == "__main__":
    main()
