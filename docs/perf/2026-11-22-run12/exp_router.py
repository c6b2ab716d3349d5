"""The router alone at large steps: every (token block, split, selection step) against the cost
model's pick (`router.launch_config`). Graph replay of 4 calls on 4 inputs (67 MB at 4096
tokens: more than the L2). python3 exp_router.py [--compare] [tokens ...]
(--compare: only the current pick against the pick with 64-token blocks allowed, run 24)."""
import sys

import torch
import triton

import mla_func.kernels.router as router_mod
from mla_func.config import MLAConfig
from mla_func.kernels.router import LaunchConfig, launch_config, route_fused
from scripts.bench_common import graph_time_ms


def main() -> None:
    cfg = MLAConfig.preset("v2-lite")
    r = (torch.randn(64, 2048, device="cuda") * 2048**-0.5).float()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    compare = "--compare" in sys.argv
    sizes = [int(a) for a in sys.argv[1:] if a != "--compare"]
    for t in sizes or [1024, 4096, 8192]:
        xs = [torch.randn(t, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        default = launch_config(t, 64, 2048, 8)
        want = [route_fused(x, r, None, cfg) for x in xs]
        cands = [default]
        if compare:  # the pick of the cost model with 64-token blocks allowed (the old one)
            kept = router_mod._BLOCK_TS
            router_mod._BLOCK_TS = (16, 32, 64, 128)
            launch_config.cache_clear()
            cands.append(launch_config(t, 64, 2048, 8))
            router_mod._BLOCK_TS = kept
            launch_config.cache_clear()
        for bt in () if compare else (32, 64, 128):
            blocks = -(-t // bt)
            for ns in (1, 2, 4, 8):
                if ns > 1 and blocks > 256:
                    continue
                for st in sorted({16, bt}):
                    if st > bt:
                        continue
                    bs = min(max(2048 // (st * 64), 1), triton.next_power_of_2(ns))
                    cands.append(LaunchConfig(bt, 64, 32, 2048 // ns, ns, blocks, st, bs))
        res = []
        for c in dict.fromkeys(cands):
            router_mod.launch_config = lambda *a, c=c: c
            try:
                got = [route_fused(x, r, None, cfg) for x in xs]
                same = all(torch.equal(g[1], w[1]) for g, w in zip(got, want, strict=True))
                us = graph_time_ms(lambda: [route_fused(x, r, None, cfg) for x in xs]) * 1e3 / 4
            except Exception as err:  # noqa: BLE001
                print(f"  t={t} {c}: {type(err).__name__}", flush=True)
                continue
            finally:
                router_mod.launch_config = launch_config
            res.append((us, c))
            print(f"  t={t} {us:7.1f} us ids_equal={same} bt={c.block_t} split={c.n_split} "
                  f"sel={c.sel_t} bs={c.block_s}{'  (default)' if c == default else ''}"
              f"{'  (old pick)' if compare and c != default else ''}",
                  flush=True)
        best = min(res, key=lambda x: x[0])
        print(f"## t={t} default {res[0][0]:.1f} us, best {best[0]:.1f} us: {best[1]}", flush=True)


if __name__ == "__main__":
    main()
