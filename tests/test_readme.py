"""README.md's setup as a new user copies it: the install command in both forms (PyPI, and a
CPU-only machine's from torch's CPU index) pins the torch that CI installs and runs the same
main job; the artifact format (graphs/README.md) is linked from the top; every relative link
resolves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def commands() -> list[str]:
    """The README's indented `python3 ...` lines, in order."""
    return [line[4:] for line in README.splitlines() if line.startswith("    python3 ")]


def test_install_commands_pin_ci_torch_and_run_the_main_job():
    pinned = re.search(r'pip_install "torch==([\d.]+)"', (ROOT / ".ci/run").read_text())[1]
    installs = [c for c in commands() if c.startswith("python3 -m pip install")]
    assert len(installs) == 2
    pypi, cpu = installs
    jobs = {c.split(" && ")[-1] for c in installs}
    assert jobs == {"python3 scripts/capture.py --preset tiny --out out/tiny"}
    assert f'"torch=={pinned}"' in pypi and CPU_INDEX not in pypi
    first, *rest = cpu.split(" && ")
    assert first == f'python3 -m pip install "torch=={pinned}" --index-url {CPU_INDEX}'
    assert rest[0] == 'python3 -m pip install -e ".[dev]"'  # keeps that torch: it satisfies
    assert "torch>=2.11" in (ROOT / "pyproject.toml").read_text()
    # CI runs the first pytest line; the setup is two commands: install + job, then tests.
    tests = [c for c in commands() if c.startswith("python3 -m pytest")]
    assert tests[0] == "python3 -m pytest -q -n auto"


def test_the_artifact_format_is_linked_from_the_top_and_links_resolve():
    top = README.split("\n\n")[1]  # the paragraph under the title
    assert "[graphs/README.md](graphs/README.md)" in top
    for target in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (ROOT / target).exists(), target
