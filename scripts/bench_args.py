"""The benchmarks' options, one function a benchmark, importing nothing but the standard library.

`python -m scripts.bench WHAT` (bench.py) routes each option to the benchmarks that define it
and checks every value before any GPU work; it reads the options here rather than from the
benchmarks' modules, which import torch and Triton, so that `--help` and a mistyped option
answer at once. Each benchmark takes its options from here too (`bench_kernels.add_args` is
`kernels`), and so does its standalone command line (`python -m scripts.bench_kernels`).
"""

import argparse
from collections.abc import Callable

try:  # `python -m scripts....`
    from scripts.cli import int_at_least
except ImportError:  # `python scripts/bench_kernels.py`: this folder is on the path
    from cli import int_at_least


def step(p: argparse.ArgumentParser) -> None:
    """bench_step: decode/prefill step times, HF, generate."""
    p.add_argument("--parts", nargs="+", default=["hf", "decode", "prefill", "generate"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--prefill-tokens", type=int, nargs="+",
                   default=[128, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--prefill-rounds", type=int, default=4,
                   help="alternating eager/piecewise timings per prompt length (medians kept)")
    p.add_argument("--hf-ctx", type=int, default=1024)
    p.add_argument("--hf-compile-batches", type=int, nargs="+", default=[1])
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="largest piecewise bucket (default: the compiler's, "
                        "dims.TOKENS_MAX_CAPTURED)")
    p.add_argument("--gen-batch-tokens", type=int, default=8192,
                   help="generate: the engine's max_batch_tokens")
    p.add_argument("--backend", default="triton")
    p.add_argument("--gen-requests", type=int, default=128)
    p.add_argument("--gen-prompt", type=int, default=512)
    p.add_argument("--gen-new", type=int, default=256)


def kernels(p: argparse.ArgumentParser) -> None:
    """bench_kernels: the MLA attention kernels."""
    p.add_argument("--heads", type=int, nargs="+", default=[16, 128])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--page", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--quick", action="store_true", help="H 16/128, B 1/128, ctx 1024/4096")
    p.add_argument("--sweep", action="store_true", help="also tune decode plans")
    p.add_argument("--sweep-only", action="store_true", help="only the decode plan sweep")
    p.add_argument("--sweep-seconds", type=float, default=210.0,
                   help="time limit of the descent over all sweep cases (compiles included)")
    p.add_argument("--no-ref", action="store_true", help="skip the torch reference")
    p.add_argument("--kv-dtype", default="auto", choices=("auto", "fp8"),
                   help="the latent cache: bf16 (auto) or FP8 rows (656 bytes a token; "
                        "bandwidth counted over them)")


def moe(p: argparse.ArgumentParser) -> None:
    """bench_moe: one MoE layer."""
    p.add_argument("--tokens", type=int_at_least(1), nargs="+",
                   default=[1, 8, 32, 128, 512, 4096])
    p.add_argument("--layers", type=int_at_least(1), default=4,
                   help="distinct weight sets per graph")
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--sweep", action="store_true", help="try tile configs per token count")
    p.add_argument("--rounds", type=int_at_least(1), default=5,
                   help="timing rounds of the layer's forms, in alternating order (the median "
                        "and the rounds' spread are reported)")
    p.add_argument("--weights", choices=["bf16", "fp8"], default="bf16",
                   help="fp8: block-FP8 expert weights (the FP8 GEMMs), their floor in FP8 "
                        "bytes at the FP8 matmul rate, beside the bf16 forms")


def capture(p: argparse.ArgumentParser) -> None:
    """bench_capture: one compile_step, then its graphs against eager."""
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--backend", default="triton")
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--prefill", default="16,64,256,1024,4096")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--max-seqs", type=int, default=None)
    p.add_argument("--reps", type=int, default=20)


def segments(p: argparse.ArgumentParser) -> None:
    """bench_segments: Inductor-compiled piecewise segments against plain ones."""
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--backend", default="triton")
    p.add_argument("--segments", default="plain,inductor")
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--prefill", default="16,64,256,1024")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--page-size", type=int, default=16)
    # Inductor compiles a segment once for every bucket, but capture time grows with them.
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)


def tp(p: argparse.ArgumentParser) -> None:
    """bench_tp (under torchrun): tensor parallel against one GPU."""
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--ctx", type=int, nargs="+", default=[512])
    p.add_argument("--weights", default="bf16", choices=("bf16", "fp8"),
                   help="fp8: random weights quantised to block FP8")
    p.add_argument("--kv-dtype", default="auto", choices=("auto", "fp8"))
    p.add_argument("--no-baseline", action="store_true",
                   help="no one-GPU run and only the plan's forms; each rank draws only its "
                        "share (random_shard): V3 does not fit one GPU")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 128])
    p.add_argument("--allreduce-rows", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--hidden", type=int, nargs="+", default=[2048, 7168])
    p.add_argument("--gen-requests", type=int, default=128)
    p.add_argument("--gen-prompt", type=int, default=512)
    p.add_argument("--gen-new", type=int, default=256)
    p.add_argument("--gen-batch-tokens", type=int_at_least(1), nargs="+", default=None,
                   help="generate's step budgets, each run on one GPU and sharded (default: "
                        "the engine's, 8192 a rank)")
    p.add_argument("--skip-generate", action="store_true")
    p.add_argument("--page-size", type=int, default=16)


def shape(text: str) -> tuple[int, int]:
    """An argparse `type`: "NxK" (output by input width) as (N, K), both at least 1."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NxK (e.g. 2048x2048), got {text!r}")
    return int(parts[0]), int(parts[1])


shape.__name__ = "NxK"


def fp8(p: argparse.ArgumentParser) -> None:
    """bench_fp8: the block-FP8 GEMM at a few rows against bf16 cuBLAS."""
    p.add_argument("--rows", type=int_at_least(1), nargs="+", default=[1, 4, 16])
    # V2-Lite's o_proj, query and kv_a (fused in the model: 3648), V3's dense MLP down.
    p.add_argument("--shapes", type=shape, nargs="+",
                   default=[(2048, 2048), (3072, 2048), (576, 2048), (7168, 18432)],
                   help="weights as NxK: N outputs, K inputs")
    p.add_argument("--sweep", action="store_true",
                   help="also time other launches (column tile, grid size, warps)")


def precision(p: argparse.ArgumentParser) -> None:
    """bench_precision: block-FP8 weights and the FP8 latent cache against bf16."""
    p.add_argument("--preset", default="v2-lite")
    p.add_argument("--precisions", nargs="+", default=["fp8", "fp8-cache", "fp8+fp8-cache"],
                   choices=["bf16", "fp8", "fp8-cache", "fp8+fp8-cache"])
    p.add_argument("--batches", type=int_at_least(1), nargs="+", default=[1, 32, 128])
    p.add_argument("--contexts", type=int_at_least(1), nargs="+", default=[512, 4096])
    p.add_argument("--page-size", type=int_at_least(1), default=64)
    p.add_argument("--prompts", type=int_at_least(0), default=8,
                   help="generate's prompts for the accuracy table (0: none)")
    p.add_argument("--new", type=int_at_least(1), default=16)


OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "step": step, "kernels": kernels, "moe": moe, "capture": capture, "segments": segments,
    "tp": tp, "fp8": fp8, "precision": precision}
