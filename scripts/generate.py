"""Greedy generation with continuous batching on random weights or a checkpoint; prints throughput.

Random prompts of `--prompt-len` tokens (seeded) go through `mla_func.generate`; the script prints
output tokens/s, steps and wall time, and the first generated tokens of a few prompts. Weights
that would not fit in the device's available memory are refused before any is allocated.

Usage:
  python scripts/generate.py --preset tiny                       # CPU, seconds
  python scripts/generate.py --preset v2-lite --device cuda --prompts 32 --mode piecewise
  python scripts/generate.py --checkpoint DIR --device cuda --dtype bfloat16
"""

import argparse
import sys
import time

try:  # `python -m scripts.generate`, and the tests
    from scripts import cli
except ImportError:  # `python scripts/generate.py`: this folder is on the path
    import cli

SHOW_TOKENS = 12  # tokens a printed prompt shows before it counts the rest
RENAME = {"attention_backend": "backend"}  # package argument -> this script's option


def param_bytes(cfg, dtype, weights: str = "bf16") -> int:
    """Bytes of `cfg`'s parameters in `dtype`, counted on the meta device (nothing allocated);
    `weights` "fp8": the projections (but W_UK / W_UV, `fp8_params.ABSORBED`) at one byte a
    value and a float32 scale a 128 x 128 block (the blocks' count estimated from the
    values')."""
    import mla_func as mf
    from mla_func.fp8_params import ABSORBED, map_projections
    from mla_func.params import tensor_leaves

    params = mf.init_params(cfg, device="meta", dtype=dtype)
    total = sum(t.numel() * t.element_size() for _, t in tensor_leaves(params))
    if weights == "fp8":
        values: list[int] = []
        map_projections(params, lambda w, kind: w if kind in ABSORBED
                        else values.append(w.numel()) or w)
        total -= sum(values) * (dtype.itemsize - 1 - 4 / 128**2)
    return int(total)


def check_memory(cfg, dtype, device: str, tp=None, weights: str = "bf16") -> None:
    """ValueError if `cfg`'s weights in `dtype` (a torch.dtype; "fp8" `weights`: block FP8;
    one rank's share on `tp`) need more than `device` has available: on a CPU, V2-Lite's
    float32 random weights are 58 GiB and V3's 2.5 TiB, and the allocator (or the OOM killer)
    would fail only after minutes of filling memory."""
    from mla_func import memory

    need = param_bytes(cfg, dtype, weights) // (tp.size if tp is not None else 1)
    free = memory.available_bytes(device)
    if free is not None and need > free:
        raise ValueError(f"the weights need {memory.human(need)} ({str(dtype)[6:]}) but "
                         f"{device} has {memory.human(free)} available; use a smaller preset, "
                         "another device or a narrower dtype")


def _out_of_memory(err: RuntimeError) -> bool:
    """Whether `err` is an allocation failure (CUDA's OutOfMemoryError, or the CPU allocator's
    RuntimeError), which the user fixes with smaller sizes, not a bug to show a traceback of."""
    import torch

    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or any(
        words in text for words in ("not enough memory", "can't allocate memory",
                                    "you tried to allocate"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default=None, choices=cli.PRESET_NAMES,
                     help="random weights (default: tiny)")
    src.add_argument("--checkpoint", default=None, help="HF checkpoint directory (load_hf)")
    ap.add_argument("--prompts", type=cli.int_at_least(1), default=4, help="number of prompts")
    ap.add_argument("--prompt-len", type=cli.int_at_least(1), default=16)
    ap.add_argument("--max-new-tokens", type=cli.int_at_least(1), default=8)
    ap.add_argument("--mode", default="eager", choices=cli.MODES)
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"),
                    help="attention backend (auto: triton on CUDA with bf16/fp16 weights, "
                         "else torch)")
    ap.add_argument("--device", type=cli.device_name, default=None,
                    help="cpu, cuda or cuda:N (default: cuda if there is one, else cpu)")
    ap.add_argument("--dtype", default=None, choices=cli.DTYPE_NAMES,
                    help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", default="bf16", choices=("bf16", "fp8"),
                    help="fp8: the projections and experts in DeepSeek's block FP8 (a "
                         "checkpoint's kept as stored, random weights quantised: "
                         "quantize_fp8); bf16: in --dtype")
    ap.add_argument("--kv-dtype", default="auto", choices=("auto", "fp8"),
                    help="the latent cache: floats in --dtype (auto), or FP8 rows (656 bytes a "
                         "token a layer at V2/V3's sizes instead of 1,152 in bf16)")
    ap.add_argument("--page-size", type=cli.int_at_least(1), default=16)
    ap.add_argument("--max-batch-tokens", type=cli.int_at_least(1), default=None,
                    help="tokens per step (default: the engine's, 8192 a rank: "
                         "engine.default_batch_tokens)")
    ap.add_argument("--max-seqs", type=cli.int_at_least(1), default=64)
    ap.add_argument("--max-graph-tokens", type=cli.int_at_least(1), default=None,
                    help="graph modes: steps of more tokens run eagerly (default: the "
                         "package's, dims.TOKENS_MAX_CAPTURED)")
    ap.add_argument("--no-eos", action="store_true", help="ignore eos: always generate M tokens")
    ap.add_argument("--show", type=cli.int_at_least(0), default=3,
                    help="prompts whose tokens are printed")
    ap.add_argument("--tp", type=cli.int_at_least(1), default=1,
                    help="tensor parallel over N processes, one a GPU: torchrun "
                         "--nproc-per-node N scripts/generate.py --tp N (rank 0 prints)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: `--help` and a mistyped option end before torch is imported; a CUDA
    device asked for where there is none ends right after."""
    ap = parser()
    args = ap.parse_args(argv)
    import torch

    cli.check_ranks(ap, args.tp, "scripts/generate.py")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("argument --device: no CUDA device is available (use --device cpu)")
    if args.preset is None and args.checkpoint is None:
        args.preset = "tiny"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    return args


def load(args: argparse.Namespace, tp=None):
    """(config, parameters) of the checkpoint or preset (this rank's shard on `tp`: read as
    slices of a checkpoint; random weights drawn a layer at a time, `random_shard`), refused
    (ValueError) before anything is allocated if the weights would not fit in the device's
    available memory."""
    import mla_func as mf
    from mla_func.dtypes import DTYPES

    dtype = DTYPES[args.dtype]
    if args.checkpoint:
        check_memory(mf.MLAConfig.from_hf(args.checkpoint), dtype, args.device, tp,
                     args.weights)
        return mf.load_hf(args.checkpoint, device=args.device, dtype=dtype, mesh=tp,
                          weights=args.weights)
    cfg = mf.MLAConfig.preset(args.preset)
    if tp is not None and tp.sharded:  # drawn a layer at a time: this rank's share only
        from mla_func.parallel.shard import random_shard

        check_memory(cfg, dtype, args.device, tp, args.weights)
        return cfg, random_shard(cfg, tp, args.seed, args.device, dtype, args.weights)
    check_memory(cfg, dtype, args.device)
    whole = mf.init_params(cfg, seed=args.seed, device=args.device, dtype=dtype)
    if args.weights == "fp8":
        from mla_func.quantize import quantize_fp8

        whole = quantize_fp8(whole)
    return cfg, whole


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tp == 1:
        return run(args)
    from mla_func.parallel.group import finish, init_from_env

    tp, device = init_from_env(args.device.split(":")[0])
    args.device = str(device)
    code = run(args, tp)
    if code == 0:  # an error ends this rank now; torchrun stops the others
        finish(tp)
    return code


def run(args: argparse.Namespace, tp=None) -> int:
    """Generate as `args` say (on one rank of `tp`: rank 0 prints)."""
    import torch

    import mla_func as mf
    from mla_func.parallel.group import SINGLE

    tp = tp or SINGLE
    say = print if tp.rank == 0 else (lambda *a, **k: None)  # rank 0 prints the results
    t0 = time.perf_counter()
    try:  # what the user can get wrong (checkpoint, sizes, backend) ends in one line, exit 2
        cfg, params = load(args, tp if tp.sharded else None)
        load_s = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(args.seed)
        # Random ids away from the special tokens at the start of the vocabulary.
        low = min(2, cfg.vocab_size - 1)
        prompts = torch.randint(low, cfg.vocab_size, (args.prompts, args.prompt_len),
                                generator=gen)
        kw = dict(mode=args.mode, attention_backend=args.backend, page_size=args.page_size,
                  kv_dtype=args.kv_dtype,
                  max_batch_tokens=args.max_batch_tokens, max_seqs=args.max_seqs,
                  eos_token_id=None if args.no_eos else "config",
                  **({"max_graph_tokens": args.max_graph_tokens}
                     if args.max_graph_tokens else {}))
        # A first call compiles the kernels (and, in graph modes, captures): timed apart, so
        # that the rate below is the steady one.
        t1 = time.perf_counter()
        mf.generate(cfg, params, prompts[:1].tolist(), 1, progress=False, **kw)
        warm_s = time.perf_counter() - t1
        out = mf.generate(cfg, params, prompts.tolist(), args.max_new_tokens, **kw)
    except ValueError as err:  # the package's input errors are ValueError subclasses
        where = f"rank {tp.rank}: " if tp.sharded else ""  # every rank's error is shown
        print(f"error: {where}{cli.cli_words(str(err), parser(), RENAME)}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not _out_of_memory(err):
            raise
        print(f"error: out of memory: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    source = args.checkpoint or f"preset {args.preset} (random weights)"
    ranks = f", tp {tp.size}" if tp.sharded else ""
    cache = (", fp8 weights" if args.weights == "fp8" else "") + (
        ", fp8 cache" if args.kv_dtype == "fp8" else "")
    say(f"{source}: {args.prompts} prompts x {args.prompt_len} tokens, max_new_tokens "
        f"{args.max_new_tokens}, mode {args.mode}, {out.attention_backend} attention, "
        f"{args.device} {args.dtype}{cache}{ranks}; weights ready in {load_s:.1f} s, warm-up "
        f"(first call: kernel compiles) {warm_s:.1f} s, engine (cache, graphs) in "
        f"{out.setup_time_s:.1f} s")
    say(f"throughput: {out.tokens_per_s:.1f} output tokens/s, warm ({out.output_tokens} "
        f"tokens, {out.prompt_tokens} prompt tokens, {out.steps} steps, "
        f"{out.wall_time_s:.2f} s)")
    for i in range(min(args.show, len(out.tokens))):
        tokens, more = out.tokens[i][:SHOW_TOKENS], len(out.tokens[i]) - SHOW_TOKENS
        say(f"  prompt {i} [{out.status[i]}]: {tokens}"
            + (f" ... ({more} more)" if more > 0 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
