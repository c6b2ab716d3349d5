"""The warp-specialised decode kernel (128 heads) launched early behind the absorb + prologue
kernel (`DecodePlan.early`, this session: its loader loads the first tiles of old rows, then
waits for the absorb kernel and loads q_lat) against launched after it: the attention of one
decode layer as the step runs it (`attend_absorbed` with the new rows: absorb + prologue,
split, merge and the W_UV product), in a CUDA graph, µs (do_bench, L2 flushed), medians of
alternating rounds (2026-11-24, thirteenth session, run 49).

    PYTHONPATH=.:tests python3 exp_ws_early.py [--batch 1 8 32 128] [--ctx 1024 4096] [--uv]
"""

import argparse
import statistics
from dataclasses import replace

import torch
import triton.testing
from mla_helpers import make_problem, ref_args

from mla_func.kernels.absorb import NewRows
from mla_func.kernels.mla_decode import DecodeWorkspace, attend_absorbed, num_sms, plan_decode


def graph_us(fn) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--uv", action="store_true",
                    help="run 55: the merge fused with W_UV (the plan's) against merge + bmm")
    args = ap.parse_args()
    dims = {"heads": args.heads, "nope": 128, "rope": 64, "v": 128, "kv_lora": 512}
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for b in args.batch:
            p = make_problem([ctx - 1] * b, [1] * b, 64, dims, "cuda", torch.bfloat16,
                             max_pages=8192 // 64 + 1)
            t, latent = b, dims["kv_lora"] + dims["rope"]
            pos = p["positions"].long()
            slots = (p["page_table"][p["token_seq"].long(), pos // 64].long() * 64
                     + pos % 64).to(torch.int32)
            kv = torch.randn(t, latent, device="cuda").to(torch.bfloat16)
            kv_norm = torch.ones(dims["kv_lora"], device="cuda", dtype=torch.bfloat16)
            rope = dims["rope"]
            inv_freq = (1.0 / 1e4 ** (torch.arange(0, rope, 2).float() / rope)
                        ).repeat_interleave(2).cuda()
            new = NewRows(p["q_pe"], kv, slots, p["positions"], kv_norm, inv_freq, 1.0, 1e-6)
            plan = plan_decode(b, p["page_table"].shape[1] * 64, num_sms(torch.device("cuda")),
                               args.heads, page_size=64, ws=True)
            plans = {"early": plan, "plain": replace(plan, early=False)}
            if args.uv:
                plans = {"early": plan, "plain": replace(plan, uv=not plan.uv)}
            outs, times = {}, {k: [] for k in plans}
            for name, pl in plans.items():
                ws = DecodeWorkspace()
                outs[name] = attend_absorbed(p["q_nope"], None, *ref_args(p)[2:], ws, pl,
                                             new=new).clone()
            for r in range(args.rounds):
                for name in (plans if r % 2 == 0 else list(plans)[::-1]):
                    ws = DecodeWorkspace()
                    fn = (lambda pl=plans[name], ws=ws: attend_absorbed(
                        p["q_nope"], None, *ref_args(p)[2:], ws, pl, new=new))
                    times[name].append(graph_us(fn))
            same = torch.equal(outs["early"], outs["plain"])
            diff = ((outs["early"].float() - outs["plain"].float()).abs().max()
                    / outs["plain"].float().abs().max()).item()
            names = (f"uv {plan.uv}", f"uv {not plan.uv}") if args.uv else ("early", "plain")
            print(f"ctx {ctx} B={b} ({'ws' if plan.ws else 'Triton'}, {plan.num_splits} "
                  f"splits): {names[0]} {statistics.median(times['early']):.1f} us, "
                  f"{names[1]} {statistics.median(times['plain']):.1f} us; outputs equal: "
                  f"{same} (rel diff {diff:.2g})", flush=True)


if __name__ == "__main__":
    main()
