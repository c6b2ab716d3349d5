"""Benchmarks (GPU): `python -m scripts.bench
step|kernels|moe|capture|segments|fp8|precision|all [--out DIR] [OPTIONS]`, and tensor
parallel against one GPU: `torchrun --nproc-per-node N -m scripts.bench tp`.

Every subcommand measures the copy-bandwidth and matmul ceilings in the same run, prints a
table last and writes bench_<name>.json per benchmark (and the step plot) under --out.

Options. `--out` is this script's own. Every other option goes, with its values unchanged, to
the benchmark that defines it (bench_args.py: step, kernels, moe, capture, segments, tp, fp8,
precision), in that benchmark's syntax: `bench step --batches 1 8` but `bench capture --batches
1,8`. `all` runs kernels, moe, capture and step (not segments: Inductor compiles every segment,
minutes; not tp: it runs under torchrun; not fp8: one kernel's study; not precision: a study of
its own), and gives each option to every one of them that defines it (`--tokens` to moe alone,
`--backend` to capture and step), where it must then be valid for each. An option that no
benchmark of the subcommand defines is an error naming it, as is a value a benchmark's parser
refuses; both are found before any GPU work and before anything is written under --out. Names
are exact, never abbreviations: `--batch` is bench_kernels', not the step's `--batches`.
`python -m scripts.bench WHAT --help` lists the options of WHAT's benchmarks.
"""

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from scripts.bench_args import OPTIONS

# `all` leaves out segments (Inductor compiles every segment: minutes), tp (torchrun), fp8 and
# precision.
BENCHMARKS = {"step": ["step"], "kernels": ["kernels"], "moe": ["moe"], "capture": ["capture"],
              "segments": ["segments"], "tp": ["tp"], "fp8": ["fp8"],
              "precision": ["precision"],
              "all": ["kernels", "moe", "capture", "step"]}
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a value, not an option, as argparse reads it


def benchmark_parser(name: str) -> argparse.ArgumentParser:
    """The options of benchmark `name` (step, kernels, moe, capture, segments, tp or fp8), exact
    names only; read without importing the benchmark (nor torch)."""
    p = argparse.ArgumentParser(prog=f"bench {name}", allow_abbrev=False)
    OPTIONS[name](p)
    return p


def _groups(argv: list[str]) -> list[list[str]]:
    """`argv` cut before every option: [option, its values...] each; values before the first
    option make a group of their own."""
    groups: list[list[str]] = []
    for token in argv:
        is_option = token.startswith("-") and not _NEGATIVE.match(token)
        if is_option or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, list[str]]]:
    """(this script's options: `what`, `--out`; the command line of each benchmark that `what`
    runs, in run order). Every benchmark's line has been checked by its own parser."""
    argv = sys.argv[1:] if argv is None else list(argv)
    top = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__,
                                  allow_abbrev=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("what", choices=list(BENCHMARKS))
    top.add_argument("--out", default="out/bench")
    if not argv or argv[0] not in BENCHMARKS:
        if argv and argv[0][:1] == "-" and argv[0] not in ("-h", "--help"):
            top.error(f"the subcommand ({', '.join(BENCHMARKS)}) comes first, then options")
        top.parse_args(argv[:1])  # the help, or the missing or unknown subcommand: exits
    what, rest = argv[0], argv[1:]
    parsers = {name: benchmark_parser(name) for name in BENCHMARKS[what]}
    if "-h" in rest or "--help" in rest:
        top.print_help()
        for p in parsers.values():
            print()
            p.print_help()
        top.exit()
    own, routed = [what], {name: [] for name in parsers}
    for group in _groups(rest):
        option = group[0].split("=", 1)[0]
        if option == "--out":
            own += group
            continue
        takers = [name for name, p in parsers.items() if option in p._option_string_actions]
        if not takers:
            kind = "option" if option.startswith("-") else "argument"
            names = ", ".join(f"bench_{name}" for name in parsers)
            raise SystemExit(f"bench {what}: unknown {kind} {option} (not an option of "
                             f"{names}; see `bench {what} --help`)")
        for name in takers:
            routed[name] += group
    args = top.parse_args(own)
    for name, p in parsers.items():
        p.parse_args(routed[name])  # a value its benchmark would refuse: refused now
    return args, routed


def run_one(name: str, argv: list[str], out: Path) -> object:
    """Benchmark `name` on its command line `argv`; what it returns is its JSON."""
    module = importlib.import_module(f"scripts.bench_{name}")
    if name != "step":
        return module.run(argv)
    args = benchmark_parser("step").parse_args(argv)
    args.out = str(out)  # its plot goes there
    return module.run(args)


def main(argv: list[str] | None = None) -> int:
    args, routed = parse(argv)
    import torch

    if not torch.cuda.is_available():  # before anything is written under --out
        raise SystemExit(f"bench {args.what} needs a CUDA GPU; none is available")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, bench_argv in routed.items():
        result = run_one(name, bench_argv, out)
        if result != {}:  # {}: a rank of `bench tp` other than 0 (rank 0 writes)
            (out / f"bench_{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
