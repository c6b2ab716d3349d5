"""The FFN norm in the router, second form (`proj_route.py`: the projection's programs store h
only, the few-row router's programs normalise it, route and store x; the experts' folded
shared tiles wait for the router like the routed ones, `x_late`) against the same code with
the norm in `proj_norm` and the shared tiles starting early ("plain", the launches of
1f40cc6), and "race" (the norm deferred, the shared tiles not waiting: they read x while the
router writes it; wrong numbers, a bound). V2-Lite whole-step graphs in one process,
alternating rounds, ms synced / back to back (2026-11-24, eighteenth session).

    PYTHONPATH=. python3 exp_route_wait.py [--batch 1 2 4] [--ctx 1024 4096] [--rounds 6]
"""

import argparse
import math
import statistics

import torch

import mla_func as mf
import mla_func.kernels.fused_moe as fused_moe
import mla_func.kernels.proj_route as proj_route
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

TREE = dict(fits=proj_route.fits, experts=fused_moe.fused_experts)


def _early(*args, x_late=False, **kwargs):
    return TREE["experts"](*args, **kwargs)


VARIANTS = {"route": TREE, "plain": dict(fits=lambda *a: False, experts=_early),
            "race": dict(fits=TREE["fits"], experts=_early)}


def capture(fn, variant: str, warm: int = 3):
    proj_route.fits, fused_moe.fused_experts = (VARIANTS[variant]["fits"],
                                                VARIANTS[variant]["experts"])
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warm):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
    finally:
        proj_route.fits, fused_moe.fused_experts = TREE["fits"], TREE["experts"]
    g.replay()
    torch.cuda.synchronize()
    return g, out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    print(f"# {torch.cuda.get_device_name()}")
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(lambda: mf.forward(params, state, batch)[0].clone(), v)
                      for v in VARIANTS}
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            back: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                for v in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            a, b = graphs["route"][1].float(), graphs["plain"][1].float()
            print(f"ctx {ctx} B={bsz}: logits equal {torch.equal(a, b)}, max diff "
                  f"{(a - b).abs().max().item():.3g}", flush=True)
            for v in VARIANTS:
                print(f"  {v:6s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ms (rounds {min(times[v]):.3f}-"
                      f"{max(times[v]):.3f})", flush=True)
            del graphs


if __name__ == "__main__":
    main()
