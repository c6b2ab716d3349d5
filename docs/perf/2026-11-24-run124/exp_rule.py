"""`decode_plan.TWO_WAVE_KEYS` (one wave of split programs where two would give splits under
256 keys of capacity) against the plan before it (two waves always: TWO_WAVE_KEYS = 0 while
capturing), 2026-11-24, twenty-second session. V2-Lite whole-step graphs (plain
`torch.cuda.graph` around `forward`), one process, alternating rounds, ms synced / back to
back, logits against the rule's; rows whose two plans are the same are skipped:

    PYTHONPATH=. python3 exp_rule.py [--batch 4 8 16 32 64] [--ctx 512] [--max-pages 9]
"""

import argparse
import math
import statistics

import torch

import mla_func as mf
import mla_func.kernels.decode_plan as decode_plan
from scripts.bench_common import cuda_time_ms, pipelined_ms
from scripts.bench_step import decode_batch

RULE = decode_plan.TWO_WAVE_KEYS


def capture(params, state, batch, keys: int):
    decode_plan.TWO_WAVE_KEYS = keys
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
        decode_plan.TWO_WAVE_KEYS = RULE
    g.replay()
    torch.cuda.synchronize()
    return g, out.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-pages", type=int, default=9)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    pages = max(args.batch) * math.ceil((args.ctx + 1) / 64) + 2
    state = mf.init_state(cfg, pages, 64, device="cuda", dtype=torch.bfloat16)
    state.cache.normal_()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, ctx {args.ctx}, page table {args.max_pages} pages")
    for bsz in args.batch:
        splits = {}
        for name, keys in (("rule", RULE), ("old", 0)):
            decode_plan.TWO_WAVE_KEYS = keys
            splits[name] = decode_plan.plan_decode(bsz, args.max_pages * 64, sms, 16).num_splits
        decode_plan.TWO_WAVE_KEYS = RULE
        if splits["rule"] == splits["old"]:
            print(f"B={bsz}: same plan ({splits['rule']} splits)", flush=True)
            continue
        batch = decode_batch(state, bsz, args.ctx, "triton", seed=bsz, max_pages=args.max_pages)
        graphs = {"rule": capture(params, state, batch, RULE),
                  "old": capture(params, state, batch, 0)}
        times: dict[str, list[float]] = {v: [] for v in graphs}
        back: dict[str, list[float]] = {v: [] for v in graphs}
        for r in range(args.rounds):
            for v in (("rule", "old") if r % 2 == 0 else ("old", "rule")):
                times[v].append(cuda_time_ms(graphs[v][0].replay, reps=30))
                back[v].append(pipelined_ms(graphs[v][0].replay))
        ref = graphs["rule"][1].float()
        for v in graphs:
            d = (graphs[v][1].float() - ref).abs().max().item()
            print(f"B={bsz} {v:4s} ({splits[v]:2d} splits) {statistics.median(times[v]):.3f} / "
                  f"{statistics.median(back[v]):.3f} ({min(back[v]):.3f}-{max(back[v]):.3f}) "
                  f"max diff {d:.3g}", flush=True)
        del graphs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
