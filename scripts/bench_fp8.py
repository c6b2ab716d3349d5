"""Benchmark the block-FP8 GEMM (`kernels/linear/fp8_linear.py`) at a few rows against the bf16
cuBLAS product of the same weight dequantised (GPU only).

At decode sizes a projection streams its weight once, so the measure is the weight's bytes
over the time (`GBps`: e4m3 data and float32 scales; bf16: two bytes an element) against the
device-to-device copy bandwidth measured in the same run (`pct_copy`, docs/PERF.md
"Conventions"; the read-only rate beside it). Times are medians of `triton.testing.do_bench`
over CUDA-graph replays (`bench_kernels_timing.bench_us`: L2 flushed before every replay, so
the weight comes from memory). `launch` is `fp8_tiles`' choice for the shape (`--sweep`: then other
launches, `SWEEP`); `err` the
kernel against `fp8.linear_reference` (max abs / max abs).

Default shapes (N outputs x K inputs): V2-Lite's o_proj (2048x2048), query (3072x2048) and
kv_a (576x2048) projections, and V3's dense MLP down projection (7168x18432).

    python -m scripts.bench fp8 [--rows 1 4 16] [--shapes 2048x2048 7168x18432] [--sweep]
    python -m scripts.bench_fp8 --rows 1
"""

import argparse
from dataclasses import replace

try:  # `python -m scripts.bench fp8` / `python -m scripts.bench_fp8`
    from scripts.bench_args import fp8 as add_args
except ImportError:  # `python scripts/bench_fp8.py`
    from bench_args import fp8 as add_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    add_args(p)
    return p.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped option answer before torch is imported
    parse_args()

import torch

from mla_func.fp8 import Fp8Weight, dequantize, linear_reference, quantize
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.linear.fp8_linear import run as fp8_run
from mla_func.kernels.linear.fp8_tiles import Fp8Tiles, fp8_tiles, k_split

try:
    from scripts.bench_common import measure_ceilings, print_table
    from scripts.bench_kernels_timing import bench_us
except ImportError:  # `python scripts/bench_fp8.py`
    from bench_common import measure_ceilings, print_table
    from bench_kernels_timing import bench_us

COLUMNS = ["n", "k", "rows", "launch", "us", "GBps", "pct_copy", "bf16_us", "bf16_GBps",
           "speedup", "err"]


def weight_bytes(w: Fp8Weight) -> int:
    """Bytes a product reads of w: its e4m3 data and float32 scales."""
    return w.data.numel() + 4 * w.scales.numel()


# Launches `--sweep` tries beside the default: (column tile, grid target, warps).
SWEEP = [(bn, programs, warps) for bn in (64, 128) for programs in (128, 512) for warps in (4, 8)]


def label(t: Fp8Tiles) -> str:
    return f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages} {t.quant} split{t.split}"


def launches(rows: int, n: int, k: int, sweep: bool) -> list[Fp8Tiles]:
    """`fp8_tiles`' launch, and with `sweep` its variants of SWEEP."""
    base = fp8_tiles(rows, n, k)
    if not sweep:
        return [base]
    return [base] + [replace(base, block_n=bn, num_warps=warps,
                             split=k_split(rows, n, k, base.block_m, bn, programs))
                     for bn, programs, warps in SWEEP]


def case(n: int, k: int, rows: int, copy_gbs: float, sweep: bool = False,
         seed: int = 0) -> list[dict]:
    """One shape at `rows` rows: the FP8 kernel (each launch) and bf16 cuBLAS, timed."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = quantize(torch.randn(n, k, device="cuda", generator=g) * k**-0.5, 128)
    dense = dequantize(w, torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
    counters = Runtime("cuda").counters  # the split few-row launch's (a state's in a step)
    ref = linear_reference(x, w)
    bf16_us = bench_us(lambda: x @ dense.T)
    out = []
    for tiles in launches(rows, n, k, sweep):
        got = fp8_run(x, w.data, w.scales, w.block, counters, tiles)
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        us = bench_us(lambda t=tiles: fp8_run(x, w.data, w.scales, w.block, counters, t))
        gbs = weight_bytes(w) / us / 1e3
        out.append(dict(kind="fp8", n=n, k=k, rows=rows, launch=label(tiles), us=us, GBps=gbs,
                        pct_copy=100 * gbs / copy_gbs, bf16_us=bf16_us,
                        bf16_GBps=2 * n * k / bf16_us / 1e3, speedup=bf16_us / us, err=err))
    return out


def run(args: "argparse.Namespace | list[str] | None" = None) -> list[dict]:
    """Measure the ceilings, then every shape at every row count; print a table and return
    its rows (`args`: parsed options or a command line)."""
    if not isinstance(args, argparse.Namespace):
        args = parse_args(list(args or []))
    if not torch.cuda.is_available():  # after the options: --help and their errors work anywhere
        raise SystemExit("bench_fp8 needs a CUDA GPU; none is available")
    found = measure_ceilings()
    copy = found["copy_gbs"]
    rows: list[dict] = [dict(kind="ceilings", copy_GBps=copy, read_GBps=found["read_gbs"])]
    for n, k in args.shapes:
        for r in args.rows:
            for c in case(n, k, r, copy, args.sweep):
                rows.append(c)
                print(f"N={n:5d} K={k:5d} rows={r:3d} {c['us']:8.1f} us {c['GBps']:6.0f} GB/s "
                      f"({c['pct_copy']:4.1f}% copy)  bf16 {c['bf16_us']:8.1f} us  "
                      f"x{c['speedup']:.2f}  err {c['err']:.1e}  {c['launch']}", flush=True)
        torch.cuda.empty_cache()
    print_table(rows[1:], COLUMNS, f"Block-FP8 GEMM ({torch.cuda.get_device_name()}, copy "
                f"{copy:.0f} GB/s, read {found['read_gbs']:.0f} GB/s)")
    return rows


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
