"""Decode step (V2-Lite, one whole-step CUDA graph of `forward`, ctx 1024) with the next
weights pulled into L2 while the attention runs, against the step as it is (GPU).

The attention op (absorb, split, merge, W_UV) leaves DRAM mostly idle at small batches; the
W_UV and o_proj products and the shared experts' gate_up (which the MoE starts first) follow
it. A wrapper around `model.attend` issues L2 prefetches of those weights first:
  main_*: one prefetch launch on the step's stream before the attention op (its programs
          issue cp.async.bulk.prefetch.L2 and exit; the loads go on in the background);
  side_*: the same launch on a side stream forked before the op and joined after it.
  *_all: W_UV + o_proj + shared gate_up; *_attn: W_UV + o_proj; *_shared: shared gate_up;
  *_line: prefetch.global.L2 per 128-byte line instead of bulk.
Medians of alternating rounds, ms.

    PYTHONPATH=. python3 exp_prefetch_step.py [--batch 1 32 128] [--rounds 4]
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl

import mla_func as mf
import mla_func.model as model
from mla_func.params import MoE
from scripts.bench_common import cuda_time_ms
from scripts.bench_step import decode_batch


@triton.jit
def _prefetch_kernel(p0, n0, p1, n1, p2, n2, LINES: tl.constexpr, STEP: tl.constexpr,
                     BULK: tl.constexpr):
    r = tl.program_id(1)
    base = tl.where(r == 0, p0, tl.where(r == 1, p1, p2))
    n = tl.where(r == 0, n0, tl.where(r == 1, n1, n2)).to(tl.int64)
    offs = (tl.program_id(0) * LINES + tl.arange(0, LINES)).to(tl.int64) * STEP
    addr = base + tl.minimum(offs, n - STEP)
    if BULK:
        tl.inline_asm_elementwise(
            "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
            [addr, tl.full([LINES], STEP, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [addr], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(tensors: list[torch.Tensor], bulk: bool) -> None:
    regions = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
    while len(regions) < 3:
        regions.append(regions[-1])
    step = 16384 if bulk else 128
    lines = 64 if bulk else 1024
    programs = max(triton.cdiv(triton.cdiv(n, step), lines) for _, n in regions)
    flat = [v for pn in regions for v in pn]
    _prefetch_kernel[(programs, len(tensors))](*flat, LINES=lines, STEP=step, BULK=bulk,
                                                 num_warps=2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=[
        "base", "main_all", "main_attn", "main_shared", "side_all", "main_all_line"])
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    state = mf.init_state(cfg, max(args.batch) * 17 + 130, 64, device="cuda",
                          dtype=torch.bfloat16)
    state.cache.normal_()
    attend = model.attend
    side = torch.cuda.Stream()

    def weights(layer: int, which: str) -> list[torch.Tensor]:
        ly = params.layers[layer]
        attn = [ly.attn.w_uv, ly.attn.o_proj]
        shared = [ly.mlp.shared.gate_up] if isinstance(ly.mlp, MoE) else []
        return {"all": attn + shared, "attn": attn, "shared": shared or attn}[which]

    def wrapped(variant: str):
        if variant == "base":
            return attend
        where, which, *rest = variant.split("_")
        bulk = not rest

        def run(*a, **k):
            ws = weights(a[4], which)
            if where == "main":
                prefetch(ws, bulk)
                return attend(*a, **k)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                prefetch(ws, bulk)
            out = attend(*a, **k)
            torch.cuda.current_stream().wait_stream(side)
            return out
        return run

    print(f"# {torch.cuda.get_device_name()}")
    for bsz in args.batch:
        batch = decode_batch(state, bsz, 1024, "triton", seed=bsz, max_pages=129)
        graphs, ref = {}, None
        for v in args.variants:
            model.attend = wrapped(v)
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        logits, _ = mf.forward(params, state, batch)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out, _ = mf.forward(params, state, batch)
            finally:
                model.attend = attend
            g.replay()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            assert torch.equal(out, ref), v  # a prefetch changes no value
            graphs[v] = (g, out)
        times: dict[str, list[float]] = {v: [] for v in args.variants}
        for r in range(args.rounds):
            order = args.variants if r % 2 == 0 else args.variants[::-1]
            for v in order:
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
        med = {v: statistics.median(t) for v, t in times.items()}
        print(f"B={bsz}: " + ", ".join(f"{v} {m:.3f}" for v, m in med.items()), flush=True)
        print("- rounds: " + "; ".join(f"{v} " + " ".join(f"{x:.3f}" for x in t)
                                       for v, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
