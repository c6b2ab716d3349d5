"""`bench moe --sweep`: tile configs of the fused MoE per token count (GPU only, through the
`time_case` that `bench_moe.run` hands in: it times a config in the layer's CUDA graph and
checks its output against the baseline's).

Tiles per block_m by coordinate descent; up to 4 tokens also the direct path, each GEMM's K
split (`MoEConfig.gate_up_split`, `down_split`) and the sum as the down GEMM's tail
(DIRECT_MAX_TOKENS). It prints each case as it is timed (a sweep cut short by a time limit
keeps those lines), then the best config per token count next to the default
(`moe_config.pick_config`) and the best of each variant side by side.
"""

import time
from collections.abc import Callable
from dataclasses import fields, replace

from mla_func.kernels.moe.config import MoEConfig, pick_config

try:  # `python -m scripts.bench moe` / `python -m scripts.bench_moe`
    from scripts import bench_common as common
except ImportError:  # `python scripts/bench_moe.py`
    import bench_common as common

# Sweep candidates, bounded so that `--sweep` over 9 token counts takes ~3-4 min on an H200
# (each new constexpr combination compiles in ~1-2 s, a case times in ~0.1-0.4 s).
# (N, K, warps, stages) for both GEMMs; the default config's own tiles are always tried too.
TILES = [(64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 3), (32, 128, 4, 4), (128, 128, 8, 3)]
# Block-FP8 experts step K one 128-column scale group at a time (`moe.config.FP8_BLOCK_K`).
TILES_FP8 = [(32, 128, 4, 3), (64, 128, 4, 3), (64, 128, 8, 3), (128, 128, 8, 3), (128, 128, 4, 4),
             (256, 128, 8, 3), (16, 128, 2, 4), (32, 128, 2, 3), (32, 128, 2, 4)]
# block_m per (max tokens): V2-Lite gives an expert ~tokens * 6 / 64 rows (shared: tokens rows).
BLOCK_MS = ((8, (16,)), (64, (16, 32)), (256, (16, 32, 64)), (1024, (32, 64, 128)),
            (1 << 62, (64, 128)))
DIRECT_SWEEP_MAX = 4  # tokens up to which the direct path is tried
SPLITS = (2, 3, 4)  # K slices tried on the direct path (`gate_up_split`, `down_split`)

# A config's (µs a layer, relative error against the baseline); µs None: it could not run.
TimeCase = Callable[[MoEConfig], tuple[float | None, float | None]]


def short(c: MoEConfig) -> str:
    """`MoEConfig(block_m, (n, k, warps, stages), (...), ...)`, pasteable into moe_config."""
    flags = "".join(f", {f.name}={getattr(c, f.name)}" for f in fields(c)[3:]
                    if getattr(c, f.name) != f.default)
    return f"MoEConfig({c.block_m}, {c.gate_up}, {c.down}{flags})"


def sweep(t: int, time_case: TimeCase, floor: float, fp8: bool = False) -> list[dict]:
    """Time configs at `t` tokens (`fp8`: of the block-FP8 experts, from their table's row);
    a config whose error against the baseline is not under 0.05 (NaN included) is reported
    WRONG and counted as not run."""
    rows, seen = [], {}
    base = pick_config(t, fp8)

    def timed(c: MoEConfig) -> float | None:
        if c not in seen:
            us, err = time_case(c)
            if us is not None and not (err is None or err < 0.05):
                print(f"  WRONG (err {err:.3g}): {short(c)}")
                us = None
            elif us is not None:  # as it comes: a sweep cut short keeps what it timed
                print(f"  {t} tokens {us:.1f} us: {short(c)}", flush=True)
            rows.append({"tokens": t, "variant": _variant(c), "config": c, "us": us,
                         "x_floor": None if us is None else us / floor, "err": err})
            seen[c] = us
        return seen[c]

    def descend(start: MoEConfig, passes) -> MoEConfig:
        """Coordinate descent: each pass tries tiles for one GEMM, keeps the fastest."""
        best = start
        for field, tiles in passes:
            tiles = dict.fromkeys([getattr(best, field), *tiles])  # the start's own tile first
            cands = [replace(best, **{field: tile}) for tile in tiles]
            ok = {c: us for c in cands if (us := timed(c)) is not None}
            best = min(ok, key=ok.get) if ok else best
        return best

    def split(best: MoEConfig, tiles) -> MoEConfig:
        """For each GEMM, the fastest K split (SPLITS, and none) of `best`; split, its tiles
        once more (fewer K steps a program may want other tiles)."""
        for gemm in ("gate_up", "down"):
            field = f"{gemm}_split"
            cands = [replace(best, **{field: n}) for n in (1, *SPLITS)]
            ok = {c: us for c in cands if (us := timed(c)) is not None}
            best = min(ok, key=ok.get) if ok else best
            if getattr(best, field) > 1:
                best = descend(best, ((gemm, tiles),))
        return best

    start = time.perf_counter()
    timed(base)
    tiles = TILES_FP8 if fp8 else TILES
    both = (("gate_up", tiles), ("down", tiles))
    if t <= DIRECT_SWEEP_MAX:  # the same GEMMs either way: tiles found for one serve both
        timed(replace(base, direct=not base.direct, last_sum=False, pdl=False, gate_up_split=1,
                      down_split=1))
        best = descend(replace(base, direct=True), both)
        best = split(best, tiles)
        timed(replace(best, last_sum=not best.last_sum))  # the sum launch or the down's tail
    else:
        bms = next(bms for bound, bms in BLOCK_MS if t <= bound)
        for bm in sorted({*bms, base.block_m}):
            best = descend(replace(base, block_m=bm), both)
            if fp8:  # x / act quantised once before their GEMM, or in its every column program
                timed(replace(best, quant_x=not best.quant_x))
                timed(replace(best, quant_act=not best.quant_act))
    print(f"  tokens {t}: {len(rows)} cases in {time.perf_counter() - start:.0f} s")
    return rows


def _variant(c: MoEConfig) -> str:
    return "direct+last sum" if c.last_sum else "direct" if c.direct else "aligned"


def print_sweep(sweeps: list[dict], tokens: list[int], fp8: bool = False) -> None:
    """The best case per token count next to the default (`fp8`: the FP8 table's), then the
    best of each variant."""
    best, per_variant = [], []
    for t in tokens:
        ok = [r for r in sweeps if r["tokens"] == t and r["us"] is not None]
        if not ok:
            continue
        default = next((r for r in ok if r["config"] == pick_config(t, fp8)), None)
        win = min(ok, key=lambda r: r["us"])
        best.append({"tokens": t, "default_us": default and default["us"],
                     "best_us": win["us"], "x_floor": win["x_floor"],
                     "gain": default and default["us"] / win["us"],
                     "default": short(pick_config(t, fp8)), "best": short(win["config"])})
        for v in dict.fromkeys(r["variant"] for r in ok):
            r = min((r for r in ok if r["variant"] == v), key=lambda r: r["us"])
            per_variant.append({**r, "config": short(r["config"])})
    common.print_table(per_variant, ["tokens", "variant", "us", "x_floor", "err", "config"],
                       "best swept config of each variant")
    common.print_table(best, ["tokens", "default_us", "best_us", "gain", "x_floor", "default",
                              "best"], "best swept config vs the default (moe_config.pick_config)")
