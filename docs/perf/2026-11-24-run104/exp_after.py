"""Warm L2 after the split kernel ends (2026-11-24, twentieth session). From the split kernel's
end to the MoE's gate_up, a B=32 / 128 layer runs five latency-bound launches (merge, W_UV bmm,
o_proj, add + norm, router: ~23 us at B=128, run 71) that read ~10 MB: HBM idles. Earlier
prefetches ran while the split kernel read the cache and lost (runs 70, 82). Here the tile
merge's programs, after their wait for the split kernel (nothing else reads HBM then), issue
bulk L2 prefetches of what the layer reads next, then merge as before:

    uvo: W_UV + o_proj (10 MB);  sh: the shared experts' gate_up (23 MB);  all: both;
    shd: the shared gate_up + down (35 MB).

The merge is this file's copy of `mla_merge._merge_kernel` with the prefetch after its wait;
the plan is the tree's with `warm` set, so that the merge gets the layer's W_UV, from which
the layer (and its regions) is looked up. V2-Lite whole-step graphs in one process,
alternating rounds, ms synced / back to back, logits against the tree's:

    PYTHONPATH=. python3 exp_after.py [--batch 32 128] [--ctx 1024 4096] [--rounds 6]
"""

import argparse
import math
import statistics
from dataclasses import replace
from typing import no_type_check

import torch
import triton
import triton.language as tl

import mla_func as mf
import mla_func.kernels.mla_absorbed as absorbed
import mla_func.kernels.mla_decode as decode
from mla_func.kernels.l2_prefetch import prefetch_span
from mla_func.kernels.mla_merge import merge_shape, merge_tile, reached_splits
from mla_func.kernels.mla_merge import ACTIVE_MIN_SPLITS
from mla_func.params import MoE
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

TREE_PLAN = absorbed.plan_decode
TREE_MERGE = decode.launch_merge
VARIANTS = ("tree", "uvo", "sh", "all", "shd")


@triton.jit(do_not_specialize=["num_splits"])
@no_type_check
def _merge_after_kernel(
    part_o, part_lse, positions, out, w0, n0, w1, n1, w2, n2, so_h, so_t, heads, kv_lora,
    num_splits, MERGE_H: tl.constexpr, MERGE_C: tl.constexpr, SPLITS_P2: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, ACTIVE: tl.constexpr,
):
    part = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) \
        * tl.num_programs(2) + tl.program_id(2)
    parts = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * MERGE_H + tl.arange(0, MERGE_H)
    c = tl.program_id(2) * MERGE_C + tl.arange(0, MERGE_C)
    active = num_splits
    if ACTIVE:
        active = reached_splits(positions, t, num_splits, BLOCK_N)
    tl.extra.cuda.gdc_wait()
    prefetch_span(w0, n0, part, parts, 128)
    prefetch_span(w1, n1, part, parts, 128)
    prefetch_span(w2, n2, part, parts, 128)
    merge_tile(part_o, part_lse, out, t, h, h < heads, c, c < kv_lora, so_h, so_t, heads,
               kv_lora, num_splits, active, MERGE_H, MERGE_C, SPLITS_P2, CHUNK, "")


def regions(params, variant: str) -> dict[int, list[torch.Tensor]]:
    """W_UV's address -> what that layer's merge prefetches."""
    table = {}
    for layer in params.layers:
        mlp = layer.mlp
        shared = mlp.shared if isinstance(mlp, MoE) else mlp
        pick = {"uvo": [layer.attn.w_uv, layer.attn.o_proj],
                "sh": [shared.gate_up],
                "all": [layer.attn.w_uv, layer.attn.o_proj, shared.gate_up],
                "shd": [shared.gate_up, shared.down]}[variant]
        for w in pick:
            assert w.is_contiguous() and w.data_ptr() % 16 == 0
        table[layer.attn.w_uv.data_ptr()] = pick
    return table


def make_merge(table):
    def launch(merge, merge_heads, merge_cols, block_n, part_o, part_lse, positions, out,
               pdl=False, warm=None):
        if merge != "tile" or not pdl or warm is None:
            return TREE_MERGE(merge, merge_heads, merge_cols, block_n, part_o, part_lse,
                              positions, out, pdl, None)
        ws = table[warm.data_ptr()]
        args = []
        for i in range(3):
            w = ws[i] if i < len(ws) else part_lse
            args += [w, w.numel() * w.element_size() if i < len(ws) else 0]
        tokens, heads, splits, kv_lora = part_o.shape
        mh, mc, chunk = merge_shape(heads, kv_lora, splits, merge_heads, merge_cols)
        _merge_after_kernel[(tokens, triton.cdiv(heads, mh), triton.cdiv(kv_lora, mc))](
            part_o, part_lse, positions, out, *args, out.stride(0), out.stride(1), heads,
            kv_lora, splits, MERGE_H=mh, MERGE_C=mc, SPLITS_P2=triton.next_power_of_2(splits),
            CHUNK=chunk, BLOCK_N=block_n, ACTIVE=splits >= ACTIVE_MIN_SPLITS, num_warps=4,
            launch_pdl=True)
    return launch


def capture(params, state, batch, variant: str):
    if variant != "tree":
        absorbed.plan_decode = lambda *a, **k: replace(TREE_PLAN(*a, **k), warm=True)
        decode.launch_merge = make_merge(regions(params, variant))
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
        absorbed.plan_decode = TREE_PLAN
        decode.launch_merge = TREE_MERGE
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 130
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for ctx in args.ctx:
        for bsz in args.batch:
            batch = decode_batch(state, bsz, ctx, "triton", seed=bsz, max_pages=129)
            print(f"  plan: {TREE_PLAN(bsz, 129 * 64, 132)}", flush=True)
            names = ["tree"] + [v for v in args.variants if v != "tree"]
            graphs = {v: capture(params, state, batch, v) for v in names}
            times: dict[str, list[float]] = {v: [] for v in names}
            back: dict[str, list[float]] = {v: [] for v in names}
            for r in range(args.rounds):
                for v in (names if r % 2 == 0 else names[::-1]):
                    times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                    back[v].append(pipelined_ms(graphs[v][0].replay))
            print(f"ctx {ctx} B={bsz}, ms synced / back to back (back-to-back rounds), "
                  "logits against the tree's", flush=True)
            ref = graphs["tree"][1].float()
            for v in names:
                d = (graphs[v][1].float() - ref).abs().max().item()
                print(f"  {v:5s} {statistics.median(times[v]):.3f} / "
                      f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-"
                      f"{max(back[v]):.3f}) max diff {d:.3g}", flush=True)
            del graphs


if __name__ == "__main__":
    main()
