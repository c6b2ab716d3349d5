"""Experiment (GPU): where a `full` decode step's time goes at small batches: the host's
dispatch (Python, before and after the replay) against the graph replay alone."""

import cProfile
import io
import math
import pstats
import time

import torch

import mla_func as mf
from mla_func.compile_step import compile_step
from scripts.bench_common import cuda_time_ms, print_table
from scripts.bench_step import decode_batch


def main() -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    ctx, page = 1024, 64
    max_pages = math.ceil((ctx + 1) / page)
    state = mf.init_state(cfg, 8 * max_pages + 2, page, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    step = compile_step(params, state, mode="full", max_tokens=64, max_seqs=8,
                        max_pages=max_pages, backend="triton", progress=False)
    rows = []
    for bsz in (1, 8):
        batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=max_pages)
        kind, size = step.choose((params, state, batch))
        graph = step.full[size].graph
        for _ in range(5):
            step(state, batch)
        torch.cuda.synchronize()
        host = []
        for _ in range(50):  # host time of one call, the GPU idle at its start
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(state, batch)
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        rows.append({"batch": bsz, "kind": kind,
                     "call_ms": cuda_time_ms(lambda b=batch: step(state, b), reps=50),
                     "replay_ms": cuda_time_ms(graph.replay, reps=50),
                     "host_ms": sorted(host)[len(host) // 2]})
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            step(state, batch)
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        print(f"## B={bsz}: cProfile of 50 calls (tottime)\n" + buf.getvalue()[-3500:])
    print_table(rows, list(rows[0]), f"full step dispatch ({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
