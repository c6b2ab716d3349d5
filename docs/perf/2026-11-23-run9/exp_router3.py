"""The router's cost model with whole waves (`share` = programs per SM rounded up, run 13 showed
a partial second wave costing a whole one: 4096 tokens, 160 programs at 5 splits 38.0 us
against 128 programs at 4 splits 25.6 us) against the current model, at every V2-Lite and V3
size where the two picks differ. Graph replay of 4 calls on 4 inputs; ids compared.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/exp_router3.py
"""

import inspect

import torch

import mla_func.kernels.router as router_mod
from mla_func.config import MLAConfig
from mla_func.kernels.router import launch_config, route_fused
from scripts.bench_common import graph_time_ms

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
OLD = "            share = max(1.0, blocks * n_split / _SMS)"
NEW = "            share = float(-(-blocks * n_split // _SMS))"


def waves_model():
    """`launch_config` with `share` in whole waves, or None where the tree already has it."""
    src = inspect.getsource(launch_config.__wrapped__)
    if OLD not in src:
        return None
    scope = dict(vars(router_mod))
    exec(src.replace(OLD, NEW), scope)  # noqa: S102  (this file's own experiment)
    return scope["launch_config"]


def timed(c, xs, r, bias, cfg):
    router_mod.launch_config = lambda *a: c
    try:
        ids = [route_fused(x, r, bias, cfg)[1] for x in xs]
        us = graph_time_ms(lambda: [route_fused(x, r, bias, cfg) for x in xs]) * 1e3 / 4
    finally:
        router_mod.launch_config = launch_config
    return us, ids


def main() -> None:
    new_model = waves_model()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for preset in ("v2-lite", "v3"):
        cfg = MLAConfig.preset(preset)
        e, h, g = cfg.n_routed_experts, cfg.hidden_size, cfg.n_group or 1
        r = (torch.randn(e, h, device="cuda") * h**-0.5).float()
        bias = torch.randn(e, device="cuda") * 0.01 if cfg.topk_method == "noaux_tc" else None
        for t in SIZES:
            old, new = launch_config(t, e, h, g), new_model(t, e, h, g)
            if old == new:
                continue
            xs = [torch.randn(t, h, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            res = {}
            for name, c in (("old", old), ("new", new), ("old2", old), ("new2", new)):
                res[name] = timed(c, xs, r, bias, cfg)
            same = all(torch.equal(a, b) for a, b in zip(res["old"][1], res["new"][1],
                                                         strict=True))
            print(f"{preset} t={t}: old {res['old'][0]:.1f}/{res['old2'][0]:.1f} us "
                  f"(bt={old.block_t} split={old.n_split} sel={old.sel_t}), new "
                  f"{res['new'][0]:.1f}/{res['new2'][0]:.1f} us (bt={new.block_t} "
                  f"split={new.n_split} sel={new.sel_t}), ids_equal={same}", flush=True)


if __name__ == "__main__":
    main()
