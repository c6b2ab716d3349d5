"""Benchmarks (GPU): `python -m scripts.bench step|kernels|moe|capture|all [--out DIR]`.

Every subcommand measures the copy-bandwidth and matmul ceilings in the same run, prints a
table last and writes JSON (and the step plot) under --out.
"""

import argparse
import json
import sys
from pathlib import Path


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """(this parser's and the step benchmark's options, the rest for the other benchmarks).
    No abbreviations: `--batch` (kernels) must not be taken for the step's `--batches`, nor
    `--page` (kernels) for `--page-size`."""
    from scripts import bench_step

    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("what", choices=["step", "kernels", "moe", "capture", "all"])
    parser.add_argument("--out", default="out/bench")
    bench_step.add_arguments(parser)
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    from scripts import bench_step

    args, rest = parse(argv)
    if args.what == "step" and rest:  # the others take what the step's parser left
        raise SystemExit(f"bench step: unknown arguments {' '.join(rest)}")
    import torch

    if not torch.cuda.is_available():  # before anything is written under --out
        raise SystemExit(f"bench {args.what} needs a CUDA GPU; none is available")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {}
    for name in (["kernels", "moe", "capture", "step"] if args.what == "all" else [args.what]):
        if name == "step":
            results[name] = bench_step.run(args)
            continue
        module = __import__(f"scripts.bench_{name}", fromlist=["run"])
        results[name] = module.run(rest)
        (Path(args.out) / f"bench_{name}.json").write_text(json.dumps(results[name], indent=1,
                                                                       default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
