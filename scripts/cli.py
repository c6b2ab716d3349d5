"""What the scripts' command lines share, importing nothing but the standard library.

Every script in scripts/ reads its command line before it imports torch or mla_func (seconds
of imports), so that `--help` and a mistyped option answer at once; the checks that need the
package (a CUDA device, a size the engine refuses) come after. This module owns what that
first reading needs: the argparse types (`int_at_least`, `device_name`), `check_ranks`
(--tp against the processes torchrun started), the names the
options take (dtypes, presets, modes), each the package's own table written out here and
checked against it by tests/test_scripts_help.py, and `cli_words`, which rewrites the
package's messages (`mode='eager'`) in a script's terms (`--mode eager`).
"""

import argparse
import os
import re
from collections.abc import Callable, Mapping

# mla_func.dtypes.DTYPES, mla_func.presets.PRESETS and mla_func.validation.MODES, by name.
DTYPE_NAMES = ("bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float")
PRESET_NAMES = ("tiny", "v2-lite", "v3")
MODES = ("eager", "piecewise", "full", "full_and_piecewise")

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
# `name=value` as the package's messages write an argument (the value maybe quoted), or an
# argument's bare name where it has an underscore (a plain word is prose: "mode 'full' ...").
_ARGUMENT = re.compile(r"\b([a-z][a-z_]*)='?([\w.-]+)'?|\b([a-z]+(?:_[a-z]+)+)\b")


def int_at_least(least: int, why: str = "") -> Callable[[str], int]:
    """An argparse `type`: the text as an int >= `least`, else an error argparse prints with
    the flag's name (`why` is appended to it)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}{why}, got {value}")
        return value

    parse.__name__ = f"integer >= {least}"  # how argparse names the type in its errors
    return parse


def device_name(text: str) -> str:
    """An argparse `type`: `cpu`, `cuda` or `cuda:N` (whether that device exists is asked
    after the command line is read, once torch is imported)."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def cli_words(message: str, parser: argparse.ArgumentParser,
              rename: Mapping[str, str] | None = None) -> str:
    """`message` with each argument that names one of `parser`'s options written as that
    option (`max_seqs=9` -> `--max-seqs 9`, `max_seqs <= max_tokens` -> `--max-seqs <=
    --max-tokens`); `rename` maps a package argument to an option of another name
    (`attention_backend` -> `backend`)."""
    def option(m: re.Match) -> str:
        name = m[1] or m[3]
        flag = "--" + (rename or {}).get(name, name).replace("_", "-")
        if flag not in parser._option_string_actions:
            return m[0]
        return f"{flag} {m[2]}" if m[1] else flag

    return _ARGUMENT.sub(option, message)


def check_ranks(parser: argparse.ArgumentParser, tp: int, command: str) -> None:
    """`--tp` against the processes torchrun started (its WORLD_SIZE): where they differ, a
    parser error naming the torchrun line that runs `command` on `tp` processes."""
    started = os.environ.get("WORLD_SIZE", 1)
    if tp > 1 and int(started) != tp:
        parser.error(f"argument --tp: {tp} processes, {started} started; run torchrun "
                     f"--nproc-per-node {tp} {command} --tp {tp} ...")
