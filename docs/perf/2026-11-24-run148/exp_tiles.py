"""The MoE's tiles at a few decode rows (runs 148-154: 1-8, 16, 32 and 128), re-measured in
the whole step (twenty-sixth session, 2026-11-24). `moe_config.CONFIGS` took its 1-16-token
rows from sweeps of the layer alone on an H200 (2026-11-22), before the last-sum tail and the
deferred norm; here each variant replaces the row of the batch's token count while the step
is captured ("old": the rows before this session, up to 8 tokens). V2-Lite
whole-step graphs (plain `torch.cuda.graph` around `forward`), one process, alternating
rounds, ms synced / back to back, and each variant's logits against the tree's:

    PYTHONPATH=. python3 exp_tiles.py [--batch 1 2 4] [--ctx 512] [--rounds 6] [--only A B]

A variant is gate_up (N, K, warps, stages) and down (N, K, warps, stages); the rest of the
row (direct layout, PDL, last_sum at one row) stays the tree's.
"""

import argparse
import math
import statistics
from dataclasses import replace

import torch

import mla_func as mf
import mla_func.kernels.fused_moe as fused_moe
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

# name: (gate_up tile, down tile); None keeps the tree's.
VARIANTS = {
    "tree": (None, None),
    "gu16": ((16, 128, 4, 4), None),
    "gu64": ((64, 128, 4, 4), None),
    "gu32k64s6": ((32, 64, 4, 6), None),
    "gu32k256s3": ((32, 256, 4, 3), None),
    "gu32w2": ((32, 128, 2, 4), None),
    "dn32": (None, (32, 128, 4, 4)),
    "dn128": (None, (128, 128, 4, 4)),
    "dn64k64s6": (None, (64, 64, 4, 6)),
    "dn64k256s3": (None, (64, 256, 4, 3)),
    "dn64w8": (None, (64, 128, 8, 4)),
    "dn32w2": (None, (32, 128, 2, 4)),
    # run 149: around run 148's best
    "gu32w1": ((32, 128, 1, 4), None),
    "gu32w2s3": ((32, 128, 2, 3), None),
    "gu32w2s5": ((32, 128, 2, 5), None),
    "dn32s3": (None, (32, 128, 4, 3)),
    "dn128w8": (None, (128, 128, 8, 4)),
    "gu32w2+dn32": ((32, 128, 2, 4), (32, 128, 4, 4)),
    "gu32w2+dn64w8": ((32, 128, 2, 4), (64, 128, 8, 4)),
    # run 150: the candidates, and 8 rows
    "gu32w2s3+dn32s3": ((32, 128, 2, 3), (32, 128, 4, 3)),
    "gu32w2s3+dn32": ((32, 128, 2, 3), (32, 128, 4, 4)),
    "gu32w2+dn128": ((32, 128, 2, 4), (128, 128, 4, 4)),
    "dn128s3": (None, (128, 128, 4, 3)),
    "gu32k256w2": ((32, 256, 2, 3), None),
    # run 153: 32 and 128 rows
    "gu128w4": ((128, 128, 4, 3), None),
    "dn64w2": (None, (64, 128, 2, 3)),
    "old": (None, None),  # run 151: the table's tiles before this session (OLD below)
}
# The 1-8-token rows' tiles before this session's change (the H200 sweep of 2026-11-22).
OLD = {1: ((32, 128, 4, 4), (64, 128, 4, 4)), 2: ((32, 128, 4, 4), (128, 64, 4, 4)),
       4: ((32, 128, 4, 4), (64, 64, 4, 4)), 8: ((32, 256, 4, 3), (64, 128, 4, 3))}


def graph_of(params, state, batch):
    """A whole-step graph of `forward` (warmed up on a side stream) and its logits."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            mf.forward(params, state, batch)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = mf.forward(params, state, batch)
    return g, out


def capture(params, state, batch, tokens: int, variant: str):
    if variant == "old":  # the old row that covered this count (none past 8: the tree's)
        gu, dn = OLD[min((b for b in OLD if b >= tokens), default=max(OLD))] if tokens <= 8 \
            else (None, None)
    else:
        gu, dn = VARIANTS[variant]
    tree = pick_config(tokens)
    cfg = replace(tree, gate_up=gu or tree.gate_up, down=dn or tree.down)
    fused_moe.pick_config = lambda t: cfg if t == tokens else pick_config(t)
    try:
        return graph_of(params, state, batch)
    finally:
        fused_moe.pick_config = pick_config


def compare(capture_one, names: list[str], rounds: int, label: str, width: int) -> None:
    """Capture each variant (`capture_one(name)` -> (graph, logits); "tree" first), replay them
    in alternating rounds and print ms synced / back to back and the logits against the tree's
    (exp_warps.py uses it too)."""
    graphs = {}
    for v in names:
        try:
            graphs[v] = capture_one(v)
        except Exception as err:  # noqa: BLE001  (a variant that does not compile)
            print(f"  {v}: {type(err).__name__}: {err}"[:300], flush=True)
    for v in graphs:
        graphs[v][0].replay()
    torch.cuda.synchronize()
    ref = graphs["tree"][1]
    times: dict[str, list[float]] = {v: [] for v in graphs}
    back: dict[str, list[float]] = {v: [] for v in graphs}
    order = list(graphs)
    for r in range(rounds):
        for v in (order if r % 2 == 0 else order[::-1]):
            times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
            back[v].append(pipelined_ms(graphs[v][0].replay))
    for v in graphs:
        out = graphs[v][1]
        print(f"{label} {v:{width}s} {statistics.median(times[v]):.3f} / "
              f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-{max(back[v]):.3f})  "
              f"max|d| {(out - ref).abs().max().item():.3g} "
              f"argmax equal {torch.equal(out.argmax(-1), ref.argmax(-1))}", flush=True)
    del graphs
    torch.cuda.empty_cache()


def sweep(variants: dict, capture, width: int, batch: list[int], ctx: list[int],
          header=None) -> None:
    """The command line (--batch, --ctx, --rounds, --only), V2-Lite with a random cache, and
    at each context and batch `compare` of the variants `capture(params, state, batch, rows,
    name)` captures; `header(rows)` is printed first (exp_warps.py uses it too)."""
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=batch)
    p.add_argument("--ctx", type=int, nargs="+", default=ctx)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--only", nargs="+", default=list(variants))
    args = p.parse_args()
    names = ["tree"] + [v for v in args.only if v != "tree"]
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((max(args.ctx) + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    print(f"# {torch.cuda.get_device_name()}")
    for c in args.ctx:
        max_pages = math.ceil((c + 1) / 64)
        for bsz in args.batch:
            b = decode_batch(state, bsz, c, "triton", seed=bsz, max_pages=max_pages)
            label = f"ctx {c} B={bsz}"
            if header is not None:
                print(f"{label}: {header(bsz)}", flush=True)
            compare(lambda v, b=b, n=bsz: capture(params, state, b, n, v), names, args.rounds,
                    label, width)


def main() -> None:
    sweep(VARIANTS, capture, 13, batch=[1, 2, 4], ctx=[512],
          header=lambda rows: f"tree row {pick_config(rows)}")


if __name__ == "__main__":
    main()
