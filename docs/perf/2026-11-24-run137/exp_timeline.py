"""Kernel timeline of one V2-Lite decode step replayed as one CUDA graph (GPU): for one middle
layer, each kernel's start (from the layer's first kernel), duration and the gap to the end of
the kernels before it (negative: overlap, PDL or a side stream), at B = 1, 32, 128.

    PYTHONPATH=. python3 exp_timeline.py [--batch 1 32 128] [--ctx 1024] [--layer 10]
"""

import argparse
import json
import math
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf
from scripts.bench_step import decode_batch


def kernels_of(step) -> list[tuple[str, float, float]]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    ks = [(e["name"], float(e["ts"]), float(e["dur"])) for e in events
          if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e]
    return sorted(ks, key=lambda k: k[1])


def short(name: str) -> str:
    for key in ("nvjet", "splitKreduce", "elementwise", "gather", "copy"):
        if key in name:
            return name[:44]
    return name.split("(")[0][:44]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--layer", type=int, default=10)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    for bsz in args.batch:
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=129)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mf.forward(params, state, batch)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            mf.forward(params, state, batch)
        ks = kernels_of(g.replay)
        t0, t1 = ks[0][1], max(k[1] + k[2] for k in ks)
        starts = [i for i, k in enumerate(ks) if "absorb" in k[0]]
        busy = 0.0
        end = t0
        for _, ts, dur in ks:
            busy += max(0.0, ts + dur - max(ts, end))
            end = max(end, ts + dur)
        print(f"\n## B={bsz} ctx={args.ctx}: {len(ks)} kernels, step {t1 - t0:.1f} us, "
              f"GPU busy (union) {busy:.1f} us, idle {t1 - t0 - busy:.1f} us")
        gaps, end = [], t0
        for i, (name, ts, dur) in enumerate(ks):
            if ts - end > 1.5:
                gaps.append((ts - end, i))
            end = max(end, ts + dur)
        print(f"gaps over 1.5 us: {len(gaps)}, {sum(g for g, _ in gaps):.1f} us; largest:")
        for g, i in sorted(gaps, reverse=True)[:6]:
            print(f"- {g:7.1f} us before #{i} {short(ks[i][0])} (after {short(ks[i - 1][0])})")
        per_layer = [ks[b][1] - ks[a][1] for a, b in zip(starts, starts[1:])]
        if per_layer:
            mid = per_layer[1:-1] or per_layer
            print(f"layer (absorb to absorb): mean {sum(mid) / len(mid):.1f} us, "
                  f"min {min(mid):.1f}, max {max(mid):.1f}")
        a, b = starts[args.layer], starts[args.layer + 1]
        base = ks[a][1]
        end = ks[a - 1][1] + ks[a - 1][2]
        print("| kernel | start us | dur us | gap us |")
        print("|---|---|---|---|")
        for name, ts, dur in ks[a - 2:b]:
            print(f"| {short(name)} | {ts - base:7.2f} | {dur:6.2f} | {ts - end:+6.2f} |")
            end = max(end, ts + dur)


if __name__ == "__main__":
    main()
