"""Benchmark the Triton MLA kernels against their floor and the torch reference (GPU only).

Floor = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate) (DESIGN.md, "Performance
model"), both ceilings measured in this run. Times are medians of `triton.testing.do_bench`
over CUDA-graph replays; do_bench flushes L2 before every replay, so small cases are not served
from cache. Decode rows time the latent kernel (split + merge, `us`) and the whole absorbed
form with both W_UK/W_UV products (`full_us`); `ref_us` is mla_func.ops.attention's reference
(skipped where its fp32 gather would be too large).

    python -m scripts.bench kernels [--quick] [--sweep] [--no-ref]   # via the lead's bench.py
    python -m scripts.bench_kernels --quick          # a few rows
    python -m scripts.bench_kernels --sweep          # also time other decode tilings/splits
"""

import argparse
import itertools
from dataclasses import replace

import torch

from mla_func.kernels.mla_decode import (
    DecodeWorkspace,
    attend_absorbed,
    effective_plan,
    mla_decode,
    plan_decode,
)
from mla_func.kernels.mla_prefill import mha_prefill, prefill_flops
from mla_func.ops import attention as ref

try:  # `python -m scripts.bench kernels` / `python -m scripts.bench_kernels`
    from scripts.bench_common import measure_ceilings, print_table
except ImportError:  # `python scripts/bench_kernels.py`
    from bench_common import measure_ceilings, print_table

NOPE, ROPE, V_HEAD, KV_LORA = 128, 64, 128, 512
LATENT = KV_LORA + ROPE
REF_MAX_KEYS = 128 * 1024  # B * ctx above this: no torch reference (fp32 gather too big)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(p)
    return p.parse_args(argv)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heads", type=int, nargs="+", default=[16, 128])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--page", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--quick", action="store_true", help="H 16/128, B 1/128, ctx 1024/4096")
    p.add_argument("--sweep", action="store_true", help="also time other decode tilings")
    p.add_argument("--no-ref", action="store_true", help="skip the torch reference")


def bench_us(fn) -> float:
    """Median µs of `fn` replayed from a CUDA graph (launch overhead excluded; do_bench
    flushes L2 before each replay). Falls back to eager timing if `fn` cannot be captured."""
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile, allocate
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        return triton.testing.do_bench(fn, return_mode="median") * 1e3
    return triton.testing.do_bench(graph.replay, return_mode="median") * 1e3


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written) and bf16 matmul rate, measured now."""
    found = measure_ceilings()
    return {"copy_GBps": found["copy_gbs"], "matmul_TFLOPs": found["matmul_tflops"]}


def decode_inputs(heads: int, batch: int, ctx: int, page: int, seed: int = 0) -> dict:
    """bf16 V2/V3-shaped decode inputs: every sequence at `ctx` keys, pages shuffled."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = -(-ctx // page)
    pages = batch * per_seq + 1
    cache = torch.randn(pages, page, LATENT, device="cuda", dtype=torch.bfloat16, generator=g)
    order = torch.randperm(pages - 1, device="cuda", generator=g).to(torch.int32) + 1
    table = order.view(batch, per_seq)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, device="cuda", generator=g).mul_(s).to(torch.bfloat16)

    return {
        "q_nope": rnd(batch, heads, NOPE), "q_pe": rnd(batch, heads, ROPE), "cache": cache,
        "w_uk": rnd(heads, NOPE, KV_LORA, s=NOPE**-0.5),
        "w_uv": rnd(heads, V_HEAD, KV_LORA, s=KV_LORA**-0.5),
        "token_seq": torch.arange(batch, device="cuda", dtype=torch.int32),
        "positions": torch.full((batch,), ctx - 1, device="cuda", dtype=torch.int32),
        "page_table": table, "scale": (NOPE + ROPE) ** -0.5,
    }


def _args(p: dict) -> tuple:
    return (p["q_nope"], p["q_pe"], p["cache"], p["w_uk"], p["w_uv"], p["token_seq"],
            p["positions"], p["page_table"], p["scale"])


def decode_row(heads, batch, ctx, page, ceil, no_ref, plan=None) -> dict:
    """One decode case; with an explicit `plan` (the sweep) only the latent kernel is timed."""
    p = decode_inputs(heads, batch, ctx, page)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    explicit = plan is not None
    plan = plan or plan_decode(batch, p["page_table"].shape[1] * page, sms, heads)
    ws = DecodeWorkspace()
    q_lat, o_lat, part_o, part_lse = ws.get(torch.device("cuda"), torch.bfloat16, batch, heads,
                                            KV_LORA, plan.num_splits)
    q_lat.copy_(torch.einsum("thn,hnc->htc", p["q_nope"], p["w_uk"]))

    def kernel():
        mla_decode(q_lat, p["q_pe"], p["cache"], p["page_table"], p["token_seq"],
                   p["positions"], p["scale"], plan, o_lat, part_o, part_lse)

    us = bench_us(kernel)
    full_us = None if explicit else bench_us(lambda: attend_absorbed(*_args(p), ws, plan))
    used = effective_plan(plan)
    kv_bytes = batch * ctx * LATENT * 2
    io_bytes = batch * heads * (2 * KV_LORA + ROPE) * 2
    flops = 2 * batch * heads * ctx * (LATENT + KV_LORA)
    floor_us = max((kv_bytes + io_bytes) / ceil["copy_GBps"] / 1e3,
                   flops / ceil["matmul_TFLOPs"] / 1e6)
    row = {
        "kind": "decode", "heads": heads, "batch": batch, "ctx": ctx, "page": page,
        "splits": plan.num_splits, "config": f"h{used.block_h}n{used.block_n}w{used.num_warps}"
        f"s{used.num_stages}", "us": us, "full_us": full_us,
        "GBps": (kv_bytes + io_bytes) / us / 1e3, "TFLOPs": flops / us / 1e6,
        "floor_us": floor_us, "x_floor": us / floor_us,
        "pct_copy": 100 * (kv_bytes + io_bytes) / us / 1e3 / ceil["copy_GBps"],
        "ref_us": None, "note": "",
    }
    if no_ref:
        row["note"] = "ref skipped (--no-ref)"
    elif batch * ctx > REF_MAX_KEYS:
        row["note"] = "ref skipped (size)"
    else:
        row["ref_us"] = bench_us(lambda: ref.attend_absorbed(*_args(p)))

    torch.cuda.empty_cache()
    return row


def prefill_row(heads: int, prompt: int, ceil: dict, no_ref: bool) -> dict:
    p = decode_inputs(heads, 1, prompt, 64, seed=1)
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


SWEEP_CASES = ((16, 1, 1024), (16, 8, 4096), (16, 32, 4096), (16, 128, 4096), (16, 128, 1024),
               (128, 1, 1024), (128, 32, 4096), (128, 128, 4096))  # (heads, batch, ctx), page 64


def sweep_plans(batch: int, ctx: int, page: int, heads: int):
    """Tilings and split counts around the default plan, for tuning on the GPU at hand."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cap = -(-ctx // page) * page
    base = plan_decode(batch, cap, sms, heads)
    most = max(1, min(128, cap // 32))
    split_choices = sorted({s for s in (base.num_splits, 1, 2, 4, 8, 16, 32, 64) if s <= most})
    if heads <= 16:
        for bn, warps, stages, splits in itertools.product((32, 64), (4, 8), (2, 3),
                                                           split_choices):
            yield replace(base, block_n=bn, num_warps=warps, num_stages=stages,
                          num_splits=splits)
    else:
        for bh, bn, warps, splits in itertools.product((64, 128), (32, 64), (4, 8),
                                                       split_choices):
            yield replace(base, block_h=bh, block_n=bn, num_warps=warps, num_splits=splits)


def run(args: "argparse.Namespace | list[str] | None" = None) -> list[dict]:
    """Measure ceilings, then the decode grid, optional tile sweep, and prefill; print a
    table and return its rows. `args`: parsed options or a command line (bench.py passes
    its leftover argv)."""
    if not isinstance(args, argparse.Namespace):
        args = parse_args(list(args or []))
    if not torch.cuda.is_available():
        raise RuntimeError("bench_kernels needs a CUDA GPU")
    from triton.runtime.errors import OutOfResources

    quick = getattr(args, "quick", False)
    heads_list = getattr(args, "heads", [16, 128])
    batches = [1, 128] if quick else getattr(args, "batch", [1, 8, 32, 128])
    ctxs = [1024, 4096] if quick else getattr(args, "ctx", [1024, 4096, 16384])
    pages = [64] if quick else getattr(args, "page", [1, 64])
    prompts = [1024, 4096] if quick else getattr(args, "prompt", [1024, 2048, 4096, 8192])
    no_ref = getattr(args, "no_ref", False)
    ceil = ceilings()
    rows: list[dict] = [dict(kind="ceilings", **ceil)]
    print(f"copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s "
          f"({torch.cuda.get_device_name()})")
    for heads, batch, ctx, page in itertools.product(heads_list, batches, ctxs, pages):
        rows.append(decode_row(heads, batch, ctx, page, ceil, no_ref))
        _print(rows[-1])
    if getattr(args, "sweep", False):
        for heads, batch, ctx in SWEEP_CASES:
            for plan in sweep_plans(batch, ctx, 64, heads):
                try:
                    rows.append(decode_row(heads, batch, ctx, 64, ceil, True, plan))
                except (OutOfResources, RuntimeError) as err:  # a tiling this GPU cannot run
                    print(f"sweep H={heads} B={batch} ctx={ctx} {plan}: {type(err).__name__}")
                    continue
                rows[-1]["kind"] = "sweep"
                _print(rows[-1])
    for heads, prompt in itertools.product(heads_list, prompts):
        rows.append(prefill_row(heads, prompt, ceil, no_ref))
        _print(rows[-1])
    print_table([r for r in rows if r["kind"] in ("decode", "sweep")], DECODE_COLUMNS,
                f"MLA decode ({torch.cuda.get_device_name()}, copy {ceil['copy_GBps']:.0f} GB/s,"
                f" matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s)")
    print_table([r for r in rows if r["kind"] == "prefill"], PREFILL_COLUMNS, "MLA prefill")
    return rows


DECODE_COLUMNS = ["kind", "heads", "batch", "ctx", "page", "splits", "config", "us", "full_us",
                  "GBps", "pct_copy", "floor_us", "x_floor", "ref_us", "note"]
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
