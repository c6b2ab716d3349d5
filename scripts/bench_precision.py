"""Block-FP8 weights and the FP8 latent cache against bf16, in one run (GPU):
`python -m scripts.bench precision [--out DIR] [OPTIONS]`.

V2-Lite's shape, random bf16 weights (seed 0) and their block-FP8 image (`quantize_fp8`:
every projection and expert but W_UK / W_UV; those, norms, router, embedding and lm_head stay
bf16). Each precision (`--precisions`: "bf16"; "fp8" weights; "fp8-cache", bf16 weights over
the FP8 latent cache; "fp8+fp8-cache") gets its own state and `compile_step(mode="full")`; decode
steps at each batch and context run back to back and one at a time, beside the floor of
that precision's bytes (`bench_decode.step_floor`: each weight at its stored size, FP8 values
plus their scales; the distinct routed experts the step touched; the cache rows at their
bytes) and the ratio to the bf16 step of the same shape. Then accuracy: `generate` of a
mixed workload (prompts of several lengths, greedy, `--new` tokens) in each precision
against bf16: the relative logit error (largest and median over the positions both runs
reached with the same tokens) and the share of greedy tokens equal. Finally how many
4096-token sequences the free memory holds in each cache format.

`run(argv)` returns the JSON (`scripts.bench` writes it under `--out`).
"""

import argparse
import statistics

import torch

import mla_func as mf
from mla_func.quantize import quantize_fp8
from scripts.bench_args import precision as add_args
from scripts.bench_common import (
    StateChain,
    measure_ceilings,
    print_table,
)
from scripts.bench_decode import full_decode_rows

PRECISIONS = {"bf16": (False, "auto"), "fp8": (True, "auto"),
              "fp8-cache": (False, "fp8"), "fp8+fp8-cache": (True, "fp8")}


def bench_decode(cfg, params, kv_dtype: str, label: str, args, ceil) -> list[dict]:
    """Full-graph decode steps of one precision at every batch and context."""
    from mla_func.compile_step import compile_step

    pages_each = -(-(max(args.contexts) + 1) // args.page_size)
    state = mf.init_state(cfg, max(args.batches) * pages_each + 2, args.page_size,
                          device="cuda", dtype=torch.bfloat16, kv_dtype=kv_dtype)
    state.cache.view(torch.uint8).random_(0, 64)  # finite values in either format
    step = compile_step(params, state, mode="full", max_seqs=max(args.batches),
                        max_pages=pages_each, backend="triton", progress=False)
    chain = StateChain(state)
    rows = full_decode_rows(params, chain, step, label, args.contexts, args.batches,
                            pages_each, ceil, state.row_bytes, seed=lambda b, ctx: b * 7 + ctx)
    for row in rows:
        row["over_floor"] = row["full_pipelined_ms"] / row["floor_ms"]
        print(row, flush=True)
    del step, chain, state
    torch.cuda.empty_cache()
    return rows


def _prompts(cfg, n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    lengths = [5, 17, 64, 200, 9, 333, 48, 1000][:n] + [32] * max(0, n - 8)
    return [torch.randint(2, cfg.vocab_size, (k,), generator=g).tolist() for k in lengths]


def compare(base: mf.GenerateOutput, other: mf.GenerateOutput) -> dict:
    """Relative logit errors over the positions both runs reached with the same tokens, and
    the share of greedy tokens equal."""
    errs, same, total = [], 0, 0
    for ta, tb, la, lb in zip(base.tokens, other.tokens, base.logits, other.logits,
                              strict=True):
        n = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), len(ta))
        errs += [float((lb[i] - la[i]).norm() / la[i].norm()) for i in range(min(n + 1, len(ta)))]
        same += sum(x == y for x, y in zip(ta, tb, strict=True))
        total += len(ta)
    return {"max_rel_err": max(errs), "median_rel_err": statistics.median(errs),
            "greedy_equal": same / total}


def accuracy(cfg, variants: dict, args) -> list[dict]:
    """`generate` in each precision against bf16 (the same prompts, greedy)."""
    prompts = _prompts(cfg, args.prompts)
    kw = dict(page_size=args.page_size, eos_token_id=None, return_logits=True,
              attention_backend="triton", mode="full_and_piecewise", progress=False)
    outs = {label: mf.generate(cfg, params, prompts, args.new, kv_dtype=kv, **kw)
            for label, (params, kv) in variants.items()}
    return [{"what": label, **compare(outs["bf16"], out)} for label, out in outs.items()
            if label != "bf16"]


def capacity(cfg) -> list[dict]:
    """4096-token sequences the free memory holds in each cache format."""
    from mla_func.memory import cache_row_bytes

    free, _ = torch.cuda.mem_get_info()
    rows = []
    for kv in ("auto", "fp8"):
        row = cache_row_bytes(cfg, kv)
        rows.append({"cache": "bf16" if kv == "auto" else "fp8", "row_bytes": row,
                     "seqs_4k": free // (row * 4096 * cfg.num_hidden_layers)})
    return rows


def run(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="bench precision")
    add_args(p)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench precision needs a CUDA GPU")
    ceil = measure_ceilings()
    print("ceilings", ceil, flush=True)
    cfg = mf.MLAConfig.preset(args.preset)
    bf16 = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    fp8 = quantize_fp8(bf16)
    variants = {label: (fp8 if fp8_weights else bf16, kv)
                for label, (fp8_weights, kv) in PRECISIONS.items()
                if label in args.precisions or label == "bf16"}
    result: dict = {"gpu": torch.cuda.get_device_name(), "ceilings": ceil,
                    "capacity": capacity(cfg)}
    decode = []
    for label, (params, kv) in variants.items():
        decode += bench_decode(cfg, params, kv, label, args, ceil)
    base = {(r["ctx"], r["batch"]): r["full_pipelined_ms"] for r in decode
            if r["what"] == "bf16"}
    for r in decode:
        r["vs_bf16"] = r["full_pipelined_ms"] / base[(r["ctx"], r["batch"])]
    result["decode"] = decode
    result["accuracy"] = accuracy(cfg, variants, args) if args.prompts else []
    print(f"\nGPU {result['gpu']}, ceilings {ceil}")
    print_table(decode, ["what", "ctx", "batch", "floor_ms", "gb", "full_ms",
                         "full_pipelined_ms", "over_floor", "vs_bf16"], "decode step (ms)")
    print_table(result["accuracy"], ["what", "max_rel_err", "median_rel_err", "greedy_equal"],
                "against bf16: generate")
    print_table(result["capacity"], ["cache", "row_bytes", "seqs_4k"],
                "4096-token sequences in free memory")
    return result


__all__ = ["PRECISIONS", "compare", "run"]
