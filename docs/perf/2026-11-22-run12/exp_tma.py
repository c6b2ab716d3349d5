"""TMA on and off for the table's configs (and a few 128-token tiles), timed twice in
alternation: python3 exp_tma.py [tokens ...]

Run 21 ran it on a working tree whose kernels also read the folded shared experts through TMA
(one K loop per descriptor). TMA was slower at every size from 8 to 512 tokens, and the two
loops doubled the shared memory of the large tiles (out of resources at 4096 tokens), so that
change was not kept: on the committed code `tma=True` with folded shared experts raises."""
import sys
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import MoEConfig, pick_config
from scripts.bench_common import measure_ceilings
from scripts.bench_moe import floor_us, fused_layer, make_layers, time_layer_us


def main() -> None:
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    ceil = measure_ceilings()
    print(f"# {torch.cuda.get_device_name()}: copy {ceil['copy_gbs']:.0f} GB/s", flush=True)
    layers = make_layers(cfg, 4)
    for t in [int(a) for a in sys.argv[1:]] or [8, 32, 128, 256, 512]:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        floor, _ = floor_us(x, layers, cfg, ceil)
        base = pick_config(t)
        cands = [base, replace(base, tma=True)]
        if t == 128:
            for gu, dn in (((32, 128, 4, 5), (128, 128, 8, 3)), ((32, 128, 4, 4), (128, 128, 8, 4)),
                           ((64, 128, 4, 4), (128, 128, 8, 3)), ((32, 256, 4, 3), (128, 64, 8, 4))):
                c = MoEConfig(16, gu, dn, pdl=True)
                cands += [c, replace(c, tma=True)]
        ref = fused_layer(x, layers[0], cfg, base).float()
        times: dict[MoEConfig, list[float]] = {c: [] for c in cands}
        for _ in range(2):
            for c in cands:
                fn = lambda x, lay, cf, c=c: fused_layer(x, lay, cf, c)  # noqa: E731
                us = time_layer_us(fn, x, layers, cfg)
                got = fn(x, layers[0], cfg).float()
                if not ((got - ref).abs().max() / ref.abs().max()).item() < 0.02:
                    print(f"  WRONG {c}")
                    us = float("nan")
                times[c].append(us)
        for c, us in times.items():
            print(f"  t={t:5d} {min(us):7.1f} us {min(us) / floor:5.3f}x  ({us[0]:.1f}, {us[1]:.1f})"
                  f"  tma={c.tma} bm={c.block_m} gu={c.gate_up} dn={c.down}", flush=True)


if __name__ == "__main__":
    main()
