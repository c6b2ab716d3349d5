"""The value up-projection o[t, h] = o_lat[h, t] . W_UV[h]^T (16 heads, 512 -> 128, bf16):
cuBLAS bmm against absorb_v's Triton kernel at two column blocks, per token count. Each
variant: a CUDA graph of 27 launches on 27 layers' weights (as in a decode step), µs per
launch, median of 5 replays. The kernel was not kept: apply absorb_v.patch (beside this file)
to run it.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run21/exp_absorb_v.py
"""

import torch

from mla_func.kernels.absorb_v import _absorb_v_kernel, absorb_v_launch

H, V, C, LAYERS = 16, 128, 512, 27
bf = torch.bfloat16
w = [torch.randn(H, V, C, device="cuda", dtype=bf) * C**-0.5 for _ in range(LAYERS)]


def graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAYERS)
    return sorted(times)[2]


for tokens in (1, 2, 4, 8, 16, 32, 64, 128):
    o_lat = torch.randn(H, tokens, C, device="cuda", dtype=bf)
    o = torch.empty(tokens, H, V, device="cuda", dtype=bf)
    want = torch.bmm(o_lat, w[-1].transpose(1, 2)).transpose(0, 1)  # the last launch's

    def bmm(o_lat=o_lat, o=o):
        for wl in w:
            torch.bmm(o_lat, wl.transpose(1, 2), out=o.transpose(0, 1))

    def triton_v(block_v, o_lat=o_lat, o=o):
        launches = [absorb_v_launch(o_lat, wl, o, block_v) for wl in w]

        def run():
            for grid, args, kwargs in launches:
                _absorb_v_kernel[grid](*args, **kwargs)
        return run

    row = {"bmm": graph_us(bmm)}
    for bv in (16, 32, 64):
        fn = triton_v(bv)
        row[f"triton v{bv}"] = graph_us(fn)
        torch.testing.assert_close(o.float(), want.float(), rtol=2e-2, atol=2e-2)
    print(f"## {tokens:3d} tokens: " + "  ".join(f"{k} {v:5.2f}" for k, v in row.items()),
          flush=True)
