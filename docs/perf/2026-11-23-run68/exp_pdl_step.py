"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`): the kernels that wait at
their top launched as programmatic dependents of the kernel before them (`pdl.dependent`,
this tree's default) against launched plainly (`pdl.DEPENDENT_LAUNCH = False`), both graphs
in one process, alternating rounds (GPU). The logits must be equal. (Runs 81-82 on commit
f1c45c2, which had the switch; reverted after them, so this tree no longer has it.)

    PYTHONPATH=. python3 exp_pdl_step.py [--batch 1 8 32 128] [--ctx 1024] [--rounds 4]
"""

import argparse
import statistics

import torch

import mla_func as mf
from mla_func.kernels import pdl
from scripts.bench_common import cuda_time_ms
from scripts.bench_step import decode_batch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, max(args.batch) * 65 + 130, 64, device="cuda",
                          dtype=torch.bfloat16)
    state.cache.normal_()
    variants = {"pdl": True, "plain": False}
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            graphs = {}
            for v, on in variants.items():
                pdl.DEPENDENT_LAUNCH = on
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
                    pdl.DEPENDENT_LAUNCH = True
                g.replay()
                torch.cuda.synchronize()
                graphs[v] = (g, out.clone())
            diff = (graphs["pdl"][1] - graphs["plain"][1]).abs().max().item()
            scale = graphs["plain"][1].abs().max().item()
            times: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
            med = {v: statistics.median(t) for v, t in times.items()}
            print(f"ctx {ctx} B={bsz}: " + ", ".join(f"{v} {m:.3f} ms" for v, m in med.items())
                  + f"; logits max |diff| {diff:.3g} (max |logit| {scale:.3g})", flush=True)
            del graphs


if __name__ == "__main__":
    main()
