"""The merge fused with W_UV (`mla_merge_uv`, decode rows 1-4) through `mla_merge.merged`
(the working tree) against its own split loop (HEAD's mla_merge_uv.py, copied to baseline/):
V2-Lite whole-step graphs in one process, alternating rounds, ms synced / back to back, logits
against each other (2026-11-24, seventeenth session).

    PYTHONPATH=. python3 exp_merge.py [--batch 1 2 4] [--ctx 1024 4096] [--rounds 6]
"""

import argparse
import importlib.util
import math
import statistics

import torch

import mla_func as mf
import mla_func.kernels.mla_absorbed as absorbed
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

spec = importlib.util.spec_from_file_location("merge_uv_base",
                                              "baseline/mla_func/kernels/mla_merge_uv.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
VARIANTS = {"merged": absorbed.merge_uv, "loop": base.merge_uv}


def capture(params, state, batch, variant: str):
    absorbed.merge_uv = VARIANTS[variant]
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
        absorbed.merge_uv = VARIANTS["merged"]
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {v: capture(params, state, batch, v) for v in VARIANTS}
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            back: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                for v in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            a, b = graphs["merged"][1].float(), graphs["loop"][1].float()
            print(f"ctx {ctx} B={bsz}: logits equal {torch.equal(a, b)}, max diff "
                  f"{(a - b).abs().max().item():.3g}", flush=True)
            for v in VARIANTS:
                print(f"  {v}: {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ms (rounds {min(times[v]):.3f}-"
                      f"{max(times[v]):.3f})", flush=True)
            del graphs


if __name__ == "__main__":
    main()
