"""The few-row router (`router.FEW_ROWS`: `router_rows.py`, one program an expert, up to 4
rows) against the split router (2026-11-24, eighteenth session): V2-Lite whole-step graphs in
one process, alternating rounds, ms synced / back to back, logits against each other; then
the router alone (20 launches a graph, µs a launch).

    PYTHONPATH=. python3 exp_rows.py [--batch 1 2 4] [--ctx 1024 4096] [--rounds 6]
        [--max-rows N] [--alone 1 4]
"""

import argparse
import math
import statistics

import torch

import mla_func as mf
import mla_func.kernels.router as router
import mla_func.kernels.router_rows as router_rows
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

VARIANTS = {"rows": True, "split": False}


def capture(fn, variant: str, warm: int = 3):
    router.FEW_ROWS = VARIANTS[variant]
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
        router.FEW_ROWS = True
    g.replay()
    torch.cuda.synchronize()
    return g, out


def alternate(graphs: dict, rounds: int, reps: int = 30) -> tuple[dict, dict]:
    times: dict[str, list[float]] = {v: [] for v in graphs}
    back: dict[str, list[float]] = {v: [] for v in graphs}
    names = list(graphs)
    for r in range(rounds):
        for v in (names if r % 2 == 0 else names[::-1]):
            times[v].append(cuda_time_ms(graphs[v][0].replay, reps=reps))
            back[v].append(pipelined_ms(graphs[v][0].replay))
    return times, back


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-rows", type=int, default=0, help="router_rows.MAX_ROWS (0: as is)")
    p.add_argument("--alone", type=int, nargs="+", default=[1, 4])
    args = p.parse_args()
    if args.max_rows:
        router_rows.MAX_ROWS = args.max_rows
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    print(f"# {torch.cuda.get_device_name()}")
    r = params.layers[1].mlp.router
    for tokens in args.alone:
        x = torch.randn(tokens, cfg.hidden_size, device="cuda").bfloat16()

        def twenty():
            for _ in range(19):
                router.route_fused(x, r, None, cfg)
            return router.route_fused(x, r, None, cfg)

        graphs = {v: capture(twenty, v) for v in VARIANTS}
        (wa, ia), (wb, ib) = graphs["rows"][1], graphs["split"][1]
        times, _ = alternate(graphs, args.rounds, reps=20)
        print(f"router alone, {tokens} tokens: ids equal {torch.equal(ia, ib)}, weights max "
              f"diff {(wa - wb).abs().max().item():.3g}; us a launch: " + ", ".join(
                  f"{v} {statistics.median(times[v]) * 1000 / 20:.2f} ("
                  f"{min(times[v]) * 50:.2f}-{max(times[v]) * 50:.2f})" for v in VARIANTS),
              flush=True)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(lambda: mf.forward(params, state, batch)[0].clone(), v)
                      for v in VARIANTS}
            times, back = alternate(graphs, args.rounds)
            a, b = graphs["rows"][1].float(), graphs["split"][1].float()
            print(f"ctx {ctx} B={bsz}: logits equal {torch.equal(a, b)}, max diff "
                  f"{(a - b).abs().max().item():.3g}", flush=True)
            for v in VARIANTS:
                print(f"  {v:6s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ms (rounds {min(times[v]):.3f}-"
                      f"{max(times[v]):.3f})", flush=True)
            del graphs


if __name__ == "__main__":
    main()
