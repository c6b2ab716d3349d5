"""V2-Lite whole-step graphs at a few decode rows with the MoE's shared-expert weights
prefetched into L2 while the attention runs, against the tree, in one process, alternating
rounds (2026-11-24, sixteenth session). ms synced / back to back, logits against the tree's.

The warm launch (bulk L2 prefetches, `l2_prefetch.prefetch_span`) goes on a side stream
forked after each MoE layer's q + kv_a projection, so it runs beside the absorb, split and
merge kernels (which leave HBM mostly idle at a few rows) and blocks nothing; the side stream
joins once, before the logits. Variants: tree; gu (the shared experts' gate_up, 23 MB at
V2-Lite), gud (gate_up and down, 35 MB); :P programs (default 32).

    PYTHONPATH=. python3 exp_warm.py [--batch 1 4 8 32] [--ctx 1024] [--rounds 6]
        --variants tree gu gud gu:132
"""

import argparse
import math
import statistics

import torch
import triton
import triton.language as tl

import mla_func as mf
import mla_func.model as model
from mla_func.kernels.l2_prefetch import prefetch_span
from mla_func.params import MoE
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch


@triton.jit
def _warm_kernel(base, nbytes, THREADS: tl.constexpr):
    prefetch_span(base, nbytes, tl.program_id(0), tl.num_programs(0), THREADS)


def warm(t: torch.Tensor, programs: int) -> None:
    _warm_kernel[(programs,)](t, t.numel() * t.element_size(), THREADS=128, num_warps=4)


def capture(params, state, batch, variant: str):
    what, _, p = variant.partition(":")
    programs = int(p or 32)
    shared = {id(layer.attn): layer.mlp.shared for layer in params.layers
              if isinstance(layer.mlp, MoE) and layer.mlp.shared is not None}
    side = torch.cuda.Stream()
    orig_qkv, orig_logits = model.project_qkv_a, model.project_logits

    def qkv(attn, x, cfg):
        out = orig_qkv(attn, x, cfg)
        mlp = shared.get(id(attn))
        if mlp is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                warm(mlp.gate_up, programs)
                if what == "gud":
                    warm(mlp.down, programs)
        return out

    def logits(*a):
        torch.cuda.current_stream().wait_stream(side)
        return orig_logits(*a)

    if what != "tree":
        model.project_qkv_a, model.project_logits = qkv, logits
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
        model.project_qkv_a, model.project_logits = orig_qkv, orig_logits
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 32])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", nargs="+", default=["tree", "gu", "gud", "gu:132"])
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
            times: dict[str, list[float]] = {v: [] for v in variants}
            back: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}:", flush=True)
            for v in variants:
                o = graphs[v][1].float()
                print(f"  {v}: {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ms (rounds {min(times[v]):.3f}-"
                      f"{max(times[v]):.3f}; logits equal {torch.equal(o, ref)})", flush=True)
            del graphs


if __name__ == "__main__":
    main()
