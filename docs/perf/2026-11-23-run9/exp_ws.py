"""MoE layer (router + experts) at 1024-4096 V2-Lite tokens: the warp-specialised GEMMs
(`MoEConfig.warp_spec`, `kernels/moe_gemm_ws.py`) against the table's config, in CUDA graphs.

Variants per token count: `table` (`pick_config`), and `warp_spec` with the (N, K, warps,
stages) tiles of WS_TILES for gate_up and down (128-row tiles; warps per consumer group, so
12 warps a program in all). They alternate over ROUNDS rounds; medians are printed, with each
variant's largest difference to `table` (over its largest value) and whether the bits match.
Inputs and timing are `scripts/bench_moe.py`'s (`make_layers`, `fused_layer`,
`time_layer_us`: LAYERS distinct weight sets per graph, times per layer).

Needs the reverted attempt back first (`git apply docs/perf/2026-11-23-run9/ws_attempt.patch`):
both warp-specialised kernels hung on the H100 (runs 9-10), so the code is not in the tree.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/exp_ws.py [tokens]
"""

import statistics
import sys
import time
from dataclasses import replace

import torch

from mla_func.config import MLAConfig
from mla_func.kernels.moe_config import pick_config
from scripts.bench_common import print_table
from scripts.bench_moe import fused_layer, make_layers, time_layer_us

TOKENS = (1024, 2048, 4096)
ROUNDS = 3
LAYERS = 4
WS_TILES = {  # name: (gate_up tiles, down tiles)
    "ws_g64s4_d256s3": ((64, 64, 4, 4), (256, 64, 4, 3)),
    "ws_g128s3_d256s3": ((128, 64, 4, 3), (256, 64, 4, 3)),
    "ws_g128s4_d256s4": ((128, 64, 4, 4), (256, 64, 4, 4)),
    "ws_g64s4_d128s4": ((64, 64, 4, 4), (128, 64, 4, 4)),
}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("exp_ws needs a CUDA GPU")
    start = time.perf_counter()
    torch.manual_seed(0)
    cfg = MLAConfig.preset("v2-lite")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    layers = make_layers(cfg, LAYERS)
    rows = []
    for t in [int(a) for a in sys.argv[1:]] or TOKENS:
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        base = pick_config(t)
        configs = {"table": base} | {
            name: replace(base, tma=True, warp_spec=True, gate_up=g, down=d)
            for name, (g, d) in WS_TILES.items()}
        want = fused_layer(x, layers[0], cfg, base).float()
        check = {}
        for name, c in configs.items():
            try:
                got = fused_layer(x, layers[0], cfg, c).float()
            except Exception as err:  # noqa: BLE001  (a config that cannot run is reported)
                print(f"  {name}: {type(err).__name__}: {err}"[:300], flush=True)
                continue
            err = ((got - want).abs().max() / want.abs().max()).item()
            check[name] = (err, torch.equal(got, want))
        times: dict[str, list[float]] = {name: [] for name in check}
        for r in range(ROUNDS):
            for name in list(check) if r % 2 == 0 else list(check)[::-1]:
                fn = lambda x, lay, cf, c=configs[name]: fused_layer(x, lay, cf, c)  # noqa: E731
                us = time_layer_us(fn, x, layers, cfg)
                times[name].append(float("nan") if us is None else us)
        table = statistics.median(times["table"])
        for name in check:
            med = statistics.median(times[name])
            rows.append({"tokens": t, "variant": name, "us": med, "vs_table": med / table,
                         "err": check[name][0], "same_bits": check[name][1],
                         "rounds": ",".join(f"{u:.0f}" for u in times[name])})
        print(f"  t={t} done", flush=True)
    print_table(rows, ["tokens", "variant", "us", "vs_table", "err", "same_bits", "rounds"],
                f"MoE layer (v2-lite, bf16, router + experts), median of {ROUNDS} rounds")
    print(f"# {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
