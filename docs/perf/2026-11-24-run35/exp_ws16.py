"""The warp-specialised Gluon decode kernel (mla_decode_ws.py, 64 heads a program) at V2-Lite's
16 heads, the other 48 rows of its tiles padded (q_lat rows past the heads read as zeros by
TMA, every store masked), against the Triton split kernel's plan: split + merge µs
(`bench_kernels.time_plan`: CUDA graph, L2 flushed), and the two outputs compared (2026-11-24,
thirteenth session, run 45). The plans are made for the step's page-table capacity (129 pages
of 64), as in the whole-step graphs.

    PYTHONPATH=. python3 exp_ws16.py [--batch 8 32 128] [--ctx 1024 4096]
"""

import argparse

import torch

from mla_func.kernels import mla_decode
from mla_func.kernels.decode_plan import DecodeWorkspace, _ws_plan, num_sms, plan_decode
from scripts.bench_kernels import KV_LORA, decode_inputs, time_plan

mla_decode.ws_supported = lambda cache, heads, block_n: True  # 16 heads too


def o_lat(p, plan):
    batch, heads = p["q_nope"].shape[:2]
    ws = DecodeWorkspace()
    dev = torch.device("cuda")
    q_lat, out, part_o, part_lse = ws.get(dev, torch.bfloat16, batch, heads, KV_LORA,
                                          plan.num_splits)
    q_lat.copy_(torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"]))
    mla_decode.mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"],
                          p["positions"], p["scale"], plan, out, part_o, part_lse,
                          ws.counters(dev, batch * heads))
    return out.float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    args = ap.parse_args()
    sms = num_sms(torch.device("cuda"))
    capacity = 129 * 64
    print(f"# {torch.cuda.get_device_name()}")
    for ctx in args.ctx:
        for b in args.batch:
            p = decode_inputs(16, b, ctx, 64)
            tri = plan_decode(b, capacity, sms, 16)
            wsp = _ws_plan(b, capacity, sms, 16)
            a, w = o_lat(p, tri), o_lat(p, wsp)
            err = ((a - w).abs().max() / a.abs().max()).item()
            t_tri, t_ws = time_plan(p, tri), time_plan(p, wsp)
            mb = b * ctx * 576 * 2 / 1e6
            print(f"ctx {ctx} B={b}: Triton {tri.num_splits} splits x {tri.block_n} keys "
                  f"{t_tri:.1f} us ({mb / t_tri:.2f} TB/s), ws {wsp.num_splits} splits "
                  f"{t_ws:.1f} us ({mb / t_ws:.2f} TB/s); outputs rel diff {err:.2g}",
                  flush=True)


if __name__ == "__main__":
    main()
