"""Whole-step graphs of `forward` (V2-Lite, random weights, 129-page table) with module
constants set otherwise, against the tree, in one process, alternating rounds (2026-11-24,
fourteenth session). A variant is `tree` or `module.NAME=value[,module.NAME=value]` (value an
int or a float), set before the capture and restored after it. ms synced / back to back.

    PYTHONPATH=. python3 exp_flags.py [--batch 8 32 128] [--ctx 1024] [--rounds 4]
        --variants tree mla_func.kernels.norm.TRIGGER_EARLY=0
"""

import argparse
import importlib
import math
import statistics

import torch

import mla_func as mf
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


def settings(variant: str) -> list[tuple[object, str, object]]:
    if variant == "tree":
        return []
    out = []
    for item in variant.split(","):
        path, value = item.split("=")
        module, name = path.rsplit(".", 1)
        out.append((importlib.import_module(module), name, float(value) if "." in value
                    else int(value)))
    return out


def clear_caches(variant: str) -> None:
    """Empty the functools caches of the variant's modules (e.g. `router.launch_config`),
    which would hand back configurations made with the other settings (run 70 on)."""
    for m, _, _ in settings(variant):
        for v in vars(m).values():
            if hasattr(v, "cache_clear"):
                v.cache_clear()


def capture(params, state, batch, variant: str):
    saved = [(m, n, getattr(m, n)) for m, n, _ in settings(variant)]
    for m, n, v in settings(variant):
        setattr(m, n, type(getattr(m, n))(v))
    clear_caches(variant)
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
        for m, n, v in saved:
            setattr(m, n, v)
        clear_caches(variant)
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", required=True)
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
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
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
            print(f"ctx {ctx} B={bsz}:", flush=True)
            for v in variants:
                print(f"  {v}: {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ms (logits rel diff {errs[v]:.2g})",
                      flush=True)
            del graphs


if __name__ == "__main__":
    main()
