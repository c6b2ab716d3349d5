"""The router alone at large steps, after the 64-token blocks were dropped: the cost model's
pick (`router.launch_config`) against (token block, split, selection step) candidates, including
the split counts 3 and 5 and selection steps of 64 and 128 tokens that run 23
(docs/perf/2026-11-22-run12/exp_router.py) did not try. Graph replay of 4 calls on 4 inputs
(67 MB at 4096 tokens: more than the L2); ids are checked against the pick's.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/exp_router2.py [tokens]
"""

import sys

import torch
import triton

import mla_func.kernels.router as router_mod
from mla_func.config import MLAConfig
from mla_func.kernels.router import LaunchConfig, launch_config, route_fused
from scripts.bench_common import graph_time_ms

SPLITS = (1, 2, 4, 5, 8)
SELECT = {32: (16, 32), 128: (16, 64, 128)}


def main() -> None:
    cfg = MLAConfig.preset("v2-lite")
    r = (torch.randn(64, 2048, device="cuda") * 2048**-0.5).float()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    tiles = 2048 // 32
    for t in [int(a) for a in sys.argv[1:]] or [2048, 4096, 8192]:
        xs = [torch.randn(t, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        default = launch_config(t, 64, 2048, cfg.n_group or 1)
        want = [route_fused(x, r, None, cfg) for x in xs]
        cands = [default]
        for bt, sels in SELECT.items():
            blocks = -(-t // bt)
            for ns in SPLITS:
                per = -(-tiles // ns)
                if -(-tiles // per) != ns or (ns > 1 and blocks > 256):
                    continue
                for st in sels:
                    bs = min(max(2048 // (st * 64), 1), triton.next_power_of_2(ns))
                    cands.append(LaunchConfig(bt, 64, 32, per * 32, ns, blocks, st, bs))
        res = []
        for c in dict.fromkeys(cands):
            router_mod.launch_config = lambda *a, c=c: c
            try:
                got = [route_fused(x, r, None, cfg) for x in xs]
                same = all(torch.equal(g[1], w[1]) for g, w in zip(got, want, strict=True))
                us = graph_time_ms(lambda xs=xs: [route_fused(x, r, None, cfg) for x in xs])
                us = us * 1e3 / 4
            except Exception as err:  # noqa: BLE001  (a candidate that cannot run is reported)
                print(f"  t={t} {c}: {type(err).__name__}", flush=True)
                continue
            finally:
                router_mod.launch_config = launch_config
            res.append((us, c))
            print(f"  t={t} {us:7.1f} us ids_equal={same} bt={c.block_t} split={c.n_split} "
                  f"sel={c.sel_t} bs={c.block_s}{'  (default)' if c == default else ''}",
                  flush=True)
        best = min(res, key=lambda x: x[0])
        print(f"## t={t} default {res[0][0]:.1f} us, best {best[0]:.1f} us: {best[1]}",
              flush=True)


if __name__ == "__main__":
    main()
