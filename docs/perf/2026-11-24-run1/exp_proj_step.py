"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`, 129-page table): the output
projection + residual add + RMSNorm in one launch (kernels/proj_norm.py, behind the fused merge
by PDL) against the cuBLAS GEMM + add_rmsnorm launch, all graphs in one process, alternating
rounds (2026-11-24, eleventh session).

Variants: `gemm` (proj_norm.MAX_ROWS = 0: the GEMM + add_rmsnorm), `proj` (the module's
settings), `-n<N>` N output columns a program, `-w<N>` N warps, `-r<N>` MAX_ROWS = N,
`-nopdl` launched without PDL (no early weight load); from run 5 on the fused q + kv_a
projection runs `small_linear` too: `-q0` keeps its GEMM, `-qn<N>` N columns a program;
from run 6 on the absorb kernel and the router are PDL-launched too: `gemm` turns all four
off, `-noab` / `-nort` the absorb's / the router's, `-noproj` the projection + add + norm.
In run 6 `gemm`, `-noab` and `-nort` also took the absorb's / router's early trigger away (the
tree before this session had it): their times there are not the old tree's; from run 7 on
they launch those kernels as before this session (`absorb.EARLY`, `router.EARLY`). Run 8
only (`absorb.EARLY` was in run 7's tree only, `fused_moe.TAIL_PDL` in run 8's only; neither
is in the final tree, where `-noab` and `-notail` change nothing): the MoE's down GEMM and
sum launched as dependents, off with `-notail` and in `gemm`. Run 11: `-rs<N>`, the router's
hidden splits at one token (the cost model's pick is 64). Run 13: `-st<N>`, where the MoE sum
triggers its dependants (`fused_moe.SUM_TRIGGER`: 1 at its start, 2 after its first store,
3 at its end; in run 13's tree only: the final tree triggers at the start). `--profile`: per layer, median time
from the end of the attention's last kernel (the fused merge, or the W_UV bmm) to the start
of the router, and the projection kernel's duration.

    PYTHONPATH=. python3 exp_proj_step.py [--batch 1 2 4 8] [--ctx 1024] [--rounds 4]
        [--variants gemm proj proj-n8] [--profile]
"""

import argparse
import json
import math
import os
import statistics
import tempfile

from dataclasses import replace

import torch
import triton

import mla_func as mf
from mla_func.kernels import absorb, fused_moe, proj_norm, router, small_linear
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

DEFAULTS = {n: getattr(proj_norm, n) for n in ("MAX_ROWS", "BLOCK_N", "NUM_WARPS")}
LINEAR = {n: getattr(small_linear, n) for n in ("MAX_ROWS", "BLOCK_N", "NUM_WARPS")}
PDL = proj_norm.pdl_supported
ROUTER_CONFIG = router.launch_config


def router_splits(n: int):
    """router.launch_config with n hidden splits at one token (run 11: `-rs<N>`)."""
    def config(tokens, experts, hidden, n_group=1):
        cfg = ROUTER_CONFIG(tokens, experts, hidden, n_group)
        if tokens != 1:
            return cfg
        block_g, block_gs = router._group_block(experts, n_group)
        block_s = min(max(router._TAIL_TILE // (cfg.sel_t * block_g * block_gs), 1),
                      triton.next_power_of_2(n))
        return replace(cfg, n_split=n, chunk=hidden // n, block_s=block_s)
    return config


def apply(variant: str) -> None:
    for name, value in DEFAULTS.items():
        setattr(proj_norm, name, value)
    for name, value in LINEAR.items():
        setattr(small_linear, name, value)
    proj_norm.pdl_supported = PDL
    router.launch_config = ROUTER_CONFIG
    fused_moe.SUM_TRIGGER = 1
    absorb.EARLY = router.EARLY = fused_moe.TAIL_PDL = True  # absorb.EARLY: run 7's tree only
    if variant.startswith("gemm"):  # run 7 on: every launch of this session off
        proj_norm.MAX_ROWS = small_linear.MAX_ROWS = 0
        absorb.EARLY = router.EARLY = fused_moe.TAIL_PDL = False
    for tok in variant.split("-")[1:]:
        if tok == "nopdl":
            proj_norm.pdl_supported = lambda device: False
        elif tok == "noab":  # the absorb kernel launched plainly (run 7 on; run 6: no PDL)
            absorb.EARLY = False
        elif tok == "nort":  # the router launched plainly (run 7 on; run 6: no PDL)
            router.EARLY = False
        elif tok == "notail":  # the MoE's down GEMM and sum launched plainly (run 8 on)
            fused_moe.TAIL_PDL = False
        elif tok.startswith("st"):  # where the MoE sum triggers (run 13: 1, 2 or 3)
            fused_moe.SUM_TRIGGER = int(tok[2:])
        elif tok.startswith("rs"):  # the router's hidden splits at one token (run 11)
            router.launch_config = router_splits(int(tok[2:]))
        elif tok == "noproj":
            proj_norm.MAX_ROWS = 0
        elif tok.startswith("q"):  # the fused q + kv_a (small_linear): rows, columns a program
            if tok[1] == "n":
                small_linear.BLOCK_N = int(tok[2:])
            else:
                small_linear.MAX_ROWS = int(tok[1:])
        elif tok[0] == "n":
            proj_norm.BLOCK_N = int(tok[1:])
        elif tok[0] == "w":
            proj_norm.NUM_WARPS = int(tok[1:])
        elif tok[0] == "r":
            proj_norm.MAX_ROWS = int(tok[1:])
        else:
            raise ValueError(f"unknown variant token {tok!r}")


def capture(params, state, batch, variant: str):
    apply(variant)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mf.forward(params, state, batch)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, _ = mf.forward(params, state, batch)
    finally:
        apply("proj")
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def profile_layers(graph) -> str:
    """Median per layer: attention's last kernel end -> router start; the projection kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = sorted(((e["name"], float(e["ts"]), float(e["dur"]))
                 for e in json.load(open(path))["traceEvents"]
                 if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[1])
    tail, proj = [], []
    for i, (name, ts, dur) in enumerate(ks):
        if "merge" not in name:
            continue
        j = i + 1
        if "uv" not in name:  # the W_UV bmm after the tile merge
            j += 1
        end = ks[j - 1][1] + ks[j - 1][2]
        router = next((k for k in ks[j:j + 6] if "router" in k[0]), None)
        if router is not None:
            tail.append(router[1] - end)
        if "proj_add_norm" in ks[j][0]:
            proj.append(ks[j][2])
    out = f"tail {statistics.median(tail):.2f}" if tail else "tail -"
    return out + (f", proj kernel {statistics.median(proj):.2f}" if proj else "")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-pages", type=int, default=129, help="page-table width (capacity)")
    p.add_argument("--variants", nargs="+", default=["gemm", "proj"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    variants = tuple(args.variants)
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=args.max_pages)
            graphs = {v: capture(params, state, batch, v) for v in variants}
            ref = graphs[variants[0]][1].float()
            errs = {v: ((o.float() - ref).abs().max() / ref.abs().max()).item()
                    for v, (_, o) in graphs.items()}
            times: dict[str, list[float]] = {v: [] for v in variants}
            back: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}: " + ", ".join(
                f"{v} {statistics.median(times[v]):.3f} ms (back to back "
                f"{statistics.median(back[v]):.3f}; logits rel diff {errs[v]:.2g})"
                for v in variants), flush=True)
            if args.profile:
                for v in variants:
                    print(f"- profile {v}: {profile_layers(graphs[v][0])} us", flush=True)
            del graphs


if __name__ == "__main__":
    main()
