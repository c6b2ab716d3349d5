"""Benchmark the MLA attention kernels against their floor and the torch reference (GPU only).

The kernels are Triton's, and Gluon's warp-specialised decode at 64 heads a program on sm90,
where `plan_decode` picks it.

Floor = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate) (docs/PERF.md, "Conventions"),
both ceilings measured in this run. Times are medians of `triton.testing.do_bench` over
CUDA-graph replays; do_bench flushes L2 before every replay, so small cases are not served
from cache. Decode rows time the latent kernel (split + merge, `us`) and the whole absorbed
form with both W_UK/W_UV products (`full_us`); `ref_us` is mla_func.ops.attention's reference
(skipped where its fp32 gather would be too large).

    python -m scripts.bench kernels [--quick] [--sweep] [--no-ref]   # via the lead's bench.py
    python -m scripts.bench_kernels --quick          # a few rows
    python -m scripts.bench_kernels --sweep          # also tune decode plans on SWEEP_CASES
    python -m scripts.bench_kernels --sweep-only     # just the tuning (a few minutes)
    python -m scripts.bench kernels --kv-dtype fp8   # the FP8 latent cache (cache_fp8.py)

`--kv-dtype fp8`: the cache holds FP8 rows (656 bytes a token at these sizes); GB/s and % of
copy count those bytes, the decode runs `plan_decode(..., fp8=True)` (the Triton kernel), the
prefill reads the cache through its dequantising gather, and a last line says how many
V2-Lite 4096-token sequences the GPU's free memory would hold in each cache.

The sweep tunes one plan field at a time (`sweep_case`), then prints per case the default
and best plans: what to make `plan_decode`'s default.

The inputs, the timing, the ceilings and the floor are `bench_kernels_timing.py`'s.
"""

import argparse
import itertools
import math
import time
from dataclasses import replace

try:  # `python -m scripts.bench kernels` / `python -m scripts.bench_kernels`
    from scripts.bench_args import kernels as add_args
except ImportError:  # `python scripts/bench_kernels.py`
    from bench_args import kernels as add_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(p)
    return p.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped option answer before torch is imported
    parse_args()

import torch

from mla_func.kernels.attention.absorbed import attend_absorbed
from mla_func.kernels.attention.decode import (
    MAX_SPLITS,
    DecodePlan,
    DecodeWorkspace,
    effective_plan,
    plan_decode,
)
from mla_func.kernels.attention.decode_ws import device_ok as ws_device
from mla_func.kernels.attention.prefill import mha_prefill, prefill_flops
from mla_func.memory import available_bytes, cache_sequences
from mla_func.ops import attention as ref

try:  # `python -m scripts.bench kernels` / `python -m scripts.bench_kernels`
    from scripts import bench_kernels_timing as timing
    from scripts.bench_common import print_table
except ImportError:  # `python scripts/bench_kernels.py`
    import bench_kernels_timing as timing
    from bench_common import print_table

KV_LORA, LATENT, NOPE, ROPE, V_HEAD = (timing.KV_LORA, timing.LATENT, timing.NOPE, timing.ROPE,
                                       timing.V_HEAD)
bench_us, ceilings, decode_inputs = timing.bench_us, timing.ceilings, timing.decode_inputs
floors, plan_label, time_plan = timing.floors, timing.plan_label, timing.time_plan

REF_MAX_KEYS = 128 * 1024  # B * ctx above this: no torch reference (fp32 gather too big)


def _args(p: dict) -> tuple:
    return (p["q_nope"], p["q_pe"], p["cache"], p["w_uk"], p["w_uv"], p["token_seq"],
            p["positions"], p["page_table"], p["scale"])



def decode_row(heads, batch, ctx, page, ceil, no_ref, kv_dtype="auto") -> dict:
    """One decode case under `plan_decode`'s plan, the full absorbed form and the torch
    reference; the cache in `kv_dtype`."""
    p = decode_inputs(heads, batch, ctx, page, kv_dtype=kv_dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = plan_decode(batch, p["page_table"].shape[1] * page, sms, heads, page_size=page,
                       ws=ws_device(torch.device("cuda")), fp8=kv_dtype == "fp8")
    shrunk: dict[DecodePlan, DecodePlan] = {}
    us = time_plan(p, plan, shrunk=shrunk)
    full_us = bench_us(lambda: attend_absorbed(*_args(p), DecodeWorkspace(), plan))
    moved, floor_us = floors(heads, batch, ctx, ceil, kv_dtype)
    row = {
        "kind": "decode", "heads": heads, "batch": batch, "ctx": ctx, "page": page,
        "kv_dtype": kv_dtype,
        "splits": plan.num_splits, "config": plan_label(effective_plan(plan, shrunk)),
        "us": us, "full_us": full_us, "GBps": moved / us / 1e3,
        "TFLOPs": 2 * batch * heads * ctx * (LATENT + KV_LORA) / us / 1e6,
        "floor_us": floor_us, "x_floor": us / floor_us,
        "pct_copy": 100 * moved / us / 1e3 / ceil["copy_GBps"], "ref_us": None, "note": "",
    }
    if no_ref or batch * ctx > REF_MAX_KEYS:
        row["note"] = "ref skipped (--no-ref)" if no_ref else "ref skipped (size)"
    else:
        row["ref_us"] = bench_us(lambda: ref.attend_absorbed(*_args(p)))
    torch.cuda.empty_cache()
    return row


def prefill_row(heads: int, prompt: int, ceil: dict, no_ref: bool, kv_dtype: str = "auto"
                ) -> dict:
    p = decode_inputs(heads, 1, prompt, 64, seed=1, kv_dtype=kv_dtype)
    for name in ("q_nope", "q_pe"):
        p[name] = torch.randn(prompt, heads, p[name].shape[-1], device="cuda",
                              dtype=torch.bfloat16)
    p["token_seq"] = torch.zeros(prompt, device="cuda", dtype=torch.int32)
    p["positions"] = torch.arange(prompt, device="cuda", dtype=torch.int32)
    us = bench_us(lambda: mha_prefill(*_args(p), prompt, prompt))
    flops = prefill_flops([prompt], [prompt], heads, NOPE, ROPE, V_HEAD, KV_LORA)
    row = {"kind": "prefill", "heads": heads, "batch": 1, "ctx": prompt, "us": us,
           "TFLOPs": flops / us / 1e6, "pct_matmul": 100 * flops / us / 1e6
           / ceil["matmul_TFLOPs"], "ref_us": None, "note": ""}
    if not no_ref and prompt * heads <= 1024 * 16:
        row["ref_us"] = bench_us(lambda: ref.attend_mha(*_args(p)))
    elif not no_ref:
        row["note"] = "ref skipped (size)"
    return row


# (heads, batch, ctx) at page 64: the cases the plan defaults are tuned on.
SWEEP_CASES = ((16, 1, 1024), (16, 1, 4096), (16, 32, 1024), (16, 32, 4096), (16, 128, 1024),
               (16, 128, 4096), (128, 1, 4096), (128, 128, 4096))


def sweep_axes(heads: int, splits: int, capacity: int, fp8: bool = False) -> list[list[dict]]:
    """Values per plan field, tried one axis at a time around the best plan so far (on an FP8
    cache also its kernel at 16 heads a program: decode_fp8.py's in float16 or bf16
    products, or the dequantising one; `DecodePlan.group_scores`, `f16`)."""
    most = max(1, min(MAX_SPLITS, capacity // 16))
    near = sorted({max(1, min(most, int(splits * f))) for f in (0.25, 0.5, 1, 2, 4)})
    axes = [
        [dict(num_stages=s) for s in (2, 3, 4)],
        [dict(num_splits=s) for s in near],
        [dict(block_n=n) for n in (16, 32, 64)],
        [dict(num_warps=w) for w in (4, 8)],
    ]
    if heads > 16:
        axes.append([dict(block_h=b) for b in (16, 32, 64)])
    if fp8:
        axes.append([dict(group_scores=g, f16=f, block_h=16, num_warps=4)
                     for g, f in ((True, True), (True, False), (False, False))])
    return axes


def sweep_case(heads: int, batch: int, ctx: int, ceil: dict, seconds: float,
               kv_dtype: str = "auto") -> list[dict]:
    """Coordinate descent over plan fields (two rounds, or until `seconds` run out), from the
    default plan; one row per timed plan (kind "sweep") and a summary row (kind
    "sweep-best")."""
    page, deadline = 64, time.monotonic() + seconds
    p = decode_inputs(heads, batch, ctx, page, kv_dtype=kv_dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    capacity = p["page_table"].shape[1] * page
    default = plan_decode(batch, capacity, sms, heads, ws=ws_device(torch.device("cuda")),
                          fp8=kv_dtype == "fp8")
    seen: dict[DecodePlan, float] = {}
    shrunk: dict[DecodePlan, DecodePlan] = {}
    rows: list[dict] = []

    def timed(plan: DecodePlan) -> float:
        if plan not in seen:
            try:
                seen[plan] = time_plan(p, plan, strict=True, shrunk=shrunk)
                note = ("" if seen[plan] < math.inf
                        else f"shrank to {effective_plan(plan, shrunk)}")
            except Exception as err:  # a tiling this GPU cannot compile or run
                seen[plan], note = math.inf, f"{type(err).__name__}: {str(err)[:80]}"
            rows.append(dict(kind="sweep", heads=heads, batch=batch, ctx=ctx, page=page,
                             splits=plan.num_splits, config=plan_label(plan), us=seen[plan],
                             plan=plan, note=note))
            print(f"  sweep H={heads} B={batch} ctx={ctx} s={plan.num_splits:3d} "
                  f"{plan_label(plan):34s} {seen[plan]:9.1f} us {note}", flush=True)
        return seen[plan]

    best = default
    best_us = default_us = timed(default)
    for _ in range(2):
        start = best
        for axis in sweep_axes(heads, default.num_splits, capacity, default.fp8):
            for fields in axis:
                if time.monotonic() > deadline:
                    break
                us = timed(replace(best, **fields))
                if us < best_us * 0.99:  # 1%: do not chase timing noise
                    best, best_us = replace(best, **fields), us
        if best == start:
            break
    best, best_us = min(seen.items(), key=lambda item: item[1])
    moved, floor_us = floors(heads, batch, ctx, ceil, kv_dtype)
    rows.append(dict(
        kind="sweep-best", heads=heads, batch=batch, ctx=ctx, page=page, timed=len(seen),
        default=f"s{default.num_splits} {plan_label(default)}", default_us=default_us,
        best=f"s{best.num_splits} {plan_label(best)}", best_us=best_us,
        speedup=default_us / best_us, pct_copy=100 * moved / best_us / 1e3 / ceil["copy_GBps"],
        x_floor=best_us / floor_us, plan=best))
    return rows


def run(args: "argparse.Namespace | list[str] | None" = None) -> list[dict]:
    """Measure ceilings, then the decode grid, optional tile sweep, and prefill; print a
    table and return its rows. `args`: parsed options or a command line (bench.py passes
    its leftover argv)."""
    if not isinstance(args, argparse.Namespace):
        args = parse_args(list(args or []))
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels needs a CUDA GPU; none is available")
    quick = getattr(args, "quick", False)
    heads_list = getattr(args, "heads", [16, 128])
    batches = [1, 128] if quick else getattr(args, "batch", [1, 8, 32, 128])
    ctxs = [1024, 4096] if quick else getattr(args, "ctx", [1024, 4096, 16384])
    pages = [64] if quick else getattr(args, "page", [1, 64])
    prompts = [1024, 4096] if quick else getattr(args, "prompt", [1024, 2048, 4096, 8192])
    no_ref = getattr(args, "no_ref", False)
    kv_dtype = getattr(args, "kv_dtype", "auto")
    ceil = ceilings()
    rows: list[dict] = [dict(kind="ceilings", **ceil)]
    print(f"copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s "
          f"({torch.cuda.get_device_name()})")
    sweep_only = getattr(args, "sweep_only", False)
    if not sweep_only:
        for heads, batch, ctx, page in itertools.product(heads_list, batches, ctxs, pages):
            rows.append(decode_row(heads, batch, ctx, page, ceil, no_ref, kv_dtype))
            _print(rows[-1])
    if sweep_only or getattr(args, "sweep", False):
        end = time.monotonic() + getattr(args, "sweep_seconds", 210.0)
        for i, (heads, batch, ctx) in enumerate(SWEEP_CASES):
            share = (end - time.monotonic()) / (len(SWEEP_CASES) - i)  # unused time carries
            rows += sweep_case(heads, batch, ctx, ceil, share, kv_dtype)
            torch.cuda.empty_cache()
    if not sweep_only:
        for heads, prompt in itertools.product(heads_list, prompts):
            rows.append(prefill_row(heads, prompt, ceil, no_ref, kv_dtype))
            _print(rows[-1])
        print_table([r for r in rows if r["kind"] == "decode"], DECODE_COLUMNS,
                    f"MLA decode ({torch.cuda.get_device_name()}, copy "
                    f"{ceil['copy_GBps']:.0f} GB/s, matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s, "
                    f"cache {'fp8' if kv_dtype == 'fp8' else 'bf16'})")
        print_table([r for r in rows if r["kind"] == "prefill"], PREFILL_COLUMNS,
                    "MLA prefill")
    if kv_dtype == "fp8":
        rows.append(capacity_row())
        print(f"V2-Lite, 4096-token sequences in {rows[-1]['free_GiB']:.1f} GiB free: bf16 cache "
              f"{rows[-1]['bf16']}, fp8 cache {rows[-1]['fp8']} (x{rows[-1]['ratio']:.2f})")
    best = [r for r in rows if r["kind"] == "sweep-best"]
    if best:
        print_table(best, SWEEP_COLUMNS, "Decode plan sweep: default vs best (page 64; us ="
                    " split + merge kernels)")
        for r in best:
            print(f"best H={r['heads']} B={r['batch']} ctx={r['ctx']}: {r['plan']}")
    return rows


def capacity_row(seq_len: int = 4096, page: int = 64) -> dict:
    """How many V2-Lite sequences of `seq_len` tokens the GPU's free memory holds in a bf16
    and in an FP8 cache (the cache alone: the weights' memory is not subtracted)."""
    from mla_func.config import MLAConfig

    cfg, free = MLAConfig.preset("v2-lite"), available_bytes("cuda")
    n = {k: cache_sequences(cfg, free, seq_len, page, k) for k in ("auto", "fp8")}
    return dict(kind="capacity", free_GiB=free / 2**30, seq_len=seq_len, bf16=n["auto"],
                fp8=n["fp8"], ratio=n["fp8"] / max(1, n["auto"]))


DECODE_COLUMNS = ["kind", "heads", "batch", "ctx", "page", "splits", "config", "us", "full_us",
                  "GBps", "pct_copy", "floor_us", "x_floor", "ref_us", "note"]
SWEEP_COLUMNS = ["heads", "batch", "ctx", "timed", "default", "default_us", "best", "best_us",
                 "speedup", "pct_copy", "x_floor"]
PREFILL_COLUMNS = ["heads", "ctx", "us", "TFLOPs", "pct_matmul", "ref_us", "note"]


def _print(r: dict) -> None:
    ref_us = f"{r['ref_us']:9.1f}" if r.get("ref_us") else "        -"
    if r["kind"] == "prefill":
        print(f"prefill H={r['heads']:3d} tokens={r['ctx']:5d} {r['us']:9.1f} us "
              f"{r['TFLOPs']:6.1f} TFLOP/s ({r['pct_matmul']:4.1f}% of matmul) "
              f"ref {ref_us} {r['note']}")
        return
    print(f"{r['kind']:7s} H={r['heads']:3d} B={r['batch']:3d} ctx={r['ctx']:5d} "
          f"page={r['page']:2d} splits={r['splits']:3d} {r['config']:12s} {r['us']:8.1f} us "
          f"(full {r['full_us'] or 0:7.1f}) {r['GBps']:6.0f} GB/s {r['pct_copy']:5.1f}% copy "
          f"floor {r['floor_us']:7.1f} x{r['x_floor']:5.2f} ref {ref_us} {r['note']}")


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
