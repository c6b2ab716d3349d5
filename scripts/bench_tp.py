"""Tensor parallel against one GPU, in one run:
`torchrun --nproc-per-node N -m scripts.bench tp [--out DIR] [OPTIONS]`.

In one process group of N GPUs: first the captured all-reduce alone (one graph of 16
all-reduces per size, every rank replaying); then rank 0 alone runs the one-GPU model (the
whole parameters: decode steps in full graphs, then `generate`) while the other ranks wait;
then every rank runs its shard (the same steps, the same `generate` workload). Random bf16
weights of the preset, the same seed on every rank. Rank 0 prints the tables and returns the
JSON; the floor of a sharded step is this rank's bytes (its weights touched by the step and
the whole latent cache) at the copy bandwidth measured here, and the collectives' time beside
it is the measured one-shot all-reduce times the step's count (two a layer, one for the
embedding). The sharded step runs three times: the plan's forms (one-shot up to
`kernels.plan.ONE_SHOT_MAX_BYTES`, each sub-layer's sum, residual add and norm in one launch),
the one-shot sum with the add and norm apart, and NCCL only.

`--weights fp8` quantises the random weights to block FP8, `--kv-dtype fp8` keeps the cache in
FP8 rows; `--ctx` takes several contexts. `--no-baseline` (a model no GPU holds alone: V3 on
8 GPUs, `torchrun --nproc-per-node 8 -m scripts.bench tp --preset v3 --weights fp8
--no-baseline --ctx 1024 4096 --batches 1 32 128 --gen-prompt 1024 --gen-new 1024
--gen-requests 256`) skips the one-GPU run and the other forms, and each rank draws only its
share (`parallel.shard.random_shard`).
"""

import argparse
import time
from dataclasses import replace

import torch
import torch.distributed as dist

import mla_func as mf
from mla_func.engine import default_batch_tokens
from mla_func.kernels.launch.runtime import Runtime
from mla_func.kernels.plan import KernelOptions, default_options
from mla_func.parallel.comm import all_reduce, all_reduce_add_norm, prepare
from mla_func.parallel.group import finish, init_from_env
from mla_func.parallel.shard import random_shard, shard_params
from mla_func.quantize import quantize_fp8
from scripts.bench_args import tp as tp_options
from scripts.bench_common import (
    StateChain,
    capture_graph,
    cuda_time_ms,
    measure_ceilings,
    print_table,
)
from scripts.bench_decode import full_decode_rows

add_args = tp_options  # the options: scripts/bench_args.py


def _torch_one_shot(tp, width: int, rows: list[int]):
    """PyTorch's own one-shot symmetric-memory all-reduce (copy in, barrier, read every
    rank's buffer; `symm_mem::one_shot_all_reduce_copy_out`), over a buffer of its own: what
    the pushed sum is measured against."""
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(max(rows) * width, dtype=torch.bfloat16, device="cuda")
    symm_mem.rendezvous(buf, tp.group)

    def one_shot(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf[:x.numel()], x.reshape(-1),
                                                        "sum", tp.group, out.view(-1))
        return out

    return one_shot


def bench_all_reduce(tp, rows: list[int], widths: list[int], per_graph: int = 16) -> list[dict]:
    """Microseconds of one captured sum over the ranks of [rows, width] bf16, in each form:
    `comm.all_reduce` as the step calls it (the pushed one-shot sum, `push_sum`; NCCL, after
    a copy of the input), PyTorch's own one-shot (`torch_one_shot`), and a sub-layer's end:
    the pushed sum, then the fused residual add + norm (two launches), and
    `comm.all_reduce_add_norm` (one). A graph of `per_graph` in a chain, replayed on every
    rank at once."""
    from mla_func.kernels.linear.norm import add_rmsnorm

    runtime = Runtime(torch.device("cuda", torch.cuda.current_device()))
    counters, eps = runtime.counters, 1e-6
    out = []
    for width in widths:
        w = torch.rand(width, device="cuda", dtype=torch.bfloat16) + 0.5
        torch_sum = _torch_one_shot(tp, width, rows)
        for n in rows:
            x = torch.randn(n, width, device="cuda", dtype=torch.bfloat16)
            row = {"hidden": width, "rows": n}
            for name, one_shot, end in (("one_shot", True, "sum"), ("nccl", False, "sum"),
                                        ("torch_one_shot", True, "torch"),
                                        ("one_shot_add_norm", True, "apart"),
                                        ("fused", True, "fused")):
                opts = KernelOptions(one_shot=one_shot, fused=True, experts="triton")
                prepare(tp, opts, counters, x.dtype)

                def chain(x: torch.Tensor = x, opts: KernelOptions = opts, end: str = end,
                          w: torch.Tensor = w, torch_sum=torch_sum) -> torch.Tensor:
                    y, h = x, x
                    for _ in range(per_graph):
                        if end == "sum":
                            y = all_reduce(y, tp, opts, counters)
                        elif end == "torch":
                            y = torch_sum(y)
                        elif end == "apart":
                            h, y = add_rmsnorm(h, all_reduce(y, tp, opts, counters), w, eps)
                        else:
                            h, y = all_reduce_add_norm(y, h, w, eps, tp, opts, counters)
                    return y

                graph = capture_graph(chain)
                dist.barrier()
                ms = cuda_time_ms(graph.replay, warmup=5, reps=50)
                row[f"{name}_us"] = ms / per_graph * 1e3
            out.append(row)
    return out


def bench_model(cfg, params, args, ceil, label: str, **forms: bool
                ) -> tuple[list[dict], dict]:
    """Decode steps in full graphs (back to back and one at a time) at each batch and
    context (`args.ctx`), the cache in `args.kv_dtype`; the capture's seconds and pool.
    `forms`: the sums' forms (`KernelOptions`'s `one_shot`, `reduce_norm`; default the
    plan's)."""
    from mla_func.compile_step import compile_step

    biggest = max(args.batches)
    pages_each = -(-(max(args.ctx) + 1) // args.page_size)
    state = mf.init_state(cfg, biggest * pages_each + 2, args.page_size, device="cuda",
                          dtype=torch.bfloat16, kv_dtype=args.kv_dtype)
    kernels = replace(default_options("cuda", "triton"), **forms)
    step = compile_step(params, state, mode="full", max_seqs=biggest, max_pages=pages_each,
                        kernels=kernels, progress=False)
    capture = {"what": label, "capture_s": step.report["capture_seconds"],
               "pool_gib": step.report["graph_pool_bytes"] / 2**30}
    chain = StateChain(state)  # each step consumes the state: the chain passes it on
    rows = full_decode_rows(params, chain, step, label, args.ctx, args.batches, pages_each,
                            ceil, state.row_bytes, seed=lambda b, ctx: b, kernels=kernels)
    del step, state, chain
    torch.cuda.empty_cache()
    return rows, capture


def bench_generate(cfg, params, args, label: str, budget: int | None) -> dict:
    """`generate`'s output tokens/s on the workload of `args`, steps of `budget` tokens (None:
    the engine's default for these params, `engine.default_batch_tokens`)."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, cfg.vocab_size, (args.gen_requests, args.gen_prompt),
                            generator=g).tolist()
    kw = dict(mode="full_and_piecewise", attention_backend="triton", eos_token_id=None,
              page_size=args.page_size, max_seqs=args.gen_requests, progress=False,
              kv_dtype=args.kv_dtype, max_batch_tokens=budget)
    mf.generate(cfg, params, prompts, 2, **kw)  # warm-up: Triton's first compiles
    torch.cuda.synchronize()
    out = mf.generate(cfg, params, prompts, args.gen_new, **kw)
    new = sum(len(t) for t in out.tokens)
    return {"what": label, "budget": budget or default_batch_tokens(params.tp.size),
            "out_tok_s": new / out.wall_time_s, "loop_s": out.wall_time_s,
            "setup_s": out.setup_time_s, "steps": out.steps}


def run(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="bench tp")
    add_args(p)
    args = p.parse_args(argv)
    tp, device = init_from_env("cuda")
    if not tp.sharded:
        raise SystemExit("bench tp runs under torchrun with 2 or more processes: "
                         "torchrun --nproc-per-node 2 -m scripts.bench tp")
    main = tp.rank == 0
    ceil = measure_ceilings()
    result: dict = {"gpu": torch.cuda.get_device_name(), "ranks": tp.size, "ceilings": ceil,
                    "all_reduce": bench_all_reduce(tp, args.allreduce_rows, args.hidden)}
    cfg = mf.MLAConfig.preset(args.preset)
    budgets = args.gen_batch_tokens or [None]
    one = "tp=1 (rank 0 alone)"
    decode, captures, gens = [], [], []
    if args.no_baseline:  # this rank's share only, drawn a layer at a time
        params = random_shard(cfg, tp, 0, device, torch.bfloat16, args.weights)
    else:
        whole = mf.init_params(cfg, seed=0, device=device, dtype=torch.bfloat16)
        whole = quantize_fp8(whole) if args.weights == "fp8" else whole
        if main:
            t0 = time.perf_counter()
            rows, cap = bench_model(cfg, whole, args, ceil, one)
            decode += rows
            captures.append(cap)
            if not args.skip_generate:
                gens += [bench_generate(cfg, whole, args, one, b) for b in budgets]
            print(f"one GPU measured in {time.perf_counter() - t0:.0f} s", flush=True)
        dist.barrier()
        params = shard_params(whole, tp)
        del whole
    torch.cuda.empty_cache()
    label = f"tp={tp.size}"
    rows, cap = bench_model(cfg, params, args, ceil, label)
    decode += rows
    if not args.no_baseline:
        decode += bench_model(cfg, params, args, ceil, f"tp={tp.size}, sum then add + norm",
                              reduce_norm=False)[0]
        decode += bench_model(cfg, params, args, ceil, f"tp={tp.size}, nccl only",
                              one_shot=False)[0]
    captures.append({**cap, "rank": tp.rank})
    if not args.skip_generate:
        gens += [bench_generate(cfg, params, args, label, b) for b in budgets]
    allcaps = [None] * tp.size
    dist.all_gather_object(allcaps, captures[-1])
    result.update(decode=decode, capture=captures[:-1] + allcaps if main else [],
                  generate=gens)
    if main:
        reduce_us = {(r["hidden"], r["rows"]): r for r in result["all_reduce"]}
        for row in decode:
            if row["what"] == label:
                us = reduce_us.get((cfg.hidden_size, row["batch"]), {}).get("one_shot_us")
                n = 2 * cfg.num_hidden_layers + 1
                row["collectives_ms"] = None if us is None else n * us / 1e3
        base = {(r["ctx"], r["batch"]): r for r in decode if r["what"] == one}
        for row in decode:
            if (row["ctx"], row["batch"]) in base:
                row["vs_tp1"] = (row["full_pipelined_ms"]
                                 / base[(row["ctx"], row["batch"])]["full_pipelined_ms"])
        print_table(result["all_reduce"], ["hidden", "rows", "one_shot_us", "torch_one_shot_us",
                                           "nccl_us", "one_shot_add_norm_us", "fused_us"],
                    "captured all-reduce (us)")
        print_table(decode, ["what", "batch", "ctx", "floor_ms", "collectives_ms", "full_ms",
                             "full_pipelined_ms", "vs_tp1"], "decode step (ms)")
        print_table(allcaps, ["rank", "capture_s", "pool_gib"], "capture")
        if gens:
            print_table(gens, list(gens[0]), "generate")
    finish(tp)
    return result if main else {}


__all__ = ["add_args", "run"]
