"""Why a synced whole-step graph replay takes longer than one of a back-to-back series
(2026-11-24, thirteenth session, run 42): V2-Lite decode, ctx 1024, the tree's graph of
`forward` at each batch; under the profiler, 5 replays each synced, then 5 back to back: per
replay the host's cudaGraphLaunch, the GPU's first kernel start and last kernel end, the kernel
count, and the GPU idle time inside the replay (gaps between kernels).

    PYTHONPATH=. python3 exp_launch_gap.py [--batch 1 32 128]
"""

import argparse
import json
import math
import os
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def capture(params, state, batch):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            mf.forward(params, state, batch)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mf.forward(params, state, batch)
    g.replay()
    torch.cuda.synchronize()
    return g


def events(run) -> list[dict]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    return json.load(open(path))["traceEvents"]


def analyse(evs, n: int) -> str:
    launches = sorted(float(e["ts"]) for e in evs
                      if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", ""))
    kernels = sorted(((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in evs
                      if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e))
    out = []
    for i, t0 in enumerate(launches[:n]):
        t1 = launches[i + 1] if i + 1 < len(launches) else float("inf")
        ks = [k for k in kernels if t0 <= k[0] < t1]
        if not ks:
            continue
        busy, end = 0.0, ks[0][0]
        for a, b in ks:
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        out.append((ks[0][0] - t0, len(ks), end - ks[0][0], end - ks[0][0] - busy))
    if not out:
        return "no launches found"
    return (f"launch to first kernel {statistics.median(o[0] for o in out):.1f} us, "
            f"kernels {out[0][1]}, first kernel start to last end "
            f"{statistics.median(o[2] for o in out):.1f} us, idle inside "
            f"{statistics.median(o[3] for o in out):.1f} us")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, max(args.batch) * math.ceil(1025 / 64) + 130, 64,
                          device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, 1024, "triton", seed=bsz, max_pages=129)
        g = capture(params, state, batch)
        sync, back = cuda_time_ms(g.replay, reps=30), pipelined_ms(g.replay)

        def synced():
            for _ in range(5):
                g.replay()
                torch.cuda.synchronize()

        def series():
            for _ in range(5):
                g.replay()

        print(f"B={bsz}: synced {sync:.3f} ms, back to back {back:.3f}; profiled synced: "
              f"{analyse(events(synced), 5)}; profiled back to back: "
              f"{analyse(events(series), 5)}", flush=True)
        del g


if __name__ == "__main__":
    main()
