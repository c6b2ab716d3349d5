"""The MoE layer at one token: the tree's (router, gate_up, down with the pair sum as its tail)
against the prototype of mlp_row.py (router, one kernel streaming both GEMMs' weights, a
reduction), V2-Lite shapes, bf16, random weights, LAYERS distinct layers a CUDA graph, medians
of alternating rounds, us a layer. Outputs compared with the tree's (max abs difference).

    PYTHONPATH=. python3 docs/perf/2026-11-25-run21/exp_mlp1.py [--rounds 6] [--layers 8]
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from mlp_row import mlp_row  # noqa: E402

from mla_func.config import MLAConfig  # noqa: E402
from mla_func.kernels.fused_moe import fused_experts, shared_as_experts  # noqa: E402
from mla_func.kernels.router import route_fused  # noqa: E402
from scripts.bench_common import measure_ceilings  # noqa: E402

# (name, mlp_row keyword arguments)
VARIANTS = [
    ("bi32 bk128 bn128 w4 s3", dict(bi=32, bk=128, bn=128, warps=4, stages=3)),
    ("bi32 bk128 bn256 w4 s3", dict(bi=32, bk=128, bn=256, warps=4, stages=3)),
    ("bi16 bk128 bn128 w4 s3", dict(bi=16, bk=128, bn=128, warps=4, stages=3)),
    ("bi32 bk64 bn128 w4 s4", dict(bi=32, bk=64, bn=128, warps=4, stages=4)),
    ("bi32 bk128 bn128 w2 s3", dict(bi=32, bk=128, bn=128, warps=2, stages=3)),
    ("bi64 bk128 bn128 w4 s3", dict(bi=64, bk=128, bn=128, warps=4, stages=3)),
    ("bi32 bk128 bn128 w4 s3 trig", dict(bi=32, bk=128, bn=128, warps=4, stages=3,
                                         trigger=True)),
    ("bi32 bk128 bn128 w4 s3 br32", dict(bi=32, bk=128, bn=128, warps=4, stages=3, br=32)),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    torch.manual_seed(0)
    ceil = measure_ceilings()
    cfg = MLAConfig.preset("v2-lite")
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    s = cfg.n_shared_experts * i
    kw = dict(device="cuda", dtype=torch.bfloat16)
    layers = [dict(router=torch.randn(e, h, **kw) * h**-0.5,
                   gu=torch.randn(e, 2, i, h, **kw) * h**-0.5,
                   dn=torch.randn(e, h, i, **kw) * i**-0.5,
                   sgu=torch.randn(2, s, h, **kw) * h**-0.5,
                   sdn=torch.randn(h, s, **kw) * s**-0.5) for _ in range(args.layers)]
    for lay in layers:
        lay["sgu_e"], lay["sdn_e"] = shared_as_experts(lay["sgu"], lay["sdn"], i)
    x = torch.randn(1, h, **kw)
    res = torch.randn(1, h, **kw)
    nw = 1 + 0.1 * torch.randn(h, **kw)
    eps = 1e-6

    def tree():
        outs = []
        for lay in layers:
            w, ids = route_fused(x, lay["router"], None, cfg)
            hh, _ = fused_experts(x, w, ids, lay["gu"], lay["dn"], lay["sgu"], lay["sdn"],
                                  add_norm=(res, nw, eps), defer_norm=True)
            outs.append(hh)
        return outs

    def proto(kwargs):
        def fn():
            outs = []
            for lay in layers:
                w, ids = route_fused(x, lay["router"], None, cfg)
                outs.append(mlp_row(x, w, ids, lay["gu"], lay["dn"], lay["sgu_e"],
                                    lay["sdn_e"], res, pdl=True, **kwargs))
            return outs
        return fn

    fns = {"tree": tree} | {name: proto(kw_) for name, kw_ in VARIANTS}
    want = tree()
    graphs = {}
    for name, fn in fns.items():
        try:
            got = fn()
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001
            print(f"{name}: {type(err).__name__}: {str(err)[:200]}")
            continue
        diff = max((a.float() - b.float()).abs().max().item()
                   for a, b in zip(got, want, strict=True))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs[name] = g
        print(f"{name}: max |diff| against the tree {diff:.3g}", flush=True)

    # bytes: 6 routed + 2 shared experts' weights (distinct at one token)
    nbytes = (cfg.num_experts_per_tok + cfg.n_shared_experts) * 3 * i * h * 2
    floor = nbytes / (ceil["copy_gbs"] * 1e9) * 1e6
    times = {n: [] for n in graphs}
    for _ in range(args.rounds):
        for name, g in graphs.items():
            for _ in range(3):
                g.replay()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(args.reps):
                g.replay()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3 / args.reps / args.layers)
    print(f"\ncopy {ceil['copy_gbs']:.0f} GB/s; experts' weights {nbytes / 1e6:.1f} MB: "
          f"{floor:.1f} us a layer")
    print("| variant | us a layer (median) | min-max | x floor |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {min(ts):.2f}-{max(ts):.2f} | {med / floor:.3f} |")


if __name__ == "__main__":
    main()
