"""Capture artifacts: `python scripts/capture.py --preset tiny|v2-lite|v3 [--out DIR]`.

Always writes the plan (no GPU, parameters on the meta device): plan.json + segment_NN.py, under
--out (default out/PRESET, git-ignored). On a CUDA machine (unless --plan-only) it also captures
every bucket of `--mode` with random weights and writes capture_report.json (capture seconds,
graph-pool bytes, per-bucket replay vs eager time and max difference) and graph.dot, the
CUDA-graph dump of one piecewise bucket. A report and dump that an earlier run left in --out are
moved aside (capture_report.prev.json, graph.prev.dot) once the new plan is saved.

The golden plan of tests/test_capture_golden.py is regenerated with
`python scripts/capture.py --preset tiny --plan-only --out graphs/tiny`.
"""

import argparse
import json
import os
import sys
import time

try:  # `python -m scripts.capture`, and the tests
    from scripts.cli import DTYPE_NAMES, cli_words, int_at_least
except ImportError:  # `python scripts/capture.py`: this folder is on the path
    from cli import DTYPE_NAMES, cli_words, int_at_least

# Cache geometry of the plans in graphs/ (capacity dims are part of a plan).
GEOMETRY = {"tiny": (64, 4, 8), "v2-lite": (4096, 16, 256), "v3": (4096, 16, 256)}
# What a GPU run leaves in --out: not this plan's once a new plan is saved there.
GPU_ARTIFACTS = {"capture_report.json": "capture_report.prev.json", "graph.dot": "graph.prev.dot"}


def build_plan(preset: str, backend: str = "torch", max_tokens: int | None = None,
               max_seqs: int | None = None, tp=None):
    """The preset's capture plan (on one rank of `tp`: its shard's)."""
    import mla_func as mf
    from mla_func.compile_step import plan_step
    from mla_func.parallel.shard import on_mesh

    cfg = mf.MLAConfig.preset(preset)
    num_pages, page_size, max_pages = GEOMETRY[preset]
    params = on_mesh(mf.init_params(cfg, device="meta"), tp)
    state = mf.init_state(cfg, num_pages=num_pages, page_size=page_size, device="meta")
    plan = plan_step(params, state, max_tokens=max_tokens, max_seqs=max_seqs,
                     max_pages=max_pages, backend=backend)
    plan.meta = {"preset": preset, **plan.meta, "num_pages": num_pages,
                 "page_size": page_size, "max_pages": max_pages}
    return plan


def _time(fn, reps: int = 5) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def gpu_report(args, out: str, tp=None) -> dict:
    """Capture on the GPU, check the buckets against eager, time both (on one rank of `tp`,
    every rank running the same steps; rank 0 writes the graph dump)."""
    import mla_func as mf
    from mla_func.capture.capture import dump_graph
    from mla_func.compile_step import compile_step, decode_batch
    from mla_func.dtypes import DTYPES
    from mla_func.kernels.plan import default_options
    from mla_func.parallel.shard import on_mesh

    cfg = mf.MLAConfig.preset(args.preset)
    num_pages, page_size, max_pages = GEOMETRY[args.preset]
    dtype = DTYPES[args.dtype]
    params = on_mesh(mf.init_params(cfg, seed=0, device="cuda", dtype=dtype), tp)
    state = mf.init_state(cfg, num_pages, page_size, device="cuda", dtype=dtype)
    step = compile_step(params, state, mode=args.mode, max_tokens=args.max_tokens,
                        max_seqs=args.max_seqs, max_pages=max_pages, backend=args.backend)
    report = {"preset": args.preset, "dtype": args.dtype, **step.report, "buckets_checked": []}
    full_args = lambda b: step._merge((state, b))  # noqa: E731
    sizes = args.check
    for kind in ("full", "piecewise"):
        table = step.full if kind == "full" else step.piecewise
        for size in [s for s in sizes if s in table]:
            # `size` decodes of a 64-token context on the scratch page (slot -1: no writes).
            ctx = min(64, max_pages * page_size)
            batch = decode_batch(size, max_pages, page_size, "cuda",
                                 default_options("cuda", args.backend), ctx)
            eager_out = step.fn(*full_args(batch))[0]
            graph_out = step.run(kind, size, full_args(batch))[0]
            report["buckets_checked"].append({
                "mode": kind, "size": size,
                "eager_ms": round(_time(lambda b=batch: step.fn(*full_args(b))), 4),
                "replay_ms": round(_time(lambda b=batch, k=kind, s=size:
                                         step.run(k, s, full_args(b))), 4),
                "max_abs_diff": float((eager_out - graph_out).abs().max()),
            })
    if step.piecewise and (tp is None or tp.rank == 0):
        size = min(step.piecewise)
        report["dot"] = dump_graph(step, size, os.path.join(out, "graph.dot"))
    return report


_positive = int_at_least(1)


def _sizes(text: str) -> list[int]:
    try:
        return [_positive(s) for s in text.split(",")]
    except ValueError as err:  # ArgumentTypeError or int()'s
        raise argparse.ArgumentTypeError(f"a comma-separated list of sizes: {err}") from err


def out_problem(out: str) -> str | None:
    """Why `out` cannot become the output directory (None if it can), checked before the plan
    is built: an existing file, or a nearest existing ancestor that is a file or not writable."""
    if os.path.exists(out):
        if not os.path.isdir(out):
            return f"{out} exists and is not a directory"
        return None if os.access(out, os.W_OK) else f"{out} is not writable"
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot create {out}: {parent} is a file"
    return None if os.access(parent, os.W_OK) else f"cannot create {out}: {parent} is not writable"


def move_aside(out: str) -> list[str]:
    """Moves a report and dump an earlier GPU run left in `out` to their .prev names (never
    deleted: a GPU report is expensive); returns the names moved."""
    moved = []
    for name, prev in GPU_ARTIFACTS.items():
        if os.path.exists(os.path.join(out, name)):
            os.replace(os.path.join(out, name), os.path.join(out, prev))
            moved.append(name)
    return moved


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=sorted(GEOMETRY))
    p.add_argument("--out", default=None, help="default: out/PRESET")
    p.add_argument("--backend", default="torch", choices=("torch", "triton"))
    p.add_argument("--mode", default="full_and_piecewise",
                   choices=("piecewise", "full", "full_and_piecewise"))
    p.add_argument("--max-tokens", type=_positive, default=None,
                   help="largest piecewise bucket (default: dims.TOKENS_MAX_CAPTURED, 2560)")
    p.add_argument("--max-seqs", type=_positive, default=None,
                   help="largest full bucket, at most --max-tokens (default: 512 or less)")
    p.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES)
    p.add_argument("--check", default=None, type=_sizes,
                   help="GPU: buckets to compare with eager (comma-separated; default "
                        "1,8,32,128,512)")
    p.add_argument("--plan-only", action="store_true")
    p.add_argument("--tp", type=_positive, default=1,
                   help="tensor parallel over N processes: torchrun --nproc-per-node N "
                        "scripts/capture.py --tp N (artifacts from rank 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)  # --help and a mistyped option end here, before torch's import
    # Not graphs/PRESET: that is the golden plan, which trying flags must not rewrite.
    out = args.out or os.path.join("out", args.preset)
    problem = out_problem(out)
    if problem:  # before the plan is built (seconds to a minute)
        p.error(f"argument --out: {problem}")
    import torch

    from mla_func.parallel.group import SINGLE, finish, init_from_env

    if args.tp == 1:
        return run(p, args, out, SINGLE)
    tp, _ = init_from_env("cuda" if torch.cuda.is_available() else "cpu")
    if tp.size != args.tp:
        p.error(f"argument --tp: {args.tp} but {tp.size} processes; run "
                f"torchrun --nproc-per-node {args.tp} scripts/capture.py --tp {args.tp}")
    code = run(p, args, out, tp)
    if code == 0:  # an error ends this rank now; torchrun stops the others
        finish(tp)
    return code


def run(p, args, out: str, tp) -> int:
    """Plan (and on a GPU capture and check) as `args` say, on one rank of `tp` (rank 0
    writes and prints)."""
    import torch

    import mla_func as mf
    from mla_func.capture.artifacts import save_plan

    say = print if tp.rank == 0 else (lambda *a, **k: None)  # one rank writes and prints
    try:  # the package's input errors (CaptureError, ConfigError) are ValueError subclasses
        start = time.perf_counter()
        layers = mf.MLAConfig.preset(args.preset).num_hidden_layers
        say(f"planning {args.preset} ({layers} layers: traced on the meta device, a few "
            f"seconds to a minute) ...", flush=True)
        plan = build_plan(args.preset, args.backend, args.max_tokens, args.max_seqs, tp)
        if tp.rank:  # every rank plans and captures alike; rank 0 writes
            if not args.plan_only and torch.cuda.is_available():
                gpu_report(args, out, tp)
            return 0
        paths = save_plan(plan, out)
        say(f"plan: {len(plan.segments)} segments ({plan.num_distinct} distinct), "
            f"{len(plan.ops)} splitting ops, {time.perf_counter() - start:.1f} s -> {paths[0]}")
        moved = move_aside(out)
        if moved:
            print(f"moved the previous run's {', '.join(moved)} aside to "
                  f"{', '.join(GPU_ARTIFACTS[m] for m in moved)} in {out}")
        if args.plan_only or not torch.cuda.is_available():
            if not args.plan_only:
                print("no CUDA device: plan only (nothing captured"
                      + (", --check not run)" if args.check else ")"), file=sys.stderr)
            return 0
        args.check = args.check or [1, 8, 32, 128, 512]
        report = gpu_report(args, out, tp)
        with open(os.path.join(out, "capture_report.json"), "w") as f:
            json.dump(report, f, indent=1)
    except (ValueError, OSError, torch.OutOfMemoryError) as err:
        print(f"error: {cli_words(str(err), p)}", file=sys.stderr)
        return 2
    print(json.dumps({k: report[k] for k in ("capture_seconds", "graph_pool_bytes", "graphs")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
