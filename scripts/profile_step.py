"""Profile one V2-Lite decode step (GPU): kernel count, top kernels, eager vs whole-step graph.

    python -m scripts.profile_step [--batch 1 128] [--ctx 1024] [--graph]

The whole-step graph here is a plain `torch.cuda.graph` around `forward` (no compiler): a
check of what FULL mode should reach, and of where the time goes inside it. Without a CUDA GPU
it says so and exits (status 1) before any work.
"""

import argparse
import math
import sys

from scripts.cli import int_at_least


def profile(step, top: int = 25) -> list[dict]:
    """Kernels of one call of `step` (an eager forward, or a graph replay: its kernels are
    listed one by one too), by total device time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows: dict[str, dict] = {}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(evt.name[:70], {"kernel": evt.name[:70], "count": 0, "us": 0.0})
        r["count"] += 1
        r["us"] += evt.device_time
    out = sorted(rows.values(), key=lambda r: -r["us"])
    total = sum(r["us"] for r in out)
    launches = sum(r["count"] for r in out)
    print(f"{launches} kernel launches, {total:.0f} us of kernel time")
    return out[:top]


_positive = int_at_least(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=_positive, nargs="+", default=[1, 128])
    p.add_argument("--ctx", type=_positive, default=1024)
    p.add_argument("--page-size", type=_positive, default=64)
    p.add_argument("--backend", default="triton", choices=("torch", "triton"))
    p.add_argument("--graph", action="store_true", help="also list the kernels of a replay")
    args = p.parse_args(argv)  # --help and a mistyped option end here, before torch's import
    import torch

    if not torch.cuda.is_available():  # before any work (ceilings, 30 GB of weights)
        raise SystemExit("profile_step needs a CUDA GPU; none is available")
    import mla_func as mf
    from scripts.bench_common import (
        StateChain,
        cuda_time_ms,
        graph_time_ms,
        measure_ceilings,
        print_table,
    )
    from scripts.bench_decode import count_distinct_experts, decode_batch, step_floor

    ceil = measure_ceilings()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / args.page_size) + 2
    state = mf.init_state(cfg, pages, args.page_size, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    chain = StateChain(state)  # each step consumes the state: the chain passes it on

    def step(batch):
        return chain(lambda s, b: mf.forward(params, s, b), batch)

    summary = []
    for bsz in args.batch:
        batch = decode_batch(chain.state, bsz, args.ctx, args.backend, seed=bsz)
        floor = step_floor(params, count_distinct_experts(params, chain, batch), bsz, args.ctx,
                           ceil)
        eager = cuda_time_ms(lambda b=batch: step(b))
        graph = graph_time_ms(lambda b=batch: step(b))
        summary.append({"batch": bsz, "ctx": args.ctx, "floor_ms": floor["floor_ms"],
                        "eager_ms": eager, "graph_ms": graph,
                        "graph_over_floor": graph / floor["floor_ms"]})
        print_table(profile(lambda b=batch: step(b)),
                    ["kernel", "count", "us"], f"B={bsz} ctx={args.ctx} kernels (eager, one step)")
        if args.graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step(batch)
            print_table(profile(graph.replay), ["kernel", "count", "us"],
                        f"B={bsz} ctx={args.ctx} kernels (one whole-step graph replay)")
    print_table(summary, list(summary[0]), f"decode step, {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
