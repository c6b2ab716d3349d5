"""Does a hand-written warp-specialised Gluon GEMM (gluon_ws.py) run on this Hopper GPU with
Triton 3.6, and is it faster than cuBLAS / the project's Triton MoE down kernel? Each case runs
in its own process with a time limit (Triton's automatic Hopper specialisation hung, run 10-11).

Cases: `small` (correctness, 1024 x 512 x 2048), `dense` (the 4096-token MoE GEMM shapes over
all aligned rows, against torch.matmul), `grouped` (the 4096-token down GEMM on the aligned
layout of a random routing, against `moe_gemm.down_kernel` with the config table's tiles).

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_gluon.py
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CASE = r'''
import sys, torch, triton
sys.path.insert(0, HERE)
from triton.testing import do_bench
import gluon_ws as g

torch.manual_seed(0)
case, bm, bn, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pp, epi = sys.argv[5] == "1", sys.argv[6] == "1"
kw = dict(block_m=bm, block_n=bn, stages=stages, pingpong=pp, epi_tma=epi)
tag = f"bm={bm} bn={bn} st={stages} pp={int(pp)} epi_tma={int(epi)}"
dev = "cuda"
bf = torch.bfloat16

def t_us(fn):
    return 1e3 * do_bench(fn, warmup=10, rep=60, return_mode="median")

if case == "small":
    a = torch.randn(1024, 2048, device=dev, dtype=bf)
    b = torch.randn(512, 2048, device=dev, dtype=bf)
    c = torch.full((1024, 512), float("nan"), device=dev, dtype=bf)
    g.ws_gemm(a, b, c, **kw)
    torch.cuda.synchronize()
    ref = (a.float() @ b.float().T)
    err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
    print(f"RESULT small {tag} rel_err={err:.2e} {'OK' if err < 1e-2 else 'WRONG'}")
elif case == "dense":
    for name, m, n, k in (("down", 29184, 2048, 1408), ("gate_up", 29184, 2816, 2048)):
        a = torch.randn(m, k, device=dev, dtype=bf)
        b = torch.randn(n, k, device=dev, dtype=bf) / k ** 0.5
        c = torch.empty(m, n, device=dev, dtype=bf)
        g.ws_gemm(a, b, c, **kw)
        ref = a @ b.T
        err = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        flop = 2 * m * n * k
        us_g = t_us(lambda: g.ws_gemm(a, b, c, **kw))
        us_c = t_us(lambda: torch.matmul(a, b.T, out=ref))
        print(f"RESULT dense {name} {tag} gluon {us_g:7.1f} us "
              f"{flop / us_g / 1e6:5.0f} TFLOP/s  cublas {us_c:7.1f} us "
              f"{flop / us_c / 1e6:5.0f} TFLOP/s  rel_err={err:.1e}")
elif case == "grouped":
    from mla_func.kernels.fused_moe import _desc
    from mla_func.kernels.moe_align import align
    from mla_func.kernels.moe_config import pick_config
    from mla_func.kernels.moe_gemm import down_kernel
    tokens, topk, E, H, I = 4096, 6, 64, 2048, 1408
    logits = torch.randn(tokens, E, device=dev)
    w, ids = torch.softmax(logits, -1).topk(topk, dim=-1)
    ids = ids.to(torch.int32).contiguous()
    w = w.contiguous()
    cfg = pick_config(tokens)
    tbm = cfg.block_m
    srt, be, br = align(ids, E, 0, tbm, False)
    n_tiles = be.shape[0]
    act = torch.randn(n_tiles * tbm, I, device=dev, dtype=bf)
    down = torch.randn(E, H, I, device=dev, dtype=bf) / I ** 0.5
    out_t = torch.full((tokens * topk, H), float("nan"), device=dev, dtype=bf)
    out_g = torch.full((tokens * topk, H), float("nan"), device=dev, dtype=bf)
    tbn, tbk, warps, tst = cfg.down
    def triton_down():
        descs = (_desc(act, [tbm, tbk]), _desc(down, [tbn, tbk]))
        down_kernel[(triton.cdiv(H, tbn), n_tiles)](
            act, down, down, *descs, out_t, w, ids, srt, be, br, tokens, topk, H, I, E,
            down.stride(0), down.stride(1), down.stride(0), down.stride(1),
            PAIRS_PER_TOKEN=topk, BLOCK_M=tbm, BLOCK_N=tbn, BLOCK_K=tbk, EVEN_K=I % tbk == 0,
            DIRECT=False, PRECISION="tf32", TMA=True, num_warps=warps, num_stages=tst)
    if bm == tbm:
        act_g, grouped = act, (be, br, srt, w, topk, topk)
    else:  # another tile height: its own alignment, the same rows of act per pair
        srt_g, be_g, br_g = align(ids, E, 0, bm, False)
        act_g = torch.zeros(be_g.shape[0] * bm, I, device=dev, dtype=bf)
        pos = torch.full((tokens * topk,), -1, device=dev, dtype=torch.long)
        live = torch.arange(n_tiles * tbm, device=dev) % tbm < br.repeat_interleave(tbm)
        pos[srt.long()[live]] = torch.arange(n_tiles * tbm, device=dev)[live]
        live_g = torch.arange(be_g.shape[0] * bm, device=dev) % bm < br_g.repeat_interleave(bm)
        act_g[live_g] = act[pos[srt_g.long()[live_g]]]
        grouped = (be_g, br_g, srt_g, w, topk, topk)
    def gluon_down():
        g.ws_gemm(act_g, down.view(E * H, I), out_g, grouped=grouped, **kw)
    triton_down(); gluon_down(); torch.cuda.synchronize()
    err = ((out_g.float() - out_t.float()).abs().max() / out_t.float().abs().max()).item()
    rows = int(br.sum())
    flop = 2 * int((grouped[1] > 0).sum()) * bm * H * I
    us_t, us_g = t_us(triton_down), t_us(gluon_down)
    us_t2, us_g2 = t_us(triton_down), t_us(gluon_down)
    print(f"RESULT grouped down 4096 tokens ({n_tiles} tiles, {rows} real rows) {tag}: "
          f"triton {us_t:6.1f}/{us_t2:6.1f} us, gluon {us_g:6.1f}/{us_g2:6.1f} us "
          f"({flop / min(us_g, us_g2) / 1e6:4.0f} TFLOP/s on live tiles) rel_diff={err:.1e} "
          f"{'OK' if err < 2e-2 else 'WRONG'}")
'''


def main() -> None:
    # (case, block_m, block_n, stages, ping-pong, TMA-store epilogue)
    cases = [("small", 128, 128, 4, 1, 1), ("small", 128, 128, 4, 1, 0),
             ("small", 64, 256, 4, 1, 0), ("small", 128, 256, 3, 0, 1),
             ("dense", 128, 256, 3, 0, 1), ("dense", 128, 128, 4, 1, 1),
             ("dense", 128, 128, 4, 1, 0), ("dense", 64, 256, 4, 1, 1),
             ("grouped", 128, 256, 4, 0, 0), ("grouped", 128, 128, 4, 1, 0),
             ("grouped", 64, 256, 4, 1, 0), ("grouped", 64, 256, 3, 1, 0)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), HERE,
                                                        os.environ.get("PYTHONPATH", "")])}
    script = CASE.replace("HERE", repr(HERE))
    for case, *fields in cases:
        try:
            out = subprocess.run([sys.executable, "-c", script, case, *map(str, fields)],
                                 capture_output=True, text=True, timeout=120, env=env)
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
            print("\n".join(lines) if lines else f"{case} {fields}: no result, "
                  f"rc={out.returncode}: {out.stderr.strip()[-600:]}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"{case} {fields}: HUNG (120 s limit)", flush=True)


if __name__ == "__main__":
    main()
