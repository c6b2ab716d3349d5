"""Where the time of the MoE GEMM chain goes, Triton kernels against the warp-specialised
Gluon ones (moe_ws), each launch timed alone (triton.testing.do_bench, L2 flushed), V2-Lite,
random routing.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_moe_ws_parts.py
"""

import sys

import torch
import triton
from triton.testing import do_bench

from mla_func.kernels import moe_ws
from mla_func.kernels.fused_moe import _desc
from mla_func.kernels.moe_align import align
from mla_func.kernels.moe_config import pick_config
from mla_func.kernels.moe_gemm import down_kernel, gate_up_kernel, sum_kernel

E, H, INTER, K = 64, 2048, 1408, 6
bf = torch.bfloat16


def us(fn):
    return 1e3 * do_bench(fn, warmup=10, rep=80, return_mode="median")


def run(tokens: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(tokens, H, device="cuda", dtype=bf)
    w, ids = torch.softmax(torch.randn(tokens, E, device="cuda"), -1).topk(K, dim=-1)
    ids, w = ids.to(torch.int32).contiguous(), w.contiguous()
    gu = torch.randn(E, 2, INTER, H, device="cuda", dtype=bf) * H**-0.5
    dn = torch.randn(E, H, INTER, device="cuda", dtype=bf) * INTER**-0.5
    cfg = pick_config(tokens)
    bm = cfg.block_m
    layout = align(ids, E, 0, bm, False)
    srt, be, br = layout
    n_tiles = be.shape[0]
    live = int((br > 0).sum())
    rows = n_tiles * bm
    act = torch.empty(rows, INTER, device="cuda", dtype=bf)
    xs = torch.empty(rows, H, device="cuda", dtype=bf)
    buf_p = torch.empty(tokens * K, H, device="cuda", dtype=bf)
    buf_a = torch.empty(rows, H, device="cuda", dtype=bf)
    pos = torch.empty(tokens * K, dtype=torch.int32, device="cuda")
    out = torch.empty_like(x)
    tiles = (ids, *layout, tokens, K)
    common = dict(PAIRS_PER_TOKEN=K, BLOCK_M=bm, PRECISION="tf32")
    gbn, gbk, gw, gst = cfg.gate_up
    dbn, dbk, dw, dst = cfg.down

    def t_gate_up():
        gate_up_kernel[(triton.cdiv(INTER, gbn), n_tiles)](
            x, gu, gu, _desc(gu, [1, 2, gbn, gbk]), act, *tiles, INTER, H, E, x.stride(0),
            gu.stride(0), gu.stride(1), gu.stride(2), gu.stride(0), gu.stride(1), gu.stride(2),
            BLOCK_N=gbn, BLOCK_K=gbk, EVEN_K=True, DIRECT=False, **common, PDL=False, TMA=True,
            num_warps=gw, num_stages=gst)

    def t_down():
        down_kernel[(triton.cdiv(H, dbn), n_tiles)](
            act, dn, dn, _desc(act, [bm, dbk]), _desc(dn, [dbn, dbk]), buf_p, w, *tiles, H, INTER,
            E, dn.stride(0), dn.stride(1), dn.stride(0), dn.stride(1), BLOCK_N=dbn,
            BLOCK_K=dbk, EVEN_K=True, DIRECT=False, **common, TMA=True, num_warps=dw,
            num_stages=dst)

    def gather():
        moe_ws.gather_kernel[(rows, 1)](x, xs, srt, br, H, PAIRS_PER_TOKEN=K, BLOCK_M=bm,
                                         BLOCK=2048, num_warps=4)

    def ws_gate_up():
        moe_ws._launch(xs, gu.view(-1, H), act, layout, None, None, 0, K, 2 * INTER, INTER, bm, gbn,
                       True)

    def ws_down():
        moe_ws._launch(act, dn.view(-1, INTER), buf_a, layout, w, pos, K, K, H, 0, bm, dbn, False)

    def t_sum(p):
        sum_kernel[(tokens, 2)](buf_a if p else buf_p, out, out, pos, H, PAIRS_PER_TOKEN=K,
                                HAS_EXTRA=False, POS=p, BLOCK=1024, num_warps=4)

    gflop_gu = 2 * live * bm * H * 2 * INTER / 1e9
    gflop_dn = 2 * live * bm * INTER * H / 1e9
    res = {}
    for name, fn in (("triton gate_up", t_gate_up), ("gather", gather),
                     ("ws gate_up", ws_gate_up), ("triton down", t_down), ("ws down", ws_down),
                     ("sum", lambda: t_sum(False)), ("sum via pos", lambda: t_sum(True))):
        fn()
        torch.cuda.synchronize()
        res[name] = us(fn)
    for name, v in res.items():
        rate = gflop_gu if "gate_up" in name else gflop_dn if "down" in name else None
        extra = f"  {rate / v * 1e3:.0f} TFLOP/s on live tiles" if rate else ""
        print(f"## {tokens} tokens ({live} live tiles of {bm}): {name:15s} {v:7.1f} us{extra}",
              flush=True)


for t in [int(t) for t in sys.argv[1:]] or [1024, 4096]:
    run(t)
