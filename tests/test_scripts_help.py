"""Every script a user runs reads its command line before importing torch, Triton or mla_func:
`--help` and a mistyped option answer without those imports (seconds on a cold machine).

Each command runs as a user types it, in a fresh interpreter under `-X importtime`, which lists
every module the process imported; the names the scripts' options take (scripts/cli.py,
scripts/bench_args.py) are the package's own tables.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "mla_func")

# (command line after `python3`, a word its help prints)
HELP = [
    (["scripts/generate.py"], "--max-new-tokens"),
    (["scripts/capture.py"], "--plan-only"),
    (["scripts/check_shapes.py"], "--break"),
    (["-m", "scripts.generate"], "--max-new-tokens"),
    (["-m", "scripts.capture"], "--plan-only"),
    (["-m", "scripts.bench"], "--out"),
    (["-m", "scripts.bench", "all"], "--gen-requests"),  # every benchmark's options
    (["-m", "scripts.bench_kernels"], "--sweep-only"),
    (["-m", "scripts.bench_moe"], "--rounds"),
    (["-m", "scripts.bench_capture"], "--prefill"),
    (["-m", "scripts.bench_fp8"], "--shapes"),
    (["scripts/bench_kernels.py"], "--sweep-only"),
    (["scripts/bench_moe.py"], "--rounds"),
    (["-m", "scripts.profile_step"], "--graph"),
    (["-m", "scripts.profile_generate"], "--timeline"),
]

# (command line, words its one-line refusal holds)
BAD = [
    (["scripts/generate.py", "--prompts", "0"], "argument --prompts: must be at least 1"),
    (["scripts/generate.py", "--device", "gpu"], "argument --device: expected cpu, cuda"),
    (["scripts/generate.py", "--dtype", "fp8"], "argument --dtype: invalid choice"),
    (["scripts/capture.py", "--max-tokens", "0"], "argument --max-tokens: must be at least 1"),
    (["scripts/check_shapes.py", "--preset", "v9"], "argument --preset: invalid choice"),
    (["-m", "scripts.bench", "step", "--batchez", "3"], "bench step: unknown option --batchez"),
    (["-m", "scripts.bench", "capture", "--max-tokens", "x"], "argument --max-tokens"),
    (["-m", "scripts.bench_moe", "--rounds", "0"], "argument --rounds: must be at least 1"),
    (["-m", "scripts.bench_kernels", "--heads", "x"], "argument --heads"),
    (["-m", "scripts.bench", "fp8", "--shapes", "2048"], "argument --shapes: expected NxK"),
    (["-m", "scripts.profile_step", "--batch", "0"], "argument --batch: must be at least 1"),
    (["-m", "scripts.profile_generate", "--mode", "fast"], "argument --mode: invalid choice"),
]


def run(argv: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python3 -X importtime ARGV` from the repository root: the process, and the heavy
    modules (torch, triton, mla_func and their submodules) it imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    return proc, {m for m in imported if m.split(".")[0] in HEAVY}


def messages(proc: subprocess.CompletedProcess) -> str:
    """stderr without importtime's lines."""
    return "\n".join(line for line in proc.stderr.splitlines()
                     if not line.startswith("import time:"))


@pytest.mark.parametrize("argv, word", HELP, ids=[" ".join(a) for a, _ in HELP])
def test_help_imports_neither_torch_nor_the_package(argv, word):
    proc, heavy = run([*argv, "--help"])
    assert proc.returncode == 0, messages(proc)
    assert proc.stdout.startswith("usage:") and word in proc.stdout
    assert not heavy, f"--help imported {sorted(heavy)[:5]}"


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_argument_errors_import_neither_torch_nor_the_package(argv, words):
    proc, heavy = run(argv)
    err = messages(proc)
    assert proc.returncode not in (0, None) and words in err and "Traceback" not in err, err
    assert not heavy, f"a mistyped option imported {sorted(heavy)[:5]}"


def test_the_option_tables_are_the_packages():
    """scripts/cli.py writes out the package's names (it may not import them)."""
    from mla_func.dtypes import DTYPES
    from mla_func.presets import PRESETS
    from mla_func.validation import MODES
    from scripts import cli

    assert cli.DTYPE_NAMES == tuple(DTYPES)
    assert cli.PRESET_NAMES == tuple(PRESETS)
    assert cli.MODES == MODES


def test_each_benchmark_takes_its_options_from_bench_args():
    from scripts import (
        bench_args,
        bench_capture,
        bench_fp8,
        bench_kernels,
        bench_moe,
        bench_precision,
        bench_step,
    )

    assert bench_step.add_arguments is bench_args.step
    assert bench_kernels.add_args is bench_args.kernels
    assert bench_moe.add_args is bench_args.moe
    assert bench_capture.add_args is bench_args.capture
    assert bench_fp8.add_args is bench_args.fp8
    assert bench_precision.add_args is bench_args.precision


def test_messages_speak_the_command_line():
    """The package's `name=value` and bare `name_with_underscores` become the script's own
    options; words that name no option of it stay."""
    from scripts.cli import cli_words
    from scripts.generate import RENAME, parser

    said = ("mode 'full' replays CUDA graphs; use mode='eager', attention_backend='torch' or "
            "page_size=4 (max_seqs <= max_batch_tokens; num_pages=8, foo_bar)")
    assert cli_words(said, parser(), RENAME) == (
        "mode 'full' replays CUDA graphs; use --mode eager, --backend torch or --page-size 4 "
        "(--max-seqs <= --max-batch-tokens; num_pages=8, foo_bar)")
