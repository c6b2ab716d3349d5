"""MoE at large token counts: tile / TMA candidates side by side, and a per-kernel breakdown.

Run from the repository root: PYTHONPATH=.:/tmp/site python3 docs/perf/.../exp_moe.py 4096 1024
"""
import sys
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import MoEConfig, pick_config
from scripts.bench_common import measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us


def candidates(t: int) -> list[MoEConfig]:
    base = pick_config(t)
    out = [base, replace(base, tma=True, fuse_shared=False)]
    for bm, gu, dn in [
        (128, (128, 64, 8, 4), (128, 64, 8, 4)),
        (128, (128, 64, 8, 4), (256, 64, 8, 3)),
        (128, (128, 64, 8, 4), (128, 128, 8, 3)),
        (128, (128, 64, 8, 3), (128, 64, 8, 3)),
        (128, (128, 64, 8, 3), (256, 64, 8, 3)),
        (64, (128, 64, 4, 4), (128, 64, 4, 4)),
        (64, (128, 64, 4, 4), (256, 64, 8, 3)),
    ]:
        c = MoEConfig(bm, gu, dn, fuse_shared=False)
        out += [c, replace(c, tma=True)]
        if t <= 1024:
            out.append(replace(c, fuse_shared=True))
    return list(dict.fromkeys(out))


def breakdown(x, layer, cfg, c) -> None:
    fused_layer(x, layer, cfg, c)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fused_layer(x, layer, cfg, c)
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            rows[e.name[:60]] = rows.get(e.name[:60], 0.0) + e.device_time / 3
    for name, us in sorted(rows.items(), key=lambda r: -r[1])[:12]:
        print(f"    {name:60s} {us:8.1f} us")


def main() -> None:
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s, "
          f"matmul {ceil['matmul_tflops']:.0f} TFLOP/s", flush=True)
    layers = make_layers(cfg, 4)
    for t in [int(a) for a in sys.argv[1:]] or [4096]:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        ref = fused_layer(x, layers[0], cfg).float()
        res = []
        for c in candidates(t):
            fn = lambda x, lay, cf, c=c: fused_layer(x, lay, cf, c)  # noqa: E731
            us = time_layer_us(fn, x, layers, cfg)
            err = ((fn(x, layers[0], cfg).float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 0.02:
                print(f"  WRONG err {err:.3g} {c}")
                us = None
            res.append((us, c))
            print(f"  t={t} {'-' if us is None else f'{us:8.1f}'} us "
                  f"{'' if us is None else f'{us / floor:5.2f}x'} err {err:.1e} {c}", flush=True)
        ok = sorted((r for r in res if r[0] is not None), key=lambda r: r[0])
        print(f"## t={t} floor {floor:.1f} us; default {res[0][0]:.1f}; best {ok[0][0]:.1f} "
              f"({ok[0][0] / floor:.2f}x) {ok[0][1]}")
        for label, c in (("default", res[0][1]), ("best", ok[0][1])):
            print(f"  breakdown {label} (eager, per call):")
            breakdown(x, layers[0], cfg, c)


if __name__ == "__main__":
    main()
